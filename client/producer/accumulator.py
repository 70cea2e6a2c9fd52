"""The producer's accumulator: per-partition queues of record batches.

Split from the sender as in aiokafka: ``append``/``append_many`` (any thread) build the
messages' records (header via ``struct.pack`` + ``zlib.crc32``) and add them to the open batch
of their partition; the sender (the event-loop thread) takes batches that are *due* and writes
them as ``bput``. Batches and handles are in :mod:`pymetaq.client.producer.batch`.

A partition's queue holds batches in creation order; only the last one is open for appends.
A batch is *due* when it is full (``batch_messages`` / ``batch_bytes``), older than
``linger_ms``, forced (a synchronous ``send`` waits for it), or a ``flush()`` is running; the
sender also takes a due batch only while its broker has a free in-flight slot, so under load
open batches keep filling.

Per-message cost of ``append`` is one header, a few list operations and one small
:class:`SendHandle`; there is one completion future per **batch**, never one per message.
``buffer_bytes`` bounds the queued-but-unacknowledged bytes: a full buffer blocks an append
(up to ``block_s``, then :class:`RequestTimeout`).

Thread-safety: every method takes ``lock`` (``cond`` is a Condition on the same lock).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence

from pymetaq.client.errors import RequestTimeout
from pymetaq.client.producer.batch import AnyFuture, Batch, BatchHandle, Segment, SendHandle
from pymetaq.client.types import Partition
from pymetaq.storage.checksum import MASK31
from pymetaq.storage.record import ATTR_LEN, HEADER

_pack = HEADER.pack
_crc32 = zlib.crc32
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
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.queues: dict[tuple[str, Partition], deque[Batch]] = {}
        #: batches in flight per broker id, kept by the sender under ``lock``: while a broker
        #: has one, its completion re-runs the sender, so appends need not wake it
        self.broker_inflight: defaultdict[int, int] = defaultdict(int)
        self.incomplete: dict[int, Batch] = {}
        self.buffered = 0
        self.flushing = 0
        self.closed = False
        self._future_factory = future_factory
        self._wake = wake
        self._wake_pending = False
        self._space_waiters = 0

    def append(
        self,
        topic: str,
        partition: Partition,
        value: bytes,
        attribute: str | None,
        force: bool = False,
        block_s: float | None = None,
    ) -> SendHandle:
        """Add one message; returns its handle. Blocks up to ``block_s`` while the buffer is full."""
        if attribute is None:
            data = value
            header = _pack(len(value), _crc32(value) & MASK31, 0, 0)
        else:
            a = attribute.encode("utf-8")
            data = _ATTR_LEN(len(a)) + a + value
            header = _pack(len(data), _crc32(data) & MASK31, 0, 1)
        size = 20 + len(data)
        wake = force
        with self.lock:
            if self.buffered + size > self.buffer_bytes and self.buffered:
                self._wait_for_space(size, block_s)
            self.buffered += size
            key = (topic, partition)
            q = self.queues.get(key)
            if q:
                b = q[-1]
                if not b.open:
                    b = self._new_batch(q, topic, partition)
                    wake = True
                elif b.nbytes + size > self.batch_bytes:
                    b.open = False
                    b = self._new_batch(q, topic, partition)
                    wake = True
            else:
                if q is None:
                    q = self.queues[key] = deque()
                b = self._new_batch(q, topic, partition)
                wake = True
            handle = SendHandle(b, b.count, b.nbytes)
            b.parts += (header, data)
            b.count += 1
            b.nbytes += size
            if b.count >= self.batch_messages or b.nbytes >= self.batch_bytes:
                b.open = False
                wake = True
            if force:
                b.due = True
            if wake:
                if self._wake_pending or self.broker_inflight[partition.broker_id]:
                    wake = False
                else:
                    self._wake_pending = True
        if wake:
            self._wake()
        return handle

    def append_records(
        self,
        topic: str,
        partition: Partition,
        records: Sequence[bytes],
        *,
        block_s: float | None = None,
    ) -> BatchHandle:
        """Add complete, already built records (e.g. from a spool) in order."""
        return self._enqueue(topic, partition, list(records), list(records), 1, -20, block_s)

    def append_many(
        self,
        topic: str,
        partition: Partition,
        values: Sequence[bytes],
        attribute: str | None,
        *,
        block_s: float | None = None,
    ) -> BatchHandle:
        """Add many messages to one partition, in order (the bulk path).

        Headers are built in one comprehension and interleaved with the data by slice
        assignment; the records fill the partition's open batch first, then new batches (the
        last one stays open, so later sends keep filling it).
        """
        if attribute is None:
            datas = values if isinstance(values, list) else list(values)
            extra = 0
            headers = [_pack(len(v), _crc32(v) & MASK31, 0, 0) for v in datas]
        else:
            a = attribute.encode("utf-8")
            prefix = _ATTR_LEN(len(a)) + a
            extra = len(prefix)
            datas = [prefix + v for v in values]
            headers = [_pack(len(d), _crc32(d) & MASK31, 0, 1) for d in datas]
        parts: list[bytes] = [b""] * (2 * len(datas))
        parts[0::2] = headers
        parts[1::2] = datas
        return self._enqueue(topic, partition, parts, values, 2, extra, block_s)

    def _enqueue(
        self,
        topic: str,
        partition: Partition,
        parts: list[bytes],
        items: Sequence[bytes],
        per: int,
        extra: int,
        block_s: float | None,
    ) -> BatchHandle:
        """Put messages (``per`` parts each; record size ``20 + extra + len(item)``) in batches."""
        segments: list[Segment] = []
        n, i = len(items), 0
        add = 20 + extra
        total = sum(map(len, items)) + add * n
        max_n, max_b = self.batch_messages, self.batch_bytes
        with self.lock:
            if self.buffered + total > self.buffer_bytes and self.buffered:
                self._wait_for_space(total, block_s)
            key = (topic, partition)
            q = self.queues.get(key)
            if q is None:
                q = self.queues[key] = deque()
            b = q[-1] if q and q[-1].open else None
            self.buffered += total
            while i < n:
                if b is None:
                    b = self._new_batch(q, topic, partition)
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
                    segments.append(Segment(b, b.count, b.nbytes, items[start:i], extra))
                    b.parts += parts[start * per : i * per]
                    b.count += i - start
                    b.nbytes = nbytes
                if b.count >= max_n or b.nbytes >= max_b or i < n:
                    b.open = False
                    b = None
            wake = not self._wake_pending and not self.broker_inflight[partition.broker_id]
            if wake:
                self._wake_pending = True
        if wake:
            self._wake()
        return BatchHandle(segments)

    def _new_batch(self, q: deque[Batch], topic: str, partition: Partition) -> Batch:
        b = Batch(topic, partition, self._future_factory(), time.monotonic())
        q.append(b)
        self.incomplete[id(b)] = b
        return b

    def _wait_for_space(self, size: int, block_s: float | None) -> None:
        """Called with the lock held: wait until ``size`` more bytes fit."""
        deadline = None if block_s is None else time.monotonic() + block_s
        self._space_waiters += 1
        try:
            while self.buffered and self.buffered + size > self.buffer_bytes:
                if self.closed:
                    return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RequestTimeout(
                        f"producer buffer full ({self.buffered} bytes) for {block_s:g}s"
                    )
                self.cond.wait(left)
        finally:
            self._space_waiters -= 1

    def take_wake(self) -> None:
        """The sender is running: the next append that needs it must wake it again."""
        with self.lock:
            self._wake_pending = False

    def iter_heads(self) -> Iterator[tuple[tuple[str, Partition], deque[Batch]]]:
        """(caller holds ``cond``) every non-empty partition queue."""
        return ((k, q) for k, q in self.queues.items() if q)

    def is_due(self, b: Batch, now: float) -> bool:
        return not b.open or b.due or self.flushing > 0 or now - b.created >= self.linger_s

    def release(self, batch: Batch) -> None:
        """A batch completed: free its buffer space."""
        with self.lock:
            self.incomplete.pop(id(batch), None)
            self.buffered -= batch.nbytes
            if self._space_waiters or self.flushing:
                self.cond.notify_all()

    def snapshot_incomplete(self) -> list[Batch]:
        with self.lock:
            return list(self.incomplete.values())
