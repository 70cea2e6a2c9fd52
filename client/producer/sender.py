"""The producer's sender: takes due batches from the accumulator and writes them as ``bput``.

Runs on the producer's event loop (the LoopThread of a sync ``Producer``, the caller's loop for
an ``AsyncProducer``). One run (``_run``) is scheduled whenever the accumulator wakes it or a
reply frees capacity; it takes, per partition queue, the head batches that are due while

* the broker's connection has fewer than ``max_in_flight`` batches outstanding, and
* the partition has fewer than its own limit outstanding: ``max_in_flight`` without retries
  (requests on one connection are answered in order, so pipelining keeps per-partition order),
  **1 with retries enabled** (a retried batch must not overtake or be overtaken).

Adaptive batching (Nagle-like): appends wake the sender only while their broker has nothing in
flight, so with ``linger_ms=0`` an idle producer sends a message at once, and whatever
accumulates while a request is in flight goes out as one batch when its ack arrives.  An ack
first sends that next batch, then runs the acked batch's callbacks.

A failed batch is retried (same partition, after ``retry_backoff_ms``, at the head of its
queue) while the error is retriable and attempts remain; otherwise every message in it
completes with ``success=False`` and the error. Connection failures and timeouts also drop the
topic's cached partition list so the next selection re-reads metadata (partitions of brokers
that cannot be reached are left out of a fresh list).

Thread-safety: loop thread only (touches the accumulator under its lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from functools import partial

from pymetaq.client.errors import (
    ClientClosed,
    ConnectionLost,
    MetaClientError,
    NoBrokerAvailable,
    RequestTimeout,
    error_for_reply,
)
from pymetaq.client.producer.accumulator import Accumulator, Batch
from pymetaq.client.protocol import BatchPutCommand, ResultReply
from pymetaq.client.transport.brokers import BrokerSet
from pymetaq.client.transport.connection import BrokerConnection, Reply
from pymetaq.client.transport.records import compress_batch
from pymetaq.storage.checksum import checksum

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SenderConfig:
    max_in_flight: int
    request_timeout_s: float
    retries: int
    retry_backoff_s: float
    compression: str | None
    body_checksum: bool


class Sender:
    """Moves due batches from the accumulator to the brokers (see the module docstring)."""

    def __init__(
        self,
        config: SenderConfig,
        brokers: BrokerSet,
        acc: Accumulator,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.cfg = config
        self.brokers = brokers
        self.acc = acc
        self.loop = loop
        self._part_limit = 1 if config.retries > 0 else config.max_in_flight
        # shared with the accumulator (read there under its lock to skip needless wake-ups)
        self._broker_inflight: defaultdict[int, int] = acc.broker_inflight
        self._part_inflight: defaultdict[tuple[str, object], int] = defaultdict(int)
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._closing: MetaClientError | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- scheduling ----------------------------------------------------------------------

    def wake_threadsafe(self) -> None:
        """Called by the accumulator from any thread (a no-op once the loop is closed)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._run)

    def wake(self) -> None:
        """Called on the loop thread."""
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        acc = self.acc
        acc.take_wake()
        now = time.monotonic()
        to_send: list[Batch] = []
        next_due: float | None = None
        max_inflight = self.cfg.max_in_flight
        with acc.cond:
            for key, q in acc.iter_heads():
                broker_id = key[1].broker_id
                while q:
                    b = q[0]
                    if self._part_inflight[key] >= self._part_limit:
                        break
                    if self._broker_inflight[broker_id] >= max_inflight:
                        break
                    if len(q) == 1 and not acc.is_due(b, now):
                        due_at = b.created + acc.linger_s
                        next_due = due_at if next_due is None else min(next_due, due_at)
                        break
                    q.popleft()
                    b.open = False
                    self._part_inflight[key] += 1
                    self._broker_inflight[broker_id] += 1
                    to_send.append(b)
        for b in to_send:
            self._send(b)
        if next_due is not None:
            self._arm(next_due)

    def _arm(self, when: float) -> None:
        if self._timer is not None and not self._timer.cancelled() and self._timer_at <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        delay = max(0.0, when - time.monotonic())
        self._timer = self.loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._run()

    # -- sending -------------------------------------------------------------------------

    def _send(self, b: Batch) -> None:
        b.attempts += 1
        if self._closing is not None:
            self._finish(b, self._closing)
            return
        conn = self.brokers.cached_connection(b.partition.broker_id)
        if conn is None:
            task = self.loop.create_task(self._connect_then_send(b))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._write(conn, b)

    async def _connect_then_send(self, b: Batch) -> None:
        try:
            conn = await self.brokers.connection(b.partition.broker_id)
        except MetaClientError as e:
            self._failed(b, e)
            return
        except Exception as e:  # pragma: no cover - defensive: never lose a batch
            self._failed(b, ConnectionLost(repr(e)))
            return
        self._write(conn, b)

    def _write(self, conn: BrokerConnection, b: Batch) -> None:
        if b.body is None:
            body = b"".join(b.parts)
            if self.cfg.compression == "lz4":
                body = compress_batch(body)
                b.compressed = True
            b.body = body
            b.parts = []
        cmd = BatchPutCommand(
            b.topic,
            b.partition.partition,
            b.body,
            1 if b.compressed else b.count,
            checksum(b.body) if self.cfg.body_checksum else None,
        )
        b.sent_at = time.monotonic()
        # on_done: the reply completes the batch from the reply handler itself, not one loop
        # iteration later (a done-callback is scheduled with call_soon)
        conn.send_request(cmd, self.cfg.request_timeout_s, on_done=partial(self._on_reply, b))

    def _on_reply(self, b: Batch, fut: asyncio.Future[Reply]) -> None:
        if fut.cancelled():
            self._failed(b, ConnectionLost("request cancelled"))
            return
        exc = fut.exception()
        if exc is not None:
            err = exc if isinstance(exc, MetaClientError) else ConnectionLost(repr(exc))
            self._failed(b, err)
            return
        reply = fut.result()
        if not isinstance(reply, ResultReply):
            self._failed(b, ConnectionLost(f"unexpected reply to bput: {type(reply).__name__}"))
            return
        if reply.code != 200:
            self._failed(b, error_for_reply(reply.code, reply.body))
            return
        try:
            first_id, _partition, offset, *_rest = reply.body.split()
            b.first_id, b.offset = int(first_id), int(offset)
        except ValueError:
            self._failed(b, ConnectionLost(f"malformed bput reply body {reply.body!r}"))
            return
        self._succeeded(b)

    def _succeeded(self, b: Batch) -> None:
        """An acknowledged batch: send what accumulated during its round trip *first* (the
        slot is free now), then run its callbacks, so their cost overlaps the next trip."""
        if b.fut.done():  # already aborted by close()
            return
        self._release_slot(b)
        b.body = None
        self._run()
        b.complete()
        self.acc.release(b)

    def _failed(self, b: Batch, err: MetaClientError) -> None:
        if isinstance(err, (ConnectionLost, NoBrokerAvailable, RequestTimeout)):
            self.brokers.invalidate(b.topic)
        if err.retriable and b.attempts <= self.cfg.retries and self._closing is None:
            log.debug("retrying %r after %s (attempt %d)", b, err, b.attempts)
            self.loop.call_later(self.cfg.retry_backoff_s, self._requeue, b)
            return
        self._finish(b, err)

    def _requeue(self, b: Batch) -> None:
        if self._closing is not None:
            self._finish(b, self._closing)
            return
        key = (b.topic, b.partition)
        with self.acc.cond:
            q = self.acc.queues.setdefault(key, deque())
            q.appendleft(b)
        self._release_slot(b)
        self.wake()

    def _release_slot(self, b: Batch) -> None:
        key = (b.topic, b.partition)
        with self.acc.lock:
            self._part_inflight[key] -= 1
            self._broker_inflight[b.partition.broker_id] -= 1

    def _finish(self, b: Batch, err: MetaClientError | None) -> None:
        if b.fut.done():  # already aborted by close()
            return
        b.error = err
        self._release_slot(b)
        b.body = None
        b.complete()
        self.acc.release(b)
        self.wake()

    # -- shutdown ------------------------------------------------------------------------

    def fail_queued(self, err: MetaClientError) -> None:
        """Complete every batch still queued (not in flight) with ``err``; stop retrying."""
        self._closing = err if isinstance(err, ClientClosed) else ClientClosed(str(err))
        with self.acc.cond:
            queued = [b for _, q in self.acc.iter_heads() for b in q]
            for q in self.acc.queues.values():
                q.clear()
        for b in queued:
            b.error = self._closing
            b.complete()
            self.acc.release(b)
        if self._timer is not None:
            self._timer.cancel()

    def abort_all(self, err: MetaClientError) -> None:
        """close(): fail queued batches and every batch still in flight or backing off."""
        self.fail_queued(err)
        for b in self.acc.snapshot_incomplete():
            if not b.fut.done():
                b.error = self._closing
                b.complete()
                self.acc.release(b)
        for task in list(self._tasks):
            task.cancel()
