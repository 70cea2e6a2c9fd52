"""The thread face of the producer: ``Producer`` (the asyncio face is ``aio.AsyncProducer``).

```python
from pymetaq.client import Producer

with Producer("meta://127.0.0.1:8123", linger_ms=1) as p:
    r = p.send("orders", b"payload", key=b"customer-42")     # blocks; SendResult
    h = p.send_async("orders", b"more")                       # SendHandle
    bulk = p.send_many("orders", [b"a", b"b"])                # BatchHandle (one partition)
    p.flush()
    assert h.result().success and bulk.wait()
```

Throughput: ``send_async`` without key, partition or attribute appends to a lock-free lane
(``lanes.py``: no lock, no future, no wake-up per message; about 0.7-1.2 us of the caller's CPU
on the 2-core development machine), ``send_many`` about 0.45 us per message (records built in
one comprehension, one join per batch); see ``docs/client.md`` and ``docs/benchmarks.md``.

**Semantics** (also in ``docs/client.md``):

* ``send`` returns a :class:`SendResult`; failures are reported as ``success=False`` with
  ``error`` set to a :class:`MetaClientError` (usage errors - ``MessageTooLarge``, bad types,
  ``ClientClosed``, an unknown topic or partition - raise at once).
* **Timeout**: each ``bput`` attempt must be answered within ``request_timeout_ms`` (3000, as
  MetaQ). A :class:`~pymetaq.client.errors.MessageMayBeStored` (a timeout or a lost connection
  after the request was written) means the batch **may or may not have been stored**: the
  broker may have appended it and lost the reply; any other failure was never stored.
* **Retries**: ``retries=0`` by default (MetaQ makes one attempt). With ``retries=n`` a batch
  failing with a retriable error is resent to the *same* partition up to n more times after
  ``retry_backoff_ms``; after a timeout or lost connection the resend can store the batch
  **twice** (at-least-once; a duplicate is a whole batch, and keeps its relative order). With
  retries the producer keeps one batch in flight per partition, so order still holds.
* **Order**: messages sent from one thread to one partition are stored in send order
  (one connection per broker, pipelined requests are answered in order).
* **Batching**: messages to one partition accumulate into a batch that is sent when it holds
  ``batch_messages`` messages or ``batch_bytes`` bytes, after ``linger_ms``, or when the
  broker has a free in-flight slot and the batch is due; up to ``max_in_flight`` batches per
  broker connection are outstanding. ``compression="lz4"`` sends each batch as one lz4 record.
* **Partition selection**: see :mod:`pymetaq.client.producer.partitioner` (explicit > callable >
  key
  hash ``crc32(key) % n`` > ``round_robin`` / ``random``).

Thread-safety: ``Producer`` methods may be called from any number of threads (one LoopThread
per producer does the I/O).
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Any, Unpack

from pymetaq.client.errors import MayBeStoredTimeout, NoBrokerAvailable
from pymetaq.client.producer.config import ProducerConfig, make_config
from pymetaq.client.producer.engine import ProducerEngine, ProducerFace, SendOptions
from pymetaq.client.transport.brokers import BrokerSet
from pymetaq.client.transport.loop import LoopThread
from pymetaq.client.types import SendResult, TopicPartition

if TYPE_CHECKING:
    from pymetaq.client.transaction.local import LocalScope
    from pymetaq.client.transaction.xa import XAResource

__all__ = ["Producer"]


class Producer(ProducerFace):
    """The synchronous producer (thread-safe). See the module docstring for semantics."""

    def __init__(
        self, servers: str | list[str], *, config: ProducerConfig | None = None, **overrides: Any
    ) -> None:
        allow_no_broker = bool(overrides.pop("_allow_no_broker", False))
        self.config = make_config(config, overrides)
        self._lt = LoopThread("pymetaq-producer")
        self._engine = ProducerEngine(
            servers,
            self.config,
            self._lt.loop,
            concurrent.futures.Future,
            threadsafe=True,
            learn=self.partitions,
        )
        self._send_timeout_s = self.config.delivery_timeout_s
        self.send_async = self._engine.send_async  # type: ignore[method-assign]
        try:
            self._lt.run(
                self._engine.brokers.start(), self.config.connect_timeout_ms / 1000.0 + 5.0
            )
        except NoBrokerAvailable:
            if not allow_no_broker:  # the ordered producer may start with its brokers down
                self._abandon()
                raise
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        self._lt.run(self._engine.shutdown())
        self._lt.close()

    @property
    def brokers(self) -> BrokerSet:
        return self._engine.brokers

    def partitions(self, topic: str) -> list[TopicPartition]:
        """The topic's partitions, sorted by (broker_id, partition); fetched if unknown."""
        parts = self._engine.brokers.cached_partitions(topic)
        if parts is None:
            parts = self._lt.run(self._engine.brokers.partitions(topic), self._send_timeout_s)
        return parts

    #: queue one message; returns its :class:`SendHandle` (``.result()`` -> SendResult). Each
    #: instance binds the engine's method itself in ``__init__`` (one Python call per message).
    send_async = ProducerFace._queue

    def send(
        self,
        topic: str,
        value: Any,
        *,
        timeout_s: float | None = None,
        raise_on_error: bool = False,
        **opts: Unpack[SendOptions],
    ) -> SendResult:
        """Send one message and wait for the broker's ack (see the module docstring).

        ``opts``: ``key=``, ``partition=``, ``attribute=``; ``timeout_s``: how long to wait
        (default: the delivery timeout). A failed send returns ``success=False`` (MetaQ's
        ``SendResult``) — or, with ``raise_on_error=True`` (:meth:`send_and_wait`), raises
        its error (a :class:`~pymetaq.client.errors.MetaClientError`)."""
        handle = self._engine.send_async(topic, value, force=True, **opts)
        wait = self._send_timeout_s if timeout_s is None else timeout_s
        try:
            result = handle.result(wait)
        except TimeoutError:
            err = MayBeStoredTimeout(f"send to {topic!r} (not acknowledged within {wait:g}s)")
            result = SendResult(False, -1, -1, -1, err, -1, topic)
        if raise_on_error and result.error is not None:
            raise result.error
        return result

    def send_and_wait(
        self, topic: str, value: Any, *, timeout_s: float | None = None, **opts: Unpack[SendOptions]
    ) -> SendResult:
        """Send one message, wait for its ack and return its :class:`SendResult`; a failure
        raises (aiokafka's ``send_and_wait``): ``send(..., raise_on_error=True)``."""
        return self.send(topic, value, timeout_s=timeout_s, raise_on_error=True, **opts)

    def transaction(
        self, timeout_s: int | None = None, *, request_timeout_s: float = 5.0
    ) -> LocalScope:
        """A local transaction bound to the calling thread: ``with p.transaction(timeout_s=30):``
        then ordinary sends; commit on normal exit, rollback on an exception. See
        ``docs/transactions.md`` (one broker per transaction; ``timeout_s`` goes to BEGIN)."""
        txs = self._engine.transactions()
        run_for = 3 * request_timeout_s + self.config.connect_timeout_ms / 1000.0 + 5.0
        return txs.local_scope(timeout_s, request_timeout_s, lambda c: self._lt.run(c, run_for))

    def xa_resource(
        self,
        unique_qualifier: str | None = None,
        *,
        topics: list[str] | None = None,
        request_timeout_s: float = 5.0,
    ) -> XAResource:
        """An XA resource on a broker serving every topic in ``topics`` (default: the published
        ones); ``unique_qualifier`` default ``XAMessageProducer-<hostname>`` (MetaQ's)."""
        txs = self._engine.transactions()
        core = txs.xa_core(unique_qualifier, topics, request_timeout_s)
        run_for = 3 * request_timeout_s + self.config.connect_timeout_ms / 1000.0 + 5.0
        return txs.xa_resource(core, lambda c: self._lt.run(c, run_for))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Send everything queued now and wait for it (every message acknowledged or failed,
        and every callback of theirs run); False if ``timeout_s`` ran out first."""
        futures = self._engine.begin_flush()
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            for fut in futures:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                assert isinstance(fut, concurrent.futures.Future)
                try:
                    fut.result(left)
                except concurrent.futures.TimeoutError:
                    return False
            # as Kafka's flush: every callback of what was queued has run when it returns
            # (they run on the I/O thread just after their batch's future completes)
            if self._lt.in_loop():  # from a callback: the loop cannot go round while we wait
                return True
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return self._engine.callbacks_ran(left)
        finally:
            self._engine.end_flush()

    def close(self, timeout_s: float | None = None) -> None:
        """Flush (up to ``timeout_s``, default the send timeout), then close connections."""
        if self._engine.closed:
            return
        self.flush(self._send_timeout_s if timeout_s is None else timeout_s)
        self._engine.closed = True
        if not self._lt.closed:
            try:
                self._lt.run(self._engine.shutdown(), 5.0)
            finally:
                self._lt.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
