"""One partition's log: appends, durability, reads.

A :class:`PartitionLog` is a list of :class:`~pymetaq.storage.segment.Segment` s; only the
last is mutable (sized to ``max_segment_size``, space reserved ahead of the writes).  Appends
validate and stamp a whole batch in one pass, then write it with one ``pwrite`` (or one slice
assignment into the segment's map with ``segmentWrites=mmap``; :mod:`pymetaq.storage.disk`).

Rolling: when a batch does not fit in the active segment's remaining capacity, the appending
thread only marks the active segment ``seal_pending`` (no more appends) and creates the next
segment as ``<next offset>.meta.new`` (a sparse ``ftruncate``, and an ``mmap`` in ``mmap``
mode: no I/O).  The
flusher then, in segment order and before it advances ``max_offset`` past them, seals each
rolled segment (drops any map, trims the file to its written length, fdatasync) and renames
each new segment to its final name (then fsyncs the directory).  So a ``.meta`` file in the
middle of a log is always trimmed.  A crash can leave ``.meta.new`` files; in threshold mode
they may hold acknowledged messages, so recovery adopts each one that continues the log exactly
(a process crash loses nothing) and counts what it discards.  A batch larger than
``max_segment_size`` gets a segment of its own, sized to fit (the only way a segment exceeds
the limit).

Shortages are not failures: no space for a write (:class:`~pymetaq.storage.errors.DiskFull`,
space is reserved before anything is stored), no descriptor for a new segment
(:class:`~pymetaq.storage.errors.ResourceExhausted`) raise from ``append`` with nothing written
and the log healthy; a sync that cannot get a descriptor is retried by the flusher.  Only a
failed fdatasync (the kernel may have dropped the dirty pages) fails the log for good.
The durable end is recorded in the partition's ``highwater`` file before readers can see it
(:mod:`pymetaq.storage.highwater`), so offsets never go backwards.

A *companion* (:attr:`PartitionLog.companion`, a file written with the log that an
acknowledgement also needs durable: the idempotent producers' ``producers.idem``) is told
before each group-commit fdatasync that has waiters (``before_flush``) and, once that fdatasync
succeeded, which of its writes it covered (``after_flush``).  The companion decides how it gets
durable: written to the device just before, so the log's own flush covers it, or fdatasync'ed
on a helper thread at the same time (:mod:`pymetaq.storage.producers`).  Its result is not the
log's: whoever needs the companion durable still asks it (and gets the error if its sync
failed).

Durability (per topic, :class:`~pymetaq.storage.config.TopicStoreConfig`):

- group commit (``unflush_threshold <= 0``): ``on_durable`` fires from the flusher thread after
  the fdatasync that covers the write; every append waiting at that moment shares one fsync;
- threshold (``unflush_threshold = N > 0``): an append that leaves fewer than N acknowledged
  but unflushed messages is acknowledged at once (``on_durable`` before ``append`` returns);
  any other append is *not* acknowledged yet: its ``on_durable`` is deferred to the fsync that
  covers it (requested at once, run by the flusher), exactly as in group commit.  So at most
  N - 1 acknowledged messages are ever unflushed (MetaQ fsyncs inline in the put thread when
  the count reaches N), and ``append`` never blocks.  The flusher also fsyncs every
  ``unflush_interval_ms``, and as soon as N/2 acknowledged messages are unflushed: that fsync
  usually completes before the count reaches N, so appends are not held back while it runs
  (with an fsync only at N, every append during a slow fsync was deferred: a stall).

Visibility: ``max_offset`` is the durable high-water mark in *both* modes (MetaQ's
``FileMessageSet`` high-water mark): readers never see bytes that a power loss could take back.
In threshold mode this means consumers see new data after the next fsync (at most
``unflush_interval_ms`` later), as in MetaQ.

Thread-safety: appends, roll, sync bookkeeping and retention take the partition lock; the
fdatasync, seals and renames run outside it, on the flusher thread (or in ``close``; or a
small fdatasync with no roll work on the appending thread, :meth:`PartitionLog.sync_inline`),
one sync at a time per log (the sync lock).  Reads take no lock: they use an immutable
snapshot of the segment list and ``pread``/a dup'd descriptor on the durable range only.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from pymetaq.storage.batch import count_records, stamp_batch
from pymetaq.storage.config import StoreConfig, TopicStoreConfig
from pymetaq.storage.disk import NO_SPACE, TRANSIENT, Disk, transient_error
from pymetaq.storage.errors import (
    DurabilityTimeout,
    LogClosed,
    LogFailed,
    StorageError,
)
from pymetaq.storage.highwater import HighWater
from pymetaq.storage.ids import IdWorker
from pymetaq.storage.metrics import StoreMetrics
from pymetaq.storage.results import AppendResult, DurableCallback, ReadResult, ReadStatus
from pymetaq.storage.scan import TailState, tail_crc
from pymetaq.storage.segment import NEW_SUFFIX, FileRegion, Segment, segment_path
from pymetaq.storage.space import SpaceGuard

log = logging.getLogger(__name__)

#: a rename or directory fsync failing with these is retried (nothing was lost)
_RETRY_DIR = TRANSIENT | NO_SPACE


class _Retry(Exception):
    """A sync step hit a transient shortage; the cause is the OSError."""


def _step(fn: Callable[..., None], *args: str, retry: frozenset[int]) -> None:
    try:
        fn(*args)
    except OSError as e:
        if e.errno in retry:
            raise _Retry(str(e)) from e
        raise


class Companion(Protocol):
    """A file synced with a log (see the module doc)."""

    def before_flush(self, overlap: Callable[[], None]) -> int | None:
        """The log is about to fdatasync: a ticket for :meth:`after_flush`, or None.
        ``overlap()`` starts the log's own writes to the device: the companion may call it
        while its own are under way."""
        ...

    def after_flush(self, ticket: int) -> None:
        """The fdatasync that followed :meth:`before_flush` succeeded."""
        ...


class FlushScheduler(Protocol):
    def request(self, plog: PartitionLog) -> None: ...
    def retry_later(self, plog: PartitionLog) -> None: ...


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
        *,
        high_water: HighWater | None = None,
        space: SpaceGuard | None = None,
        metrics: StoreMetrics | None = None,
    ) -> None:
        self.topic, self.partition, self.directory = topic, partition, directory
        self.config = config
        self._store, self._disk, self._ids, self._flusher = store, disk, ids, flusher
        self._high_water = high_water
        #: a file whose fsync runs alongside this log's in group commit (the module doc)
        self.companion: Companion | None = None
        self._space = space
        self._metrics = metrics
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one sync at a time (flusher, loop, close)
        self._view: tuple[tuple[Segment, ...], list[int]] = ((), [])
        self._set_view(segments)
        self.write_offset = segments[-1].end
        self.max_offset = self.write_offset  # everything on disk at open is durable
        self.message_count = 0
        self.message_bytes = 0
        self._synced_count = 0  # message_count covered by the last sync (metrics)
        self._waiters: list[tuple[AppendResult, DurableCallback]] = []
        self._acked_unflushed = 0  # acknowledged, not yet covered by an fsync (threshold)
        self._flush_asked = False  # threshold mode: an early fsync was requested
        self._dir_dirty = False  # a rename whose directory fsync is still owed
        self._retry_warned = False
        self.tail_state: TailState | None = None  # set by a clean close (the marker's record)
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
        max_record_size: int | None = None,
        defer_flush: bool = False,
        new_segment: bool = False,
        before_write: Callable[[int, int, int], None] | None = None,
    ) -> AppendResult:
        """Validate, stamp and write one batch of complete records (see the module doc).

        ``max_record_size`` bounds each record's data length (its header's length field, i.e.
        the record's size minus the 20-byte header): a batch holding a longer record raises
        :class:`~pymetaq.storage.errors.InvalidRecords` and nothing is written.  Never blocks
        on an fsync.  ``defer_flush=True``: if the append needs an fsync, the flusher is *not*
        asked for it; the caller promises to call :meth:`sync_inline` or
        :meth:`request_flush` soon (the broker batches one loop iteration's appends so).
        ``new_segment=True``: the batch starts a new segment (unless the active one is still
        empty) - a replica rolls exactly where its master did, so their files are identical.
        ``before_write(offset, first_id, count)`` runs under the log's lock once the batch is
        stamped and placed, before its bytes are written (the idempotent producers' file,
        :mod:`pymetaq.storage.producers`, records the batch there); if it raises, nothing is
        written and the exception propagates.
        """
        n = len(records)
        with self._lock:
            self._check_open()
            if self._space is not None:
                self._space.admit(n)
            if stamp_ids:
                first_id, count = stamp_batch(self._ids, records, max_record_size)
            else:
                count, last_id = count_records(records, max_record_size)
                first_id = last_id - count + 1
                self._ids.observe(last_id)
            seg = self._view[0][-1]
            if seg.written + n > seg.capacity or (new_segment and seg.written):
                seg = self._roll(n)
            offset = seg.start + seg.written
            if before_write is not None:
                before_write(offset, first_id, count)
            try:
                seg.file.write_at(seg.written, records)
            except StorageError:  # DiskFull: space is reserved before anything is stored
                raise
            except BaseException as e:
                raise self._write_failed(e) from e
            seg.written += n
            self.write_offset = offset + n
            self.message_count += count
            self.message_bytes += n
            result = AppendResult(offset, n, count, first_id)
            cfg = self.config
            if cfg.group_commit or self._acked_unflushed + count >= cfg.unflush_threshold:
                # group commit, or acking now would leave N acknowledged messages unflushed
                if on_durable is not None:
                    self._waiters.append((result, on_durable))
                if not defer_flush:
                    self._flusher.request(self)
                return result
            self._acked_unflushed += count
            if 2 * self._acked_unflushed >= cfg.unflush_threshold and not self._flush_asked:
                # half way to N: fsync now, so the count is back down before it reaches N
                # (else every append would wait for that fsync, as if in group commit)
                self._flush_asked = True
                if not defer_flush:
                    self._flusher.request(self)
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

    def _write_failed(self, e: BaseException) -> StorageError:
        """The error for a failed segment write (lock held): a shortage of descriptors is
        retriable and leaves the log as it was; any other failure fails the log."""
        if isinstance(e, OSError):
            err = transient_error(e, self.name)
            if err is not None:
                return err
        self._failed = e
        return LogFailed(f"{self.name}: write failed: {e}")

    def _roll(self, need: int) -> Segment:
        """Retire the active segment and start one at the write offset (lock held).

        Cheap on purpose (this is the broker's event loop): the old segment's seal (trim +
        fdatasync) and the new one's rename to its final name are left to the flusher.  If
        the new file cannot be created (no descriptors, no inodes) nothing changes."""
        old = self._view[0][-1]
        if old.written == 0:  # an empty active segment too small for an oversize batch
            old.file.grow(need)
            old.capacity = need
            return old
        capacity = max(self._store.max_segment_size, need)
        path = segment_path(self.directory, old.end, NEW_SUFFIX)
        try:
            file = self._disk.create(path, capacity)
        except OSError as e:
            err = transient_error(e, f"{self.name}: creating {path}")
            if err is None:
                raise
            raise err from e
        old.capacity = 0
        old.seal_pending = True
        final = segment_path(self.directory, old.end)
        seg = Segment(old.end, file, 0, 0, capacity, path, final_path=final)
        self._set_view([*self._view[0], seg])
        self._flusher.request(self)  # seal the old segment soon, in either mode
        return seg

    # -- durability ----------------------------------------------------------------------

    def request_flush(self) -> None:
        """Ask the flusher thread for a :meth:`sync` (after ``append(defer_flush=True)``)."""
        self._flusher.request(self)

    def sync_inline(self, max_bytes: int) -> bool:
        """Run :meth:`sync` on this thread if it is cheap, and say whether it ran.

        Cheap: no other sync is running, no roll is unfinished (seals and renames stay on the
        flusher) and at most ``max_bytes`` are written but not fsynced.  On False nothing was
        done: the caller falls back to :meth:`request_flush`.  The broker's event loop uses
        it to acknowledge a small group commit without two thread handoffs.
        """
        if not self._sync_lock.acquire(blocking=False):
            return False
        try:
            with self._lock:
                unsynced = 0
                for s in self._unfinished():
                    if s.seal_pending or s.final_path is not None:
                        return False
                    unsynced += s.written - s.synced
                if unsynced > max_bytes:
                    return False
            self._sync_locked(time.monotonic())
            return True
        finally:
            self._sync_lock.release()

    def sync(self, now: float = 0.0) -> None:
        """fdatasync everything written so far, then advance ``max_offset`` and ack waiters.

        Also finishes rolls, in segment order: seals (trim + fdatasync) rolled segments and
        renames new ones to their final names.  Called by the flusher thread (or by close, or
        by :meth:`sync_inline`); one sync at a time (the sync lock), the I/O outside the
        partition lock.
        """
        with self._sync_lock:
            self._sync_locked(now)

    def _sync_locked(self, now: float) -> None:
        with self._lock:
            self.last_sync = now
            target = self.write_offset
            work = [(s, s.written, s.seal_pending, s.final_path) for s in self._unfinished()]
            self._flush_asked = False
            if target == self.max_offset and not self._waiters and not work:
                return
            waiters, self._waiters = self._waiters, []
            flushed = self._acked_unflushed
            count, before = self.message_count, self.max_offset
        started = time.perf_counter()
        companion = self.companion
        ticket = None
        if companion is not None and waiters and self.group_commit:
            # (the module doc) the companion's writes and ours go to the device together
            ticket = companion.before_flush(lambda: self._start_writeback(work))
        try:
            fsynced = self._finish_segments(work)
        except _Retry as e:  # nothing is lost: the same work is retried shortly
            with self._lock:
                self._waiters[:0] = waiters
            self._warn_retry(e.__cause__)
            self._flusher.retry_later(self)
            return
        except BaseException as e:
            with self._lock:
                self._failed = e
            log.error("%s: fsync failed, log closed for appends: %s", self.name, e)
            for result, cb in waiters:
                cb(result, e)
            return
        if self._high_water is not None:  # before anyone can see the new end
            self._high_water.write(target)
        with self._lock:
            advanced = target > self.max_offset
            if advanced:
                self.max_offset = target
            self._acked_unflushed -= flushed
            listeners = list(self._listeners)
        self._retry_warned = False
        if ticket is not None and fsynced and companion is not None:
            companion.after_flush(ticket)
        if self._metrics is not None:
            self._metrics.sync_round(
                time.perf_counter() - started, target - before, count - self._synced_count
            )
            self._synced_count = count
        for result, cb in waiters:
            cb(result, None)
        if advanced:
            for fn in listeners:
                fn(target)

    def _warn_retry(self, exc: BaseException | None) -> None:
        if not self._retry_warned:
            log.warning("%s: sync postponed (%s); retrying", self.name, exc)
            self._retry_warned = True

    def _start_writeback(self, work: list[tuple[Segment, int, bool, str | None]]) -> None:
        """Start sending the unsynced bytes of ``work`` to the device (sync lock held; a hint
        for the fdatasync that follows)."""
        for seg, written, _seal, _final in work:
            if seg.synced < written:
                seg.file.start_writeback(seg.synced, written - seg.synced)

    def _unfinished(self) -> tuple[Segment, ...]:
        """The segments with sync work left — unsynced bytes, a pending seal or rename — in
        log order (lock held).  Only a tail can have any: a sync finishes segments in log order
        and rolls only ever add at the end, so the walk stops at the last finished segment
        instead of visiting every segment of the log on each sync."""
        segs = self._view[0]
        i = len(segs)
        while i > 0:
            s = segs[i - 1]
            if s.synced >= s.written and not s.seal_pending and s.final_path is None:
                break
            i -= 1
        return segs[i:]

    def _finish_segments(self, work: list[tuple[Segment, int, bool, str | None]]) -> bool:
        """The I/O of :meth:`sync`, segment by segment in log order (flusher thread); whether
        an fsync ran (each one flushes the device's write cache).

        Each step's bookkeeping is recorded as soon as it is done, so a sync interrupted by a
        transient shortage (``_Retry``: no descriptor for the fsync, no directory block for
        the rename) resumes where it stopped.  A failed fdatasync is not transient: after it
        the kernel may have dropped the dirty pages, so the log fails."""
        fsynced = False
        if self._dir_dirty:
            _step(self._disk.sync_dir, self.directory, retry=_RETRY_DIR)
            self._dir_dirty = False
        for seg, written, seal, final in work:
            if final is not None:  # every segment before this one is sealed by now
                _step(self._disk.rename, seg.path, final, retry=_RETRY_DIR)
                with self._lock:
                    seg.path, seg.final_path = final, None
                self._dir_dirty = True
                _step(self._disk.sync_dir, self.directory, retry=_RETRY_DIR)
                self._dir_dirty = False
            if seal:
                seg.file.seal(written)
            if seal or seg.synced < written:
                # only a missing descriptor (the fsync never ran) is retried
                _step(seg.file.sync, retry=TRANSIENT)
                fsynced = True
            with self._lock:
                seg.synced = max(seg.synced, written)
                if seal:
                    seg.seal_pending = False
        return fsynced

    def add_listener(self, fn: Callable[[int], None]) -> None:
        """``fn(new_max_offset)`` after the durable high-water mark advances (any thread)."""
        with self._lock:
            self._listeners.append(fn)

    # -- reads ---------------------------------------------------------------------------

    def nearest_offset(self, offset: int) -> int:
        """MetaQ's getNearestOffset: the start of the segment holding ``offset``; the durable
        end (``max_offset``) if ``offset`` is at or beyond it; the first segment's start if
        ``offset`` is before it; the start of the next segment if ``offset`` is in a gap."""
        segments, starts = self._view
        hw: int = self.max_offset
        if offset >= hw:
            return hw
        if offset < starts[0]:
            return starts[0]
        i = bisect.bisect_right(starts, offset) - 1
        if offset >= segments[i].end and i + 1 < len(segments):
            return starts[i + 1]  # a gap: offsets whose data is gone (see recovery)
        start: int = starts[i]
        return start

    def read(self, offset: int, max_size: int) -> ReadResult:
        """A region starting at ``offset`` of at most ``max_size`` durable bytes.

        ``OUT_OF_RANGE`` carries the nearest offset that holds data: the first offset when
        ``offset`` is below it, the durable end when beyond it, and the end of the gap when
        ``offset`` falls in one (offsets handed out before data was lost; see recovery)."""
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
            i = bisect.bisect_right(starts, offset) - 1
            seg = segments[i]
            if offset >= seg.start + seg.written and i + 1 < len(segments):
                return ReadResult(ReadStatus.OUT_OF_RANGE, starts[i + 1], None)
            end = min(seg.start + seg.written, hw)
            length = min(max_size, self._store.max_transfer_size, end - offset)
            fd = seg.file.dup_fd()
            if fd is not None:
                return ReadResult(ReadStatus.OK, offset, FileRegion(fd, offset - seg.start, length))
        raise LogClosed(f"{self.name}: segments closed while reading")

    def read_written(self, offset: int, max_size: int) -> bytes:
        """Up to ``max_size`` bytes from ``offset`` of what was *written*, durable or not
        (a master sending its slave what it lacks, on the thread that appends, so that
        nothing is appended meanwhile); shorter at the written end or at a gap."""
        segments, starts = self._view
        end = min(self.write_offset, offset + max_size)
        out = bytearray()
        while offset < end:
            i = bisect.bisect_right(starts, offset) - 1
            if i < 0:
                break
            seg = segments[i]
            n = min(end, seg.start + seg.written) - offset
            if n <= 0:
                break
            out += seg.file.read_at(offset - seg.start, n)
            offset += n
        return bytes(out)

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
        """Flush, trim the active segment to its written length, close every file.

        Afterwards ``tail_state`` describes the trimmed last segment for the clean-shutdown
        marker (None if the log failed or could not finish its last sync: scan it next time)."""
        if self._closed:
            return
        if self._failed is None:
            self.sync()
        with self._lock:
            self._closed = True
            waiters, self._waiters = self._waiters, []
            if waiters or self._unfinished():  # the last sync was postponed and never ran
                self._failed = self._failed or LogClosed(f"{self.name}: closed before syncing")
            segments = self._view[0]
            last = segments[-1]
            if last.mutable and self._failed is None:
                last.file.seal(last.written)
                last.file.sync()
                self.tail_state = TailState(
                    last.start, last.written, tail_crc(last.file, last.written)
                )
            for seg in segments:
                seg.file.close()
            if self._high_water is not None:
                self._high_water.close()
        for result, cb in waiters:
            cb(result, LogClosed(f"{self.name} closed before the write was durable"))

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
