"""The producer's accumulator: per-partition queues of record batches, and their bookkeeping.

Split from the sender as in aiokafka: ``append``/``append_many``/``append_records`` (any
thread) build the messages' records (header via ``struct.pack`` + the CRC32 of ``storage.checksum``) and add them
to the open batch of their partition; the sender (the event-loop thread) asks for the batches
that are due and writes them as ``bput``. Batches and handles are in
:mod:`pymetaq.client.producer.batch`.

A partition's queue holds batches in creation order; only the last one is open for appends.
A batch is *due* when it is full (``batch_messages`` / ``batch_bytes``), older than
``linger_ms``, forced (a synchronous ``send`` waits for it), or a flush is running. The
accumulator also owns the in-flight slots: :meth:`drain_due` hands out a due head batch only
while its partition (``part_limit``) and its broker (``max_in_flight``) have a free slot, so
under load open batches keep filling.

The sender's whole interface: :meth:`drain_due` (take due batches, taking their slots),
:meth:`reenqueue` (a batch to retry: back at the head of its queue, slot freed),
:meth:`reroute` (a failed unpinned batch moves to another partition's queue head),
:meth:`finished` (a batch completed: slot and buffer space freed), :meth:`take_queued` /
:meth:`incomplete` (shutdown), :meth:`begin_flush` / :meth:`end_flush` (flush), and
:meth:`take_wake`. Nothing outside this class touches its lock, queues or counters.

Per-message cost of ``append`` is one header, a few list operations and one small
:class:`SendHandle`; there is one completion future per **batch**, never one per message.
``buffer_bytes`` bounds the queued-but-unacknowledged bytes: a full buffer blocks an append
(up to ``block_s``, then :class:`RequestTimeout`).

Thread-safety: every method takes the accumulator's lock.
"""

from __future__ import annotations

import threading
import time
from _thread import get_ident
from bisect import bisect_right
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

from pymetaq.client.errors import RequestTimeout
from pymetaq.client.producer.batch import (
    AnyFuture,
    Batch,
    BatchHandle,
    BatchSendHandle,
    BatchSlice,
    SendHandle,
)
from pymetaq.client.producer.lanes import Lane, LaneHandle
from pymetaq.client.speedups import speedups
from pymetaq.client.types import TopicPartition
from pymetaq.storage.checksum import MASK31, crc32
from pymetaq.storage.record import ATTR_LEN, FLAG_ATTRIBUTE, HEADER, HEADER_SIZE, record_parts

_pack = HEADER.pack
_crc32 = crc32  # ISA-L's when installed (storage.checksum)
_ATTR_LEN = ATTR_LEN.pack


__all__ = ["Accumulator", "AnyFuture", "Batch", "BatchHandle", "SendHandle"]


