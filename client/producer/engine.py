"""The producer engine shared by ``Producer`` and ``AsyncProducer``: partition selection, the
accumulator and the sender wired together, and the send paths written once.

The faces differ only in how they wait (a thread blocks on a ``concurrent.futures.Future``, a
coroutine awaits an ``asyncio.Future``) and in what an unknown topic means (the thread face
fetches its partitions through its loop thread, the asyncio face asks for ``await
publish(topic)``): each passes its own ``learn(topic)`` and future factory. Everything else —
value checks, partition selection, appending, flush bookkeeping, shutdown — is here:

* :meth:`ProducerEngine.send_async` (one message; the hot path: round robin with no key is a
  counter and an index, then one accumulator append), :meth:`send_many` (one partition, whole
  batches), :meth:`send_to` / :meth:`send_records` (a given partition, no metadata: the
  ordered producer);
* :meth:`begin_flush` / :meth:`end_flush` (the batches a flush waits for);
* :meth:`shutdown` (stop retries, close connections, fail what is left with ClientClosed).

Thread-safety: the send paths may run on any thread (the accumulator is thread-safe); the
sender and the broker set belong to the engine's loop, and so does :meth:`shutdown`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict, Unpack

from pymetaq.client.errors import ClientClosed, MessageTooLarge, SerializationError
from pymetaq.client.producer.accumulator import Accumulator, AnyFuture
from pymetaq.client.producer.batch import BatchHandle, SendHandle
from pymetaq.client.producer.config import ProducerConfig
from pymetaq.client.producer.lanes import lane_sender
from pymetaq.client.producer.partitioner import (
    OutgoingMessage,
    RoundRobin,
    key_bytes,
    key_hash_index,
    make_strategy,
    resolve_custom,
    resolve_explicit,
)
from pymetaq.client.producer.sender import Sender, SenderConfig
from pymetaq.client.producer.values import MessageValues, not_bytes, serializing
from pymetaq.client.transport.brokers import BrokerSet
from pymetaq.client.transport.zkbrokers import open_broker_set
from pymetaq.client.types import TopicPartition

if TYPE_CHECKING:
    from pymetaq.client.producer.transactional import Transactions
    from pymetaq.client.transaction.bound import BoundTransaction

#: ``partition=`` of a send: an index into the sorted list, a TopicPartition or a "b-p" key
PartitionArg: TypeAlias = int | str | TopicPartition | None


class SendOptions(TypedDict, total=False):
    """The keyword options of every send call (``**opts: Unpack[SendOptions]``)."""

    #: the partition key, crc32(key) % n: bytes or str, or what the key_serializer takes; it
    #: travels with the message (``Message.key``)
    key: Any
    partition: PartitionArg  # an explicit partition (wins over key)
    attribute: str | None  # MetaQ's message attribute (UTF-8)


class ProducerEngine:
    """Selection + accumulator + sender, shared by both faces (see the module docstring)."""

    def __init__(
        self,
        servers: str | list[str],
        cfg: ProducerConfig,
        loop: asyncio.AbstractEventLoop,
        future_factory: Callable[[], AnyFuture],
        *,
        threadsafe: bool,
        learn: Callable[[str], list[TopicPartition]],
    ) -> None:
        self.cfg = cfg
        self.loop = loop
        self.brokers: BrokerSet = open_broker_set(
            servers,
            side="pub",
            connect_timeout_s=cfg.connect_timeout_ms / 1000.0,
            request_timeout_s=cfg.request_timeout_ms / 1000.0,
            metadata_max_age_s=cfg.metadata_max_age_ms / 1000.0,
            zk_session_timeout_s=cfg.zk_session_timeout_ms / 1000.0,
        )
        sender_cfg = SenderConfig(
            cfg.max_in_flight,
            cfg.request_timeout_ms / 1000.0,
            cfg.retries,
            cfg.retry_backoff_ms / 1000.0,
            cfg.compression,
            cfg.body_checksum,
            cfg.delivery_timeout_s,
            cfg.idempotence,
        )
        self.sender = Sender(sender_cfg, self.brokers, loop)
        self.acc = Accumulator(
            batch_messages=cfg.batch_messages,
            batch_bytes=cfg.batch_bytes,
            linger_s=cfg.linger_ms / 1000.0,
            buffer_bytes=cfg.buffer_bytes,
            future_factory=future_factory,
            wake=self.sender.wake_threadsafe if threadsafe else self.sender.wake,
        )
        self.sender.attach(self.acc)
        #: how long an append may block while the buffer is full (the asyncio face never does)
        self.block_s = cfg.delivery_timeout_s if threadsafe else 0.0
        self._max_bytes = cfg.max_message_bytes
        self._cached = self.brokers.partition_cache.get
        self._learn = learn
        self._custom = cfg.partitioner if callable(cfg.partitioner) else None
        self._strategy = None if callable(cfg.partitioner) else make_strategy(cfg.partitioner)
        #: the fast path's selector (no key, no explicit partition, no custom partitioner)
        self._rr_next = self._strategy.next if isinstance(self._strategy, RoundRobin) else None
        #: a lane holds at most a batch (lanes.py)
        self._lane_cap = cfg.batch_messages
        self._lane_bytes = cfg.batch_bytes
        self._closed = False
        #: closed, or transactions used: the send paths take their checked branch
        self._divert = False
        self._txs: Transactions | None = None
        self._tx_args = (future_factory, threadsafe)
        self._tx_current: Callable[[], BoundTransaction | None] = _no_transaction
        self.values = MessageValues(cfg)
        if self._rr_next is not None:  # the per-message path: a lock-free lane (lanes.py)
            self.send_async = lane_sender(self, self.send_async)  # type: ignore[method-assign]
        if self.values.serializing:  # only producers with serializers run them
            self.send_async = serializing(self.values, self.send_async)  # type: ignore[method-assign]

    # -- the send paths --------------------------------------------------------------------

    def send_async(
        self,
        topic: str,
        value: bytes,
        key: bytes | str | None = None,
        partition: PartitionArg = None,
        attribute: str | None = None,
        force: bool = False,
    ) -> SendHandle:
        """Queue one message; ``force``: its batch is due at once (a waiting ``send``)."""
        if type(value) is not bytes or len(value) > self._max_bytes or self._divert:
            if self._closed or type(value) is not bytes or len(value) > self._max_bytes:
                value = self.check(value)
            if (tx := self._tx_current()) is not None:  # a transaction bound to this context
                return self.transactions().send(tx, topic, value, key, partition, attribute)
        parts = self._cached(topic)
        if parts is None:
            parts = self._learn(topic)
        rr = self._rr_next
        if rr is not None and partition is None and key is None:
            tp = parts[rr() % len(parts)]
            pinned = False
        else:
            tp = self.select(topic, parts, value, key, partition, attribute)
            pinned = partition is not None or key is not None or self._custom is not None
        if key is not None or attribute is not None:  # the key travels in the attribute
            attribute = self.values.attribute(key, attribute)
        return self.acc.append(tp, value, attribute, force, self.block_s, pinned)

    def send_many(
        self,
        topic: str,
        values: Sequence[bytes],
        key: bytes | str | None = None,
        partition: PartitionArg = None,
        attribute: str | None = None,
    ) -> BatchHandle:
        """Queue many messages for ONE partition (chosen once, as for a single send), in order."""
        if self.values.serializing:
            values = [self.values.value(v) for v in values]
            key = self.values.key(key)
        limit = self._max_bytes
        if not all(type(v) is bytes and len(v) <= limit for v in values):
            values = [self.check(v) for v in values]
        if self.closed:
            raise ClientClosed("producer is closed")
        if (tx := self._tx_current()) is not None:
            return self.transactions().send_many(tx, topic, values, key, partition, attribute)
        parts = self._cached(topic)
        if parts is None:
            parts = self._learn(topic)
        tp = self.select(topic, parts, values[0] if values else b"", key, partition, attribute)
        pinned = partition is not None or key is not None or self._custom is not None
        if key is not None or attribute is not None:
            attribute = self.values.attribute(key, attribute)
        return self.acc.append_many(tp, values, attribute, block_s=self.block_s, pinned=pinned)

    def send_to(self, tp: TopicPartition, value: bytes, attribute: str | None) -> SendHandle:
        """Queue one message for a given partition, due at once (no metadata needed; pinned)."""
        return self.acc.append(tp, self.check(value), attribute, True, self.block_s, True)

    def send_records(self, tp: TopicPartition, records: Sequence[bytes]) -> BatchHandle:
        """Queue complete records for a given partition, in order (a spool's backlog)."""
        if self.closed:
            raise ClientClosed("producer is closed")
        return self.acc.append_records(tp, records, block_s=self.block_s)

    def select(
        self,
        topic: str,
        parts: list[TopicPartition],
        value: bytes,
        key: bytes | str | None,
        partition: PartitionArg,
        attribute: str | None,
    ) -> TopicPartition:
        """The partition for a message: explicit > callable > key hash > the strategy."""
        if partition is not None:
            return parts[resolve_explicit(topic, parts, partition)]
        kb = key_bytes(key)
        if self._custom is not None:
            message = OutgoingMessage(topic, value, kb, attribute)
            return parts[resolve_custom(self._custom, topic, parts, message)]
        if kb is not None:
            return parts[key_hash_index(kb, len(parts))]
        assert self._strategy is not None
        return parts[self._strategy(len(parts))]

    def check(self, value: bytes) -> bytes:
        """``value`` as bytes, or the usage error (closed, wrong type, too large)."""
        if self.closed:
            raise ClientClosed("producer is closed")
        if type(value) is not bytes:
            if isinstance(value, (bytearray, memoryview)):
                value = bytes(value)
            else:
                raise SerializationError(not_bytes("value", value, self.values.serializing))
        if len(value) > self._max_bytes:
            raise MessageTooLarge(
                f"message of {len(value)} bytes exceeds max_message_bytes={self._max_bytes}"
            )
        return value

    # -- transactions (pymetaq.client.transaction; glue in producer/transactional.py) -------

    @property
    def closed(self) -> bool:
        return self._closed

    @closed.setter
    def closed(self, value: bool) -> None:
        self._closed = value
        self._divert = value or self._txs is not None

    def transactions(self) -> Transactions:
        """The producer's transaction support, created on first use; from then on every send
        asks the calling context for its transaction (a few hundred ns; a producer that never
        uses transactions never pays it)."""
        if self._txs is None:
            from pymetaq.client.producer.transactional import Transactions

            factory, threadsafe = self._tx_args
            self._txs = Transactions(self, factory, threadsafe=threadsafe)
            self._tx_current = self._txs.binding.var.get
            self._divert = True
        return self._txs

    # -- flush and shutdown ----------------------------------------------------------------

    def begin_flush(self) -> list[AnyFuture]:
        """Make everything queued due now (until :meth:`end_flush`) and wake the sender;
        returns the futures of the batches to wait for."""
        futures = [b.fut for b in self.acc.begin_flush()]
        self.sender.wake_threadsafe()
        return futures

    def end_flush(self) -> None:
        self.acc.end_flush()

    def callbacks_ran(self, timeout_s: float | None) -> bool:
        """(thread face, any thread but the loop's) Wait until the I/O loop has finished what
        it is running now: a batch's callbacks run right after its future completes, in the
        same loop step, so once a flush's futures are done one round through the loop means
        every callback of theirs has run. False if ``timeout_s`` ran out first."""
        if self.closed or self.loop.is_closed():
            return True
        passed = threading.Event()
        try:
            self.loop.call_soon_threadsafe(passed.set)
        except RuntimeError:  # the loop closed meanwhile: nothing runs any more
            return True
        return passed.wait(timeout_s)

    async def shutdown(self) -> None:
        """(engine's loop) Stop retries, close connections, then complete every unfinished
        batch with ClientClosed."""
        self.closed = True
        closed = ClientClosed("producer closed")
        self.sender.fail_queued(closed)
        if self._txs is not None:
            self._txs.close()
        self.brokers.close()
        # one loop iteration: the connections' failure hooks (scheduled with call_soon by
        # close()) complete the in-flight batches with their own error first
        await asyncio.sleep(0)
        self.sender.abort_all(closed)


def _no_transaction() -> None:
    return None


class ProducerFace:
    """What both producer faces share: the non-blocking send calls (bodies in the engine).

    ``AsyncProducer.send_nowait`` and ``Producer.send_async`` are :meth:`_queue`; a
    ``Producer`` replaces it per instance with the engine's :meth:`ProducerEngine.send_async`
    itself (the hot path: one Python call per message).
    """

    _engine: ProducerEngine

    def _queue(
        self,
        topic: str,
        value: Any,
        *,
        key: Any = None,
        partition: PartitionArg = None,
        attribute: str | None = None,
    ) -> SendHandle:
        """Queue one message without waiting; returns its :class:`SendHandle`
        (``.result()`` -> SendResult, or ``await handle``)."""
        return self._engine.send_async(topic, value, key, partition, attribute)

    def send_many(
        self, topic: str, values: Sequence[Any], **opts: Unpack[SendOptions]
    ) -> BatchHandle:
        """Queue many messages for ONE partition (chosen once, as for a single send) in order.

        The bulk path: records are built in one loop and sent as whole batches (split at
        ``batch_messages``/``batch_bytes``). ``handle.result()`` (or ``await handle``) -> one
        SendResult per value. ``opts``: ``key=``, ``partition=``, ``attribute=``.
        """
        return self._engine.send_many(topic, values, **opts)
