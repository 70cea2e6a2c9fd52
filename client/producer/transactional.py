"""The producer's side of transactions: where a send inside a transaction goes.

:class:`Transactions` is created by a producer the first time it is asked for a transaction
(``producer.transaction()``) or an XA resource (``producer.xa_resource()``); a producer that
never uses them never loads this module. It owns the producer's :class:`TransactionBinding`
(one ``ContextVar``), session id, local-transaction numbers and connection pool.

**The send path.** A producer that never used transactions sends exactly as before (the
engine's hot path tests one flag it already tested). Once it has, every send takes the engine's
checked path, which asks the binding for the calling context's transaction (a ``ContextVar``
read, a few hundred ns with the checks; so a finished transaction still bound to a context — a
task created inside the block that sends later — refuses the send instead of letting it out
as a plain message). If there is one,
:meth:`Transactions.send` places the message (MetaQ's rule: the first message's partition is
chosen as usual and pins its broker; later messages use the partition selection over that
broker's partitions of their topic; an explicit partition of another broker is refused) and
hands it to the transaction's put pipe on the event loop. The result is an ordinary
:class:`SendHandle` (``offset`` -1: a transactional message has no offset until commit;
``msg_id`` is final).

Thread-safety: ``send``/``send_many`` from any thread (the face's threads or the loop);
``connection``/``close`` on the producer's loop.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pymetaq.client.errors import MetaClientError
from pymetaq.client.producer.accumulator import AnyFuture
from pymetaq.client.producer.batch import (
    Batch,
    BatchHandle,
    BatchSendHandle,
    BatchSlice,
    SendHandle,
)
from pymetaq.client.producer.partitioner import resolve_explicit
from pymetaq.client.transaction.bound import (
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    BoundTransaction,
    Item,
    TransactionBinding,
    closed_error,
)
from pymetaq.client.transaction.errors import CrossBrokerTransaction
from pymetaq.client.transaction.local import (
    AsyncLocalScope,
    LocalIds,
    LocalScope,
    LocalTransaction,
    TxConnections,
    address_of,
)
from pymetaq.client.transaction.wire import DEFAULT_TX_REQUEST_TIMEOUT_S, new_session_id
from pymetaq.client.transaction.xa import (
    AsyncXAResource,
    XACore,
    XAResource,
    check_qualifier,
    default_qualifier,
    pick_broker,
)
from pymetaq.client.transport.connection import BrokerConnection
from pymetaq.client.types import TopicPartition
from pymetaq.storage.record import encode_data

if TYPE_CHECKING:
    from pymetaq.client.producer.engine import PartitionArg, ProducerEngine

Runner = Callable[[Coroutine[Any, Any, Any]], Any]
#: (transaction, partition, batch, its messages) queued by the thread face for the loop
_Entry = tuple[BoundTransaction, TopicPartition, Batch, list[Item]]


class Transactions:
    """One producer's transactions (see the module docstring)."""

    def __init__(
        self,
        engine: ProducerEngine,
        future_factory: Callable[[], AnyFuture],
        *,
        threadsafe: bool,
    ) -> None:
        self.engine = engine
        self.loop = engine.loop
        self._future = future_factory
        self._threadsafe = threadsafe
        self.binding = TransactionBinding()
        self.ids = LocalIds(new_session_id())
        self._pool: TxConnections | None = None
        self._rng = random.Random()
        #: (thread face) batches handed to the loop in order; one wake-up drains them all
        self._lock = threading.Lock()
        self._handoff: list[_Entry] = []
        #: the batch each (transaction, partition) queued last, while more may join it
        self._open: dict[tuple[BoundTransaction, TopicPartition], _Entry] = {}
        self._wake_pending = False

    # -- factories (the faces call these) ------------------------------------------------------
    def local(self, timeout_s: int | None, request_timeout_s: float) -> LocalTransaction:
        if timeout_s is not None and (isinstance(timeout_s, bool) or not 0 <= timeout_s < 1 << 31):
            raise ValueError(f"timeout_s must be a number of seconds >= 0, not {timeout_s!r}")
        if request_timeout_s <= 0:
            raise ValueError("request_timeout_s must be > 0")
        return LocalTransaction(
            self.ids.next_key(),
            self.ids.session_id,
            int(timeout_s) if timeout_s else None,
            self.pool,
            self.loop,
            request_timeout_s,
        )

    def local_scope(
        self, timeout_s: int | None, request_timeout_s: float, run: Runner
    ) -> LocalScope:
        return LocalScope(self.binding, self.local(timeout_s, request_timeout_s), run)

    def async_local_scope(self, timeout_s: int | None, request_timeout_s: float) -> AsyncLocalScope:
        return AsyncLocalScope(self.binding, self.local(timeout_s, request_timeout_s))

    def xa_core(
        self, unique_qualifier: str | None, topics: Sequence[str] | None, request_timeout_s: float
    ) -> XACore:
        """MetaQ's ``getXAResource``: a random broker among those serving every topic (the
        published ones by default)."""
        qualifier = (
            default_qualifier() if unique_qualifier is None else check_qualifier(unique_qualifier)
        )
        brokers = self.engine.brokers
        names = list(brokers.partition_cache) if topics is None else list(topics)
        serving = []
        for t in names:
            parts = brokers.cached_partitions(t)
            if parts is None:
                raise ValueError(
                    f"topic {t!r} is not published yet: send to it or publish it first"
                )
            serving.append({p.broker_id for p in parts})
        chosen, candidates = pick_broker(serving, sorted(brokers.brokers), self._rng)
        return XACore(
            self, self.loop, chosen, candidates, qualifier, self.ids.session_id, request_timeout_s
        )

    def xa_resource(self, core: XACore, run: Runner) -> XAResource:
        return XAResource(core, run)

    def async_xa_resource(self, core: XACore) -> AsyncXAResource:
        return AsyncXAResource(core)

    @property
    def pool(self) -> TxConnections:
        if self._pool is None:
            brokers = self.engine.brokers
            self._pool = TxConnections(
                address_of(lambda: brokers.brokers), brokers.connect_timeout_s
            )
            self._pool.security = brokers.security
        return self._pool

    # -- XAHost -----------------------------------------------------------------------------
    async def connection(self, broker_id: int) -> BrokerConnection:
        return await self.engine.brokers.connection(broker_id)

    def broker_url(self, broker_id: int) -> str:
        return self.engine.brokers.brokers.get(broker_id, f"broker {broker_id}")

    # -- the send path ------------------------------------------------------------------------
    def place(
        self,
        tx: BoundTransaction,
        topic: str,
        value: bytes,
        key: bytes | str | None,
        partition: PartitionArg,
        attribute: str | None,
    ) -> TopicPartition:
        """The partition of a transaction's message (MetaQ's pinning; module docstring)."""
        if tx.finished:
            raise closed_error(tx)
        engine = self.engine
        parts = engine.brokers.cached_partitions(topic)
        if parts is None:
            parts = engine._learn(topic)
        pinned = tx.broker_id
        if pinned is None or partition is not None:
            if partition is not None:
                tp = parts[resolve_explicit(topic, parts, partition)]
            else:
                tp = engine.select(topic, parts, value, key, None, attribute)
            tx.pin(tp.broker_id, self.broker_url(tp.broker_id))
            return tp
        cached = tx.placed.get(topic)
        if cached is not None and cached[0] is parts:
            mine = cached[1]
        else:
            mine = [p for p in parts if p.broker_id == pinned]
            tx.placed[topic] = (parts, mine)
        if not mine:  # MetaQ's words
            raise CrossBrokerTransaction(
                f"There is no partitions in `{tx.broker_url}` to send message with topic "
                f"`{topic}` in a transaction"
            )
        return engine.select(topic, mine, value, key, None, attribute)

    def send(
        self,
        tx: BoundTransaction,
        topic: str,
        value: bytes,
        key: bytes | str | None,
        partition: PartitionArg,
        attribute: str | None,
    ) -> SendHandle:
        tp = self.place(tx, topic, value, key, partition, attribute)
        if key is not None or attribute is not None:  # the key travels in the attribute
            attribute = self.engine.values.attribute(key, attribute)
        return BatchSendHandle(*self._put(tx, tp, value, attribute), 0)

    def send_many(
        self,
        tx: BoundTransaction,
        topic: str,
        values: Sequence[bytes],
        key: bytes | str | None,
        partition: PartitionArg,
        attribute: str | None,
    ) -> BatchHandle:
        """One partition for all (chosen once, as ``send_many`` does), one put each."""
        if not values:
            return BatchHandle([])
        tp = self.place(tx, topic, values[0], key, partition, attribute)
        if key is not None or attribute is not None:
            attribute = self.engine.values.attribute(key, attribute)
        extra = len(encode_data(b"", attribute)[0])
        slices = [BatchSlice(*self._put(tx, tp, v, attribute), 0, [v], extra) for v in values]
        return BatchHandle(slices)

    def _put(
        self, tx: BoundTransaction, tp: TopicPartition, value: bytes, attribute: str | None
    ) -> tuple[Batch, int]:
        """Queue one message of ``tx``: (its batch, its index in the batch).  The thread
        face adds it to the batch its transaction and partition queued last, while the loop
        has not taken it yet (so a burst of sends makes a batch per partition, whatever the
        partitioner's order); the pipe sends each partition's batches as transactional
        ``bput``\\ s, in order per partition."""
        data, flag = encode_data(value, attribute)
        if not self._threadsafe:  # the loop's own face: straight into the pipe
            batch = self._new_batch(tp, data)
            tx.put(tp, [(data, flag)], partial(_done, batch))
            return batch, 0
        with self._lock:
            entry = self._open.get((tx, tp))
            if (
                entry is not None
                and entry[2].count < MAX_BATCH_RECORDS
                and entry[2].nbytes + len(data) <= MAX_BATCH_BYTES
            ):
                batch = entry[2]
                index = batch.count
                batch.count += 1
                batch.nbytes += len(data)
                entry[3].append((data, flag))
                return batch, index
            batch = self._new_batch(tp, data)
            self._open[tx, tp] = entry = (tx, tp, batch, [(data, flag)])
            self._handoff.append(entry)
            wake = not self._wake_pending
            self._wake_pending = True
        if wake:
            self.loop.call_soon_threadsafe(self._drain)
        return batch, 0

    def _new_batch(self, tp: TopicPartition, data: bytes) -> Batch:
        batch = Batch(tp, self._future(), time.monotonic())
        batch.count, batch.nbytes, batch.open = 1, len(data), False
        return batch

    def _drain(self) -> None:
        """(loop) Hand every queued batch to its transaction, in the order they were sent."""
        with self._lock:
            self._wake_pending = False  # a put queued from now on schedules another drain
            self._open.clear()
            handoff, self._handoff = self._handoff, []
        for tx, tp, batch, items in handoff:
            tx.put(tp, items, partial(_done, batch))

    def close(self) -> None:
        """(loop thread) Close the transactions' connections (the broker rolls back whatever
        local transaction is still open on them)."""
        if self._pool is not None:
            self._pool.close()


def _done(batch: Batch, first_id: int, error: MetaClientError | None) -> None:
    """A batch's put answered: its messages have ids ``first_id ..`` (offsets come at commit)."""
    batch.first_id, batch.offset, batch.error = first_id, -1, error
    batch.complete()


DEFAULT_REQUEST_TIMEOUT_S = DEFAULT_TX_REQUEST_TIMEOUT_S

__all__ = ["DEFAULT_REQUEST_TIMEOUT_S", "Transactions"]