class Accumulator:
    """Per-partition batch queues shared by the appending threads and the sender."""

    def __init__(
        self,
        *,
        batch_messages: int,
        batch_bytes: int,
        linger_s: float,
        buffer_bytes: int,
        future_factory: Callable[[], AnyFuture],
        wake: Callable[[], None],
    ) -> None:
        self.batch_messages = batch_messages
        self.batch_bytes = batch_bytes
        self.linger_s = linger_s
        self.buffer_bytes = buffer_bytes
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queues: dict[TopicPartition, deque[Batch]] = {}
        #: batches in flight per broker id: while a broker has one, its completion re-runs the
        #: sender, so appends need not wake it
        self._broker_inflight: defaultdict[int, int] = defaultdict(int)
        self._part_inflight: defaultdict[TopicPartition, int] = defaultdict(int)
        self._incomplete: dict[int, Batch] = {}
        self._buffered = 0
        self._flushing = 0
        self._future_factory = future_factory
        self._wake = wake
        self._wake_pending = False
        self._space_waiters = 0
        #: the lock-free path (``lanes.py``): the open lane per partition, the thread that
        #: appends to lanes
        self.lane_of: dict[TopicPartition, Lane] = {}
        self.owner: int | None = None
        #: brokers with queued batches after the last drain (a timer or an ack runs it again)
        self._pending_brokers: set[int] = set()

    # -- appending (any thread) ------------------------------------------------------------

    def append(
        self,
        tp: TopicPartition,
        value: bytes,
        attribute: str | None,
        force: bool = False,
        block_s: float | None = None,
        pinned: bool = False,
    ) -> SendHandle:
        """Add one message; returns its handle. Blocks up to ``block_s`` while the buffer is full.
        ``pinned``: the message must stay on ``tp`` (its batch is never moved)."""
        if attribute is None:
            data = value
            header = _pack(len(value), _crc32(value) & MASK31, 0, 0)
        else:
            a = attribute.encode("utf-8")
            data = _ATTR_LEN(len(a)) + a + value
            header = _pack(len(data), _crc32(data) & MASK31, 0, FLAG_ATTRIBUTE)
        size = HEADER_SIZE + len(data)
        wake = force
        with self._lock:
            if self._buffered + size > self.buffer_bytes and self._buffered:
                self._wait_for_space(size, block_s)
            if tp in self.lane_of:  # the lane's messages go first
                self._absorb(self.lane_of[tp])
            self._buffered += size
            q = self._queues.get(tp)
            if q:
                b = q[-1]
                if not b.open:
                    b = self._new_batch(q, tp)
                    wake = True
                elif b.nbytes + size > self.batch_bytes:
                    b.open = False
                    b = self._new_batch(q, tp)
                    wake = True
            else:
                if q is None:
                    q = self._queues[tp] = deque()
                b = self._new_batch(q, tp)
                wake = True
            handle = BatchSendHandle(b, b.count, b.nbytes)
            b.parts += (header, data)
            b.count += 1
            b.nbytes += size
            if b.count >= self.batch_messages or b.nbytes >= self.batch_bytes:
                b.open = False
                wake = True
            if force:
                b.due = True
            if pinned:
                b.pinned = True
            if wake:
                if self._wake_pending or self._broker_inflight[tp.broker_id]:
                    wake = False
                else:
                    self._wake_pending = True
        if wake:
            self._wake()
        return handle

    def append_records(
        self, tp: TopicPartition, records: Sequence[bytes], *, block_s: float | None = None
    ) -> BatchHandle:
        """Add complete, already built records (e.g. from a spool) in order (pinned)."""
        return self._enqueue(tp, list(records), list(records), 1, -HEADER_SIZE, block_s, True)

    def append_many(
        self,
        tp: TopicPartition,
        values: Sequence[bytes],
        attribute: str | None,
        *,
        block_s: float | None = None,
        pinned: bool = False,
    ) -> BatchHandle:
        """Add many messages to one partition, in order (the bulk path).

        Headers are built in one comprehension and interleaved with the data by slice
        assignment; the records fill the partition's open batch first, then new batches (the
        last one stays open, so later sends keep filling it).
        """
        if attribute is None:
            parts, _ = record_parts(values if isinstance(values, list) else list(values))
            return self._enqueue(tp, parts, values, 2, 0, block_s, pinned)
        a = attribute.encode("utf-8")
        prefix = _ATTR_LEN(len(a)) + a
        datas = [prefix + v for v in values]
        parts = [b""] * (2 * len(datas))
        parts[0::2] = [_pack(len(d), _crc32(d) & MASK31, 0, FLAG_ATTRIBUTE) for d in datas]
        parts[1::2] = datas
        return self._enqueue(tp, parts, values, 2, len(prefix), block_s, pinned)

    def _enqueue(
        self,
        tp: TopicPartition,
        parts: list[bytes],
        items: Sequence[bytes],
        per: int,
        extra: int,
        block_s: float | None,
        pinned: bool,
    ) -> BatchHandle:
        """Put messages (``per`` parts each; record size ``HEADER_SIZE + extra + len(item)``)
        in batches."""
        total = sum(map(len, items)) + (HEADER_SIZE + extra) * len(items)
        with self._lock:
            if self._buffered + total > self.buffer_bytes and self._buffered:
                self._wait_for_space(total, block_s)
            if tp in self.lane_of:
                self._absorb(self.lane_of[tp])
            self._buffered += total
            slices = self._fill(tp, parts, items, per, extra, total, pinned)
            wake = not self._wake_pending and not self._broker_inflight[tp.broker_id]
            if wake:
                self._wake_pending = True
        if wake:
            self._wake()
        return BatchHandle(slices)

    def _fill(
        self,
        tp: TopicPartition,
        parts: list[bytes],
        items: Sequence[bytes],
        per: int,
        extra: int,
        total: int,
        pinned: bool,
    ) -> list[BatchSlice]:
        """(lock held) File the messages into the partition's open batch, then new ones."""
        slices: list[BatchSlice] = []
        n, i = len(items), 0
        add = HEADER_SIZE + extra
        max_n, max_b = self.batch_messages, self.batch_bytes
        q = self._queues.get(tp)
        if q is None:
            q = self._queues[tp] = deque()
        b = q[-1] if q and q[-1].open else None
        while i < n:
            if b is None:
                b = self._new_batch(q, tp)
            start, count, nbytes = i, b.count, b.nbytes
            if count + (n - i) <= max_n and nbytes + total <= max_b:
                i, nbytes = n, nbytes + total  # the rest fits: no per-message loop
            else:
                while i < n and count < max_n:
                    size = add + len(items[i])
                    if nbytes + size > max_b and count > 0:
                        break
                    nbytes += size
                    count += 1
                    i += 1
                total -= nbytes - b.nbytes
            if i > start:
                if pinned:
                    b.pinned = True
                slices.append(BatchSlice(b, b.count, b.nbytes, items[start:i], extra))
                b.parts += parts[start * per : i * per]
                b.count += i - start
                b.nbytes = nbytes
            if b.count >= max_n or b.nbytes >= max_b or i < n:
                b.open = False
                b = None
        return slices

    def _new_batch(self, q: deque[Batch], tp: TopicPartition) -> Batch:
        b = Batch(tp, self._future_factory(), time.monotonic())
        q.append(b)
        self._incomplete[id(b)] = b
        return b

    def _wait_for_space(self, size: int, block_s: float | None) -> None:
        """Called with the lock held: wait until ``size`` more bytes fit."""
        deadline = None if block_s is None else time.monotonic() + block_s
        self._space_waiters += 1
        try:
            while self._buffered and self._buffered + size > self.buffer_bytes:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RequestTimeout(
                        f"producer buffer full ({self._buffered} bytes) for {block_s:g}s"
                    )
                self._cond.wait(left)
        finally:
            self._space_waiters -= 1

    # -- the sender's side (event-loop thread) ---------------------------------------------

    def take_wake(self) -> None:
        """The sender is running: the next append that needs it must wake it again."""
        with self._lock:
            self._wake_pending = False

    def drain_due(
        self, now: float, max_in_flight: int, part_limit: int
    ) -> tuple[list[Batch], float | None]:
        """Take the head batches that are due and have a free slot (their slots are taken).

        Returns the batches and, if an open batch is waiting for its linger time, when it is
        due (so the sender can arm a timer).
        """
        out: list[Batch] = []
        next_due: float | None = None
        linger, flushing = self.linger_s, self._flushing > 0
        broker_inflight, part_inflight = self._broker_inflight, self._part_inflight
        pending = self._pending_brokers
        with self._lock:
            pending.clear()
            if self.lane_of:
                self._absorb_all()
            for tp, q in self._queues.items():
                while q:
                    if part_inflight[tp] >= part_limit:
                        break
                    if broker_inflight[tp.broker_id] >= max_in_flight:
                        break
                    b = q[0]
                    # linger 0: due at once, also a batch this drain's absorb just created
                    # (its ``created`` is after ``now``: it was armed a 0 s timer, and went
                    # out one loop iteration later, on every round)
                    if linger and len(q) == 1 and b.open and not b.due and not flushing:
                        due_at = b.created + linger
                        if now < due_at:
                            next_due = due_at if next_due is None else min(next_due, due_at)
                            break
                    q.popleft()
                    b.open = False
                    part_inflight[tp] += 1
                    broker_inflight[tp.broker_id] += 1
                    out.append(b)
                if q:
                    pending.add(tp.broker_id)
        return out, next_due

    def reenqueue(self, b: Batch) -> None:
        """A batch to send again (a retry): back at the head of its queue (behind retries with
        an earlier sequence); its slot is freed."""
        with self._lock:
            q = self._queues.setdefault(b.tp, deque())
            if b.seq is None:
                q.appendleft(b)
            else:  # idempotent: retries go out in the order their sequences were given
                i = 0
                while i < len(q) and q[i].seq is not None and q[i].seq_order < b.seq_order:
                    i += 1
                q.insert(i, b)
            self._release_slot(b.tp)

    def reroute(self, b: Batch, tp: TopicPartition) -> None:
        """A failed batch moves to partition ``tp`` (at the head of its queue); its slot is
        freed. Only for batches nobody pinned (``b.pinned`` is False)."""
        with self._lock:
            self._release_slot(b.tp)
            b.tp = tp
            self._queues.setdefault(tp, deque()).appendleft(b)

    def finished(self, b: Batch, *, in_flight: bool = True) -> None:
        """A batch completed: free its in-flight slot (if it held one) and its buffer space."""
        with self._lock:
            if in_flight:
                self._release_slot(b.tp)
            if self._incomplete.pop(id(b), None) is not None:
                self._buffered -= b.nbytes
            if self._space_waiters or self._flushing:
                self._cond.notify_all()

    def _release_slot(self, tp: TopicPartition) -> None:
        self._part_inflight[tp] -= 1
        self._broker_inflight[tp.broker_id] -= 1

    def take_queued(self) -> list[Batch]:
        """Remove and return every batch still queued (not in flight): shutdown."""
        with self._lock:
            self._absorb_all()
            queued = [b for q in self._queues.values() for b in q]
            for q in self._queues.values():
                q.clear()
        return queued

    def incomplete(self) -> list[Batch]:
        """Every batch not completed yet (queued, in flight or backing off)."""
        with self._lock:
            self._absorb_all()
            return list(self._incomplete.values())

    # -- flush -----------------------------------------------------------------------------

    def begin_flush(self) -> list[Batch]:
        """Make every batch due from now until :meth:`end_flush`; returns the batches to wait
        for (those not completed yet)."""
        with self._lock:
            self._flushing += 1
            self._absorb_all()
            return list(self._incomplete.values())

    def end_flush(self) -> None:
        with self._lock:
            self._flushing -= 1

    # -- lanes: the lock-free per-message path (lanes.py) ---------------------------------

    def lane_append(
        self, tp: TopicPartition, value: bytes, block_s: float | None, pinned: bool = False
    ) -> SendHandle:
        """The lane path's locked step (no open lane for ``tp``, or it is full): absorb the full
        lane, wait for buffer space, open the next lane with ``value`` (``pinned``: it was sent
        with an explicit partition). A thread other than the lanes' owner gets the locked
        :meth:`append`."""
        me = get_ident()
        with self._lock:
            if self.owner is None:
                self.owner = me
            if self.owner == me:
                old = self.lane_of.get(tp)
                if old is not None:
                    self._absorb(old)
                size = HEADER_SIZE + len(value)
                if self._buffered + size > self.buffer_bytes and self._buffered:
                    self._wait_for_space(size, block_s)
                lane = self.lane_of[tp] = Lane(self, tp)
                lane.pinned = pinned
                lane.values.append(value)
                lane.nbytes = len(value)
                bid = tp.broker_id
                # a full lane's batch goes at once unless an ack will run the sender anyway
                busy = self._broker_inflight[bid] or (old is None and bid in self._pending_brokers)
                wake = not busy and not self._wake_pending
                if wake:
                    self._wake_pending = True
                handle: SendHandle | None = LaneHandle((lane, 0))
            else:
                handle = None
        if handle is None:
            return self.append(tp, value, None, False, block_s, pinned)
        if wake:
            self._wake()
        return handle

    def attend(self, lane: Lane) -> None:
        """(the owner) It appended to a lane closed meanwhile: absorb what it added."""
        self.absorb_lane(lane)

    def absorb_lane(self, lane: Lane) -> None:
        """File a lane's values into batches now (any thread; a handle that wants its batch
        before the sender took the lane) and wake the sender if nothing else will."""
        with self._lock:
            self._absorb(lane)
            wake = not self._wake_pending and not self._broker_inflight[lane.tp.broker_id]
            if wake:
                self._wake_pending = True
        if wake:
            self._wake()

    def lane_callback(
        self, lane: Lane, index: int, fn: Callable[..., object], handle: object
    ) -> bool:
        """Keep ``fn(handle)`` for a value not absorbed yet (False: it is, add it to its
        batch)."""
        with self._lock:
            if index < lane.absorbed:
                return False
            lane.callbacks += (index, fn, handle)
            return True

    def _absorb_all(self) -> None:
        for lane in list(self.lane_of.values()):
            self._absorb(lane)

    def _absorb(self, lane: Lane) -> None:
        """(lock held) Close the lane, then file its new values into batches, in order."""
        if not lane.closed:
            lane.closed = True  # before reading len(values): see lanes.py
            if self.lane_of.get(lane.tp) is lane:
                del self.lane_of[lane.tp]
        n = len(lane.values)
        pinned = lane.pinned  # after len(values): the pin of a value read is seen
        start = lane.absorbed
        if n <= start:
            return
        items = lane.values[start:n]
        parts, total = record_parts(items)
        self._buffered += total
        first = start
        for sl in self._fill(lane.tp, parts, items, 2, 0, total, pinned):
            start += lane.add_slice(start, sl)
        lane.absorbed = n
        # the batches hold the records now: drop the lane's references to the payloads (a
        # slice assignment of the same length, atomic under the GIL while the owner appends)
        lane.values[first:n] = repeat(b"", n - first)
        if lane.callbacks:
            self._attach(lane, n)

    @staticmethod
    def _attach(lane: Lane, n: int) -> None:
        """(lock held) Move the callbacks of absorbed values to their batches. Those batches
        were filled under this lock and none is in flight yet, so none can complete meanwhile:
        their callback lists are extended directly (in C with the accelerator: ``attach``)."""
        if speedups is not None:
            lane.callbacks = speedups.attach(lane.callbacks, n, lane.starts, lane.slices)
            return
        keep: list[Any] = []
        starts, slices = lane.starts, lane.slices
        triples = iter(lane.callbacks)
        for index, fn, handle in zip(triples, triples, triples):
            if index < n:
                callbacks = slices[bisect_right(starts, index) - 1].batch.callbacks
                assert callbacks is not None  # not sent yet: not completed
                callbacks += (fn, handle)
            else:
                keep += (index, fn, handle)
        lane.callbacks = keep
