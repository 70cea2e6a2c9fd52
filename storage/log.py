"""One partition's log: appends, durability, reads.

A :class:`PartitionLog` is a list of :class:`~pymetaq.storage.segment.Segment` s; only the
last is mutable (memory-mapped, preallocated to ``max_segment_size``).  Appends validate and
stamp a whole batch in one pass, then copy it into the map with one slice assignment.

Rolling: when a batch does not fit in the active segment's remaining capacity, the active
segment is sealed on the appending thread (map dropped, file trimmed to its written length,
fdatasync'd) before the next segment file, named by the next offset, is created — so a crash
can never leave an untrimmed segment in the middle.  A batch larger than ``max_segment_size``
gets a segment of its own, sized to fit (the only way a segment exceeds the limit).

Durability (per topic, :class:`~pymetaq.storage.config.TopicStoreConfig`):

- group commit (``unflush_threshold <= 0``): ``on_durable`` fires from the flusher thread after
  the fdatasync that covers the write; every append waiting at that moment shares one fsync;
- threshold (``unflush_threshold = N > 0``): ``on_durable`` fires before ``append`` returns;
  the flusher fsyncs every ``unflush_interval_ms``; an append that brings the unflushed count
  to N waits for that fsync (done by the flusher) before acking, so at most N - 1 acknowledged
  messages are ever unflushed (MetaQ fsyncs inline in the put thread at that point).

Visibility: ``max_offset`` is the durable high-water mark in *both* modes (MetaQ's
``FileMessageSet`` high-water mark): readers never see bytes that a power loss could take back.
In threshold mode this means consumers see new data after the next fsync (at most
``unflush_interval_ms`` later), as in MetaQ.

Thread-safety: appends, roll, sync bookkeeping and retention take the partition lock; the
fdatasync itself runs outside it.  Reads take no lock: they use an immutable snapshot of the
segment list and ``pread``/a dup'd descriptor on the durable range only.
"""

from __future__ import annotations

import bisect
import enum
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pymetaq.storage.batch import count_records, stamp_batch
from pymetaq.storage.config import StoreConfig, TopicStoreConfig
from pymetaq.storage.disk import Disk
from pymetaq.storage.errors import DurabilityTimeout, LogClosed, LogFailed
from pymetaq.storage.ids import IdWorker
from pymetaq.storage.segment import FileRegion, Segment, segment_name

log = logging.getLogger(__name__)

DurableCallback = Callable[["AppendResult", BaseException | None], None]


class FlushScheduler(Protocol):
    def request(self, plog: PartitionLog) -> None: ...


@dataclass(frozen=True)
class AppendResult:
    offset: int  # byte position of the first record
    length: int  # bytes appended
    count: int  # records appended
    first_msg_id: int  # ids are first_msg_id, first_msg_id + 1, ... (consecutive)


class ReadStatus(enum.Enum):
    OK = "ok"
    NO_DATA = "no_data"
    OUT_OF_RANGE = "out_of_range"


@dataclass(frozen=True)
class ReadResult:
    status: ReadStatus
    offset: int  # OK: the start; OUT_OF_RANGE: the nearest valid offset
    region: FileRegion | None  # OK only


