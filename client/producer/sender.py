"""The producer's sender: takes due batches from the accumulator and writes them as ``bput``.

Runs on the producer's event loop (the LoopThread of a sync ``Producer``, the caller's loop for
an ``AsyncProducer``). One run (``_run``) is scheduled whenever the accumulator wakes it or a
reply frees capacity; it takes, per partition queue, the head batches that are due while

* the broker's connection has fewer than ``max_in_flight`` batches outstanding, and
* the partition has fewer than its own limit outstanding: ``max_in_flight`` without retries
  (requests on one connection are answered in order, so pipelining keeps per-partition order),
  **1 with retries enabled** (a retried batch must not overtake or be overtaken) - unless the
  producer is idempotent: then ``min(max_in_flight, 5)``.

**Idempotence** (``idempotence=True``, the default; ``docs/protocol.md``): a batch taken from
the accumulator gets the partition's next sequence number under the producer's id (a UUID) -
before any connection is made, so a batch that waits for a broker is never overtaken - and
every retry sends the same pair, so the broker stores it once and answers a duplicate with the
original result.  Up to 5 batches per partition are in flight (Kafka's rule, the broker's
window).  Retries go back into the queue in sequence order (``Accumulator.reenqueue``); a batch
the broker answers ``409 out of order`` (an earlier one was lost on the way and is being
retried) is retried after it, without counting as an attempt; ``unknown producer`` (the
broker forgot the id, or a batch other than 0 reached it first) with nothing earlier out starts
the partition over.  A batch that fails for good
makes its partition start over: a fresh producer id, sequence 0; batches still out under the
old id are renumbered when their gap is reported.  A numbered batch that may be stored (an
attempt got no answer) is never moved to another partition; one that never reached its broker
may move (its partition starts over, it is numbered again where it lands).

Adaptive batching (Nagle-like): appends wake the sender only while their broker has nothing in
flight, so with ``linger_ms=0`` an idle producer sends a message at once, and whatever
accumulates while a request is in flight goes out as one batch when its ack arrives.  An ack
first sends that next batch, then runs the acked batch's callbacks.

A failed batch is retried (same partition, after ``retry_backoff_ms``, at the head of its
queue) while the error is retriable and attempts remain; otherwise every message in it
completes with ``success=False`` and the error — a :class:`MessageMayBeStored` if any attempt
was written to the broker and got no answer (a timeout, a connection lost after the write).
An error with ``invalid_metadata`` also refreshes the topic's partition list in the background
(partitions of brokers that cannot be reached are left out of a fresh list).

**Moving to a live partition** (``zk://`` producers, whose broker set drops brokers that do not
answer or are no longer registered: ``brokers.reroutes``): a failed batch that nobody pinned
(no key, no explicit partition, no custom partitioner, not the ordered producer) is moved to
another partition of its topic, on another broker when there is one, as long as its delivery
timeout has not run out.  An attempt that was never written (the broker is down or gone: it
fails at once) is moved freely, since nothing can have been stored; an attempt that was
written and got no answer counts against ``retries`` like any resend (it may duplicate).
When the topic has no live partition the batch waits ``retry_backoff_ms`` and looks again.

Thread-safety: loop thread only (it uses the accumulator's API, never its lock or queues).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from functools import partial

from pymetaq.client.errors import (
    BrokerError,
    ClientClosed,
    ConnectionLost,
    MetaClientError,
    error_for_reply,
    may_be_stored,
)
from pymetaq.client.producer.accumulator import Accumulator, Batch
from pymetaq.client.protocol import BatchPutCommand, ResultReply
from pymetaq.client.transport.brokers import BrokerSet
from pymetaq.client.transport.connection import BrokerConnection, Reply
from pymetaq.client.transport.records import compress_batch
from pymetaq.client.types import TopicPartition
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
    #: a batch may be moved to a live partition until this long after it was created
    delivery_timeout_s: float = 0.0
    #: idempotent ``bput`` (producer id + per-partition sequence), see the module docstring
    idempotence: bool = False


#: batches the broker remembers per producer and partition: the idempotent in-flight limit
IDEMPOTENT_WINDOW = 5
_INT32_MAX = (1 << 31) - 1


class Sender:
    """Moves due batches from the accumulator to the brokers (see the module docstring)."""

    def __init__(
        self, config: SenderConfig, brokers: BrokerSet, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.cfg = config
        self.brokers = brokers
        self.loop = loop
        self._idem = config.idempotence
        if config.idempotence:
            self._part_limit = min(config.max_in_flight, IDEMPOTENT_WINDOW)
        else:
            self._part_limit = 1 if config.retries > 0 else config.max_in_flight
        #: this producer's id (a UUID); a partition gets a fresh one after a batch failed for
        #: good (its sequence starts again at 0)
        self.producer_id = uuid.uuid4().hex
        self._pids: dict[TopicPartition, str] = {}
        self._next_seq: dict[TopicPartition, int] = {}
        self._next_order: dict[TopicPartition, int] = {}
        #: per partition, the seq_order of every batch given a sequence and not completed
        self._open_seqs: dict[TopicPartition, set[int]] = {}
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._closing: MetaClientError | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._moves = 0  # spreads moved batches over the live partitions
        self.acc: Accumulator  # set by attach()

    def attach(self, acc: Accumulator) -> None:
        """The accumulator to drain (it wakes this sender, so it is created after it)."""
        self.acc = acc

    # -- scheduling ----------------------------------------------------------------------

    def wake_threadsafe(self) -> None:
        """Called by the accumulator from any thread (a no-op once the loop is closed)."""
        try:
            self.loop.call_soon_threadsafe(self._run)
        except RuntimeError:  # the loop is closed: the producer was closed meanwhile
            log.debug("sender wake-up after the producer's loop closed (ignored)")

    def wake(self) -> None:
        """Called on the loop thread."""
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        acc = self.acc
        acc.take_wake()
        batches, next_due = acc.drain_due(
            time.monotonic(), self.cfg.max_in_flight, self._part_limit
        )
        blocked: list[Batch] = []
        for b in batches:
            if self._idem and b.seq is None and not self._may_number(b.tp):
                blocked.append(b)
                continue
            self._send(b)
        for b in reversed(blocked):  # back to the head of its queue, in order
            self.acc.reenqueue(b)
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
        if self._idem and b.seq is None:  # numbered as drained: no later batch can overtake
            self._assign(b)
        conn = self.brokers.cached_connection(b.tp.broker_id)
        if conn is None:
            task = self.loop.create_task(self._connect_then_send(b))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._write(conn, b)

    async def _connect_then_send(self, b: Batch) -> None:
        try:
            conn = await self.brokers.connection(b.tp.broker_id)
        except MetaClientError as e:
            self._failed(b, e)
            return
        except Exception as e:  # never lose a batch: report it as failed, with the cause
            log.exception("connecting for %r failed unexpectedly", b)
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
        if self._idem and b.seq is None:
            self._assign(b)
        cmd = BatchPutCommand(
            b.tp.topic,
            b.tp.partition,
            b.body,
            1 if b.compressed else b.count,
            checksum(b.body) if self.cfg.body_checksum else None,
            0,
            b.pid,
            b.seq,
        )
        b.sent_at = time.monotonic()
        written = not conn.closed  # a closed connection fails the request without writing
        # on_done: the reply completes the batch from the reply handler itself, not one loop
        # iteration later (a done-callback is scheduled with call_soon)
        conn.send_request(
            cmd, self.cfg.request_timeout_s, on_done=partial(self._on_reply, b, written)
        )

    def _on_reply(self, b: Batch, written: bool, fut: asyncio.Future[Reply]) -> None:
        if fut.cancelled():
            self._failed(b, ConnectionLost("request cancelled"), written)
            return
        exc = fut.exception()
        if exc is not None:
            err = exc if isinstance(exc, MetaClientError) else ConnectionLost(repr(exc))
            self._failed(b, err, written)
            return
        reply = fut.result()
        if not isinstance(reply, ResultReply):
            self._failed(b, ConnectionLost(f"unexpected reply to bput: {type(reply).__name__}"))
            return
        if reply.code != 200:
            err = error_for_reply(reply.code, reply.body)
            if reply.code == 409 and self._retry_gap(b, reply.body):
                return
            self._failed(b, err)
            return
        try:
            first_id, _partition, offset, *_rest = reply.body.split()
            b.first_id, b.offset = int(first_id), int(offset)
        except ValueError:
            self._failed(b, ConnectionLost(f"malformed bput reply body {reply.body!r}"))
            return
        self._succeeded(b)

    # -- idempotence -----------------------------------------------------------------------

    def _assign(self, b: Batch) -> None:
        """Give ``b`` its partition's next sequence (kept by every retry of it)."""
        tp = b.tp
        b.pid = self._pids.setdefault(tp, self.producer_id)
        seq = self._next_seq.get(tp, 0)
        b.seq = seq
        self._next_seq[tp] = 0 if seq >= _INT32_MAX else seq + 1
        b.seq_order = self._next_order.get(tp, 0)
        self._next_order[tp] = b.seq_order + 1
        self._open_seqs.setdefault(tp, set()).add(b.seq_order)

    def _may_number(self, tp: TopicPartition) -> bool:
        """May ``tp``'s next batch be numbered and sent?  Only within the broker's window of
        the oldest batch still out: while batch k is retried, at most k+4 can be stored, so
        k's duplicate is still answered with its result (the broker remembers 5)."""
        open_seqs = self._open_seqs.get(tp)
        if not open_seqs:
            return True
        return self._next_order.get(tp, 0) - min(open_seqs) < IDEMPOTENT_WINDOW

    def _release_seq(self, b: Batch, failed: bool) -> None:
        """``b`` completed.  A batch that failed for good leaves the broker expecting its
        sequence (or, if it may be stored, one past it): the partition starts over with a
        fresh producer id, and batches still out with the old one are renumbered when the
        broker reports their gap."""
        if b.seq is None:
            return
        open_seqs = self._open_seqs.get(b.tp)
        if open_seqs is not None:
            open_seqs.discard(b.seq_order)
        if failed and b.pid == self._pids.get(b.tp):
            self._pids[b.tp] = uuid.uuid4().hex
            self._next_seq[b.tp] = 0

    def _retry_gap(self, b: Batch, body: bytes) -> bool:
        """A 409 gap: retry ``b`` (after the backoff, in sequence order) while an earlier batch
        of its partition is still out - it must land first; renumber it if its partition
        started over meanwhile.  False: report the error."""
        if b.seq is None or not body.startswith(b"out of order"):
            return False
        if self._closing is not None:
            return False
        tp = b.tp
        earlier = any(o < b.seq_order for o in self._open_seqs.get(tp, ()))
        if not earlier:
            if b.pid == self._pids.get(tp):
                if b"unknown producer" not in body:
                    return False
                self._pids[tp] = uuid.uuid4().hex  # forgotten by the broker: start over
                self._next_seq[tp] = 0
            self._release_seq(b, failed=False)
            self._assign(b)  # the partition started over: the next sequence of the new id
        log.debug("retrying %r after a sequence gap", b)
        b.attempts -= 1  # waiting for an earlier batch is not an attempt of this one
        self.loop.call_later(self.cfg.retry_backoff_s, self._requeue, b)
        return True

    def _succeeded(self, b: Batch) -> None:
        """An acknowledged batch: send what accumulated during its round trip *first* (the
        slot is free now), then run its callbacks, so their cost overlaps the next trip."""
        if b.fut.done():  # already aborted by close()
            return
        self._release_seq(b, failed=False)
        b.body = None
        b.error = None
        self.acc.finished(b)
        self._run()
        b.complete()

    def _failed(self, b: Batch, err: MetaClientError, written: bool = False) -> None:
        """An attempt failed. ``written``: its request went out and got no answer (no reply,
        connection lost), so the broker may have stored it."""
        written = written and not isinstance(err, BrokerError)  # a reply is a definite answer
        if written:
            b.written = True
        if err.invalid_metadata:
            self.brokers.invalidate(b.tp.topic)
        if self._may_move(b, err, written):
            self._move(b, err)
            return
        if err.retriable and b.attempts <= self.cfg.retries and self._closing is None:
            log.debug("retrying %r after %s (attempt %d)", b, err, b.attempts)
            self.loop.call_later(self.cfg.retry_backoff_s, self._requeue, b)
            return
        if b.written:
            err = may_be_stored(f"send to {b.tp} ({b.count} messages)", err)
        self._finish(b, err)

    def _may_move(self, b: Batch, err: MetaClientError, written: bool) -> bool:
        """May ``b`` go to another live partition now (see the module docstring)?"""
        if not self.brokers.reroutes or b.pinned or not err.retriable:
            return False
        if b.seq is not None and b.written:  # may be stored under its number: it stays
            return False
        if self._closing is not None or (written and b.attempts > self.cfg.retries):
            return False
        return time.monotonic() < b.created + self.cfg.delivery_timeout_s

    def _move(self, b: Batch, err: MetaClientError, waited: bool = False) -> None:
        """Re-queue ``b`` on a live partition of its topic on another broker; with none, look
        again after the backoff (then any live partition will do); fail it once its delivery
        timeout has run out."""
        if self._closing is not None:
            self._finish(b, self._closing)
            return
        parts = self.brokers.partition_cache.get(b.tp.topic) or []
        others = [tp for tp in parts if tp.broker_id != b.tp.broker_id]
        if not others and waited:
            others = parts
        if others:
            tp = others[self._moves % len(others)]
            self._moves += 1
            if b.seq is not None:  # its number stays behind: that partition starts over
                self._release_seq(b, failed=True)
                b.seq = b.pid = None
            log.debug("moving %r to %s after %s", b, tp, err)
            self.acc.reroute(b, tp)
            self.wake()
            return
        backoff = self.cfg.retry_backoff_s
        if time.monotonic() + backoff >= b.created + self.cfg.delivery_timeout_s:
            self._finish(
                b, may_be_stored(f"send to {b.tp} ({b.count} messages)", err) if b.written else err
            )
            return
        self.loop.call_later(backoff, self._move, b, err, True)

    def _requeue(self, b: Batch) -> None:
        if self._closing is not None:
            self._finish(b, self._closing)
            return
        self.acc.reenqueue(b)
        self.wake()

    def _finish(self, b: Batch, err: MetaClientError) -> None:
        if b.fut.done():  # already aborted by close()
            return
        self._release_seq(b, failed=True)
        b.error = err
        b.body = None
        self.acc.finished(b)
        b.complete()
        self.wake()

    # -- shutdown ------------------------------------------------------------------------

    def fail_queued(self, err: MetaClientError) -> None:
        """Complete every batch still queued (not in flight) with ``err``; stop retrying."""
        self._closing = err if isinstance(err, ClientClosed) else ClientClosed(str(err))
        for b in self.acc.take_queued():
            b.error = self._closing
            self.acc.finished(b, in_flight=False)
            b.complete()
        if self._timer is not None:
            self._timer.cancel()

    def abort_all(self, err: MetaClientError) -> None:
        """close(): fail queued batches and every batch still in flight or backing off."""
        self.fail_queued(err)
        for b in self.acc.incomplete():
            if not b.fut.done():
                b.error = self._closing
                self.acc.finished(b, in_flight=False)
                b.complete()
        for task in list(self._tasks):
            task.cancel()