class PartitionLog:
    """The append-only log of one ``<topic>-<partition>``."""

    def __init__(
        self,
        topic: str,
        partition: int,
        directory: str,
        segments: list[Segment],
        store: StoreConfig,
        config: TopicStoreConfig,
        disk: Disk,
        ids: IdWorker,
        flusher: FlushScheduler,
    ) -> None:
        self.topic, self.partition, self.directory = topic, partition, directory
        self.config = config
        self._store, self._disk, self._ids, self._flusher = store, disk, ids, flusher
        self._lock = threading.Lock()
        self._durable = threading.Condition(self._lock)
        self._view: tuple[tuple[Segment, ...], list[int]] = ((), [])
        self._set_view(segments)
        self.write_offset = segments[-1].end
        self.max_offset = self.write_offset  # everything on disk at open is durable
        self.message_count = 0
        self.message_bytes = 0
        self._waiters: list[tuple[AppendResult, DurableCallback]] = []
        self._unflushed = 0  # messages written since the last fsync (threshold mode)
        self._dir_dirty = False
        self._failed: BaseException | None = None
        self._closed = False
        self._listeners: list[Callable[[int], None]] = []
        self.last_sync = 0.0  # time.monotonic() of the last completed sync (flusher's use)

    # -- views ---------------------------------------------------------------------------

    def _set_view(self, segments: list[Segment]) -> None:
        self._view = (tuple(segments), [s.start for s in segments])

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._view[0]

    @property
    def min_offset(self) -> int:
        start: int = self._view[0][0].start
        return start

    @property
    def group_commit(self) -> bool:
        gc: bool = self.config.group_commit
        return gc

    # -- appends -------------------------------------------------------------------------

    def append(
        self,
        records: bytearray,
        *,
        stamp_ids: bool = True,
        on_durable: DurableCallback | None = None,
    ) -> AppendResult:
        """Validate, stamp and write one batch of complete records (see the module doc)."""
        n = len(records)
        with self._lock:
            self._check_open()
            if stamp_ids:
                first_id, count = stamp_batch(self._ids, records)
            else:
                count, last_id = count_records(records)
                first_id = last_id - count + 1
                self._ids.observe(last_id)
            seg = self._view[0][-1]
            if seg.written + n > seg.capacity:
                seg = self._roll(n)
            offset = seg.start + seg.written
            try:
                seg.file.write_at(seg.written, records)
            except BaseException as e:
                self._failed = e
                raise LogFailed(f"{self.name}: write failed: {e}") from e
            seg.written += n
            self.write_offset = offset + n
            self.message_count += count
            self.message_bytes += n
            result = AppendResult(offset, n, count, first_id)
            if self.config.group_commit:
                if on_durable is not None:
                    self._waiters.append((result, on_durable))
                self._flusher.request(self)
                return result
            self._unflushed += count
            if self._unflushed >= self.config.unflush_threshold:
                self._flusher.request(self)
                end = offset + n
                while self.max_offset < end and self._failed is None and not self._closed:
                    self._durable.wait()
                if self.max_offset < end:
                    raise LogFailed(f"{self.name}: fsync failed") from self._failed
        if on_durable is not None:
            on_durable(result, None)
        return result

    def append_sync(
        self, records: bytearray, *, stamp_ids: bool = True, timeout: float | None = None
    ) -> AppendResult:
        """Append and block until durable; raise on fsync failure or timeout."""
        done = threading.Event()
        outcome: list[BaseException | None] = []

        def cb(_r: AppendResult, exc: BaseException | None) -> None:
            outcome.append(exc)
            done.set()

        result = self.append(records, stamp_ids=stamp_ids, on_durable=cb)
        if not done.wait(timeout):
            raise DurabilityTimeout(f"{self.name}: not durable after {timeout}s")
        if outcome[0] is not None:
            raise LogFailed(f"{self.name}: fsync failed: {outcome[0]}") from outcome[0]
        return result

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"{self.name} is closed")
        if self._failed is not None:
            raise LogFailed(f"{self.name} failed earlier: {self._failed}") from self._failed

    def _roll(self, need: int) -> Segment:
        """Seal the active segment and start one at the write offset (lock held)."""
        old = self._view[0][-1]
        if old.written > 0:
            old.file.seal(old.written)
            old.file.sync()
            old.synced = old.written
            old.capacity = 0
            segments = list(self._view[0])
        else:  # an empty active segment too small for an oversize batch: replace it
            old.file.close()
            self._disk.unlink(old.path)
            segments = list(self._view[0][:-1])
        capacity = max(self._store.max_segment_size, need)
        path = os.path.join(self.directory, segment_name(old.end))
        file = self._disk.create(path, capacity)
        self._disk.sync_dir(self.directory)
        seg = Segment(old.end, file, 0, 0, capacity, path)
        segments.append(seg)
        self._set_view(segments)
        return seg

    # -- durability ----------------------------------------------------------------------

    def sync(self, now: float = 0.0) -> None:
        """fdatasync everything written so far, then advance ``max_offset`` and ack waiters.

        Called by the flusher thread (or by close); the fsync runs outside the lock.
        """
        with self._lock:
            self.last_sync = now
            target = self.write_offset
            if target == self.max_offset and not self._waiters:
                return
            dirty = [(s, s.written) for s in self._view[0] if s.synced < s.written]
            waiters, self._waiters = self._waiters, []
            flushed = self._unflushed
        try:
            for seg, _w in dirty:
                seg.file.sync()
        except BaseException as e:
            with self._lock:
                self._failed = e
                self._durable.notify_all()
            log.error("%s: fsync failed, log closed for appends: %s", self.name, e)
            for result, cb in waiters:
                cb(result, e)
            return
        with self._lock:
            for seg, written in dirty:
                seg.synced = max(seg.synced, written)
            advanced = target > self.max_offset
            if advanced:
                self.max_offset = target
            self._unflushed -= flushed
            self._durable.notify_all()
            listeners = list(self._listeners)
        for result, cb in waiters:
            cb(result, None)
        if advanced:
            for fn in listeners:
                fn(target)

    def add_listener(self, fn: Callable[[int], None]) -> None:
        """``fn(new_max_offset)`` after the durable high-water mark advances (any thread)."""
        with self._lock:
            self._listeners.append(fn)

    # -- reads ---------------------------------------------------------------------------

    def nearest_offset(self, offset: int) -> int:
        """MetaQ's getNearestOffset: ``offset`` clamped to ``[min_offset, max_offset]``."""
        hw: int = self.max_offset
        return min(max(offset, self.min_offset), hw)

    def read(self, offset: int, max_size: int) -> ReadResult:
        """A region starting at ``offset`` of at most ``max_size`` durable bytes."""
        if max_size <= 0:
            raise ValueError(f"max_size must be positive, not {max_size}")
        for _ in range(8):  # retry if retention closed the segment under us
            segments, starts = self._view
            hw = self.max_offset
            lo = segments[0].start
            if offset < lo or offset > hw:
                return ReadResult(ReadStatus.OUT_OF_RANGE, min(max(offset, lo), hw), None)
            if offset == hw:
                return ReadResult(ReadStatus.NO_DATA, offset, None)
            seg = segments[bisect.bisect_right(starts, offset) - 1]
            end = min(seg.start + seg.written, hw)
            length = min(max_size, self._store.max_transfer_size, end - offset)
            fd = seg.file.dup_fd()
            if fd is not None:
                return ReadResult(ReadStatus.OK, offset, FileRegion(fd, offset - seg.start, length))
        raise LogClosed(f"{self.name}: segments closed while reading")

    # -- retention and lifecycle ---------------------------------------------------------

    def detach_prefix(self, keep: Callable[[Segment], bool]) -> list[Segment]:
        """Remove the leading immutable segments for which ``keep`` is False; return them.

        The active segment is never removed.  The caller closes and deletes/archives them.
        """
        with self._lock:
            segments = list(self._view[0])
            k = 0
            while k < len(segments) - 1 and not segments[k].mutable and not keep(segments[k]):
                k += 1
            if k == 0:
                return []
            self._set_view(segments[k:])
            return segments[:k]

    def close(self) -> None:
        """Flush, trim the active segment to its written length, close every file."""
        if self._closed:
            return
        if self._failed is None:
            self.sync()
        with self._lock:
            self._closed = True
            self._durable.notify_all()
            segments = self._view[0]
            last = segments[-1]
            if last.mutable and self._failed is None:
                last.file.seal(last.written)
                last.file.sync()
            for seg in segments:
                seg.file.close()

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failed(self) -> bool:
        return self._failed is not None

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.name}, min={self.min_offset}, max={self.max_offset}, "
            f"written={self.write_offset})"
        )
