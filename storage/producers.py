"""The idempotent producers' file of one partition: which batch each producer stored where.

An idempotent ``bput`` (``docs/protocol.md``) carries a producer id and the batch's sequence
number for that producer and partition.  The broker remembers, per producer, the last few
batches it stored (sequence, first id, offset, length, count), so a retried batch is answered
with its original result instead of being appended again - also after a restart.  That memory
lives in ``<partition dir>/producers.idem``, an append-only file of fixed-size entries:

| bytes | field                                                        |
|-------|--------------------------------------------------------------|
| 16    | producer id (a UUID's 16 bytes)                              |
| 4     | sequence (int32, big-endian like the whole entry)            |
| 4     | record count of the batch                                    |
| 8     | first message id (ids are consecutive)                       |
| 8     | offset of the batch's first record                           |
| 4     | length of the batch in bytes                                 |
| 4     | CRC32 of the 44 bytes before it, & 0x7FFFFFFF                |

**Order.** An entry is written (``pwrite``) while the partition log holds its lock, after
the batch was stamped and *before* its bytes are copied into the segment (the log's
``before_write`` hook), so after a process crash the data of a batch is never on disk without
its entry.  In group-commit mode the entry is durable before the batch is acknowledged; the file
is the log's *companion* (:class:`~pymetaq.storage.log.Companion`): the log calls
:meth:`ProducerFile.before_flush` before its own fdatasync and :meth:`ProducerFile.after_flush`
once it succeeded, and the durable callback's :meth:`ProducerFile.sync` then finds its entry
covered (its ticket, from :meth:`append`) and returns at once.  How the entry gets there is
the file's *mode*, chosen at :meth:`ProducerFile.load` (the broker's ``[system]
producersSync``):

- **in place** (``auto`` on ext4 and XFS, :func:`~pymetaq.storage.syncrange.in_place_filesystem`):
  the file keeps a *reserve* of zeros after its last entry, written and fdatasynced ahead of
  time (:data:`RESERVE_MIN` to :data:`RESERVE_MAX` bytes, renewed on a helper thread when less
  than half of :data:`RESERVE_MIN` is left), so a new entry overwrites blocks that are already
  allocated, written and inside the durable size.  ``before_flush`` writes the entries since the
  last round to the device with ``sync_file_range`` and waits; the log's fdatasync that follows
  flushes the device's cache, which makes them durable with the log's data: one cache flush per
  round instead of two (:mod:`pymetaq.storage.syncrange` says why that holds and where).  An
  entry written past the prepared reserve (the renewal was not done in time) is not covered so;
  its ack waits for an fdatasync of the file, as in the other mode.
- **fdatasync** (``producersSync=fdatasync``, or any other filesystem): ``before_flush`` starts
  the file's fdatasync on a helper thread, at the same time as the log's own, so an
  acknowledgement waits for the slower of the two rather than for both one after the other.

**Recovery.** :meth:`ProducerFile.load` reads the entries up to the first one whose CRC fails (a
zero of the reserve, a torn entry), then clears what follows (zeros over it in place, cut off
otherwise), so no stale entry is found behind new ones later.
An entry says a batch *was written*, not that it survived: :func:`batch_intact` checks it
against the log (the records at ``offset`` parse, their CRCs hold, there are ``count`` of
them in ``length`` bytes and their ids run from ``first_id``).  A batch whose data was cut by
recovery (a power loss before its fsync: it was never acknowledged) fails the check - also when
newer records have filled its range since, because their ids differ.  An entry whose data was
deleted by retention is kept (it was durable).

**Compaction.** :meth:`ProducerFile.rewrite` replaces the file with the entries still
remembered, and a fresh reserve in place mode (write to ``producers.idem.new``, fdatasync,
rename, fsync the directory).

Thread-safety: ``append``, ``load`` and ``rewrite`` run on the broker's loop thread;
``before_flush``/``after_flush`` on the thread that syncs the log; ``sync`` on any thread (the
flusher, the helper's).  One lock guards the descriptor and the counters, and is not held
during an fdatasync or a ``sync_file_range`` (which run on a duplicate of the descriptor), so
appends go on meanwhile; a second lock makes fdatasyncs one at a time.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from pymetaq.storage.batch import count_records
from pymetaq.storage.disk import fsync_dir
from pymetaq.storage.errors import InvalidRecords
from pymetaq.storage.results import ReadStatus
from pymetaq.storage.syncrange import in_place_filesystem, range_sync

log = logging.getLogger(__name__)

FILE_NAME = "producers.idem"
ENTRY = struct.Struct(">16siiqqi")
ENTRY_SIZE = ENTRY.size + 4  # 48
_CRC = struct.Struct(">I")
_ID = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """One stored batch of one producer."""

    producer_id: str  # 32 lowercase hex digits
    sequence: int
    count: int
    first_id: int
    offset: int
    length: int

    def encode(self) -> bytes:
        head = ENTRY.pack(
            bytes.fromhex(self.producer_id),
            self.sequence,
            self.count,
            self.first_id,
            self.offset,
            self.length,
        )
        return head + _CRC.pack(zlib.crc32(head) & 0x7FFFFFFF)


def decode_entries(raw: bytes) -> tuple[list[ProducerEntry], int]:
    """The entries of a file's bytes and the length of its intact prefix (a torn or corrupt
    entry ends it)."""
    out: list[ProducerEntry] = []
    pos = 0
    while pos + ENTRY_SIZE <= len(raw):
        head = raw[pos : pos + ENTRY.size]
        (crc,) = _CRC.unpack_from(raw, pos + ENTRY.size)
        if zlib.crc32(head) & 0x7FFFFFFF != crc:
            break
        pid, seq, count, first_id, offset, length = ENTRY.unpack(head)
        out.append(ProducerEntry(pid.hex(), seq, count, first_id, offset, length))
        pos += ENTRY_SIZE
    return out, pos


#: ``[system] producersSync`` values (:class:`ProducerFile`'s ``sync``)
SYNC_MODES = ("auto", "fdatasync")
#: in place mode: the least and the most zeros written ahead of the entries at a time (both
#: whole 4 KiB pages and whole entries: 1,024 and 16,384 entries)
RESERVE_MIN = 1024 * ENTRY_SIZE
RESERVE_MAX = 16 * RESERVE_MIN
_ZEROS = bytes(RESERVE_MAX)


class _OS:
    """The system calls :class:`ProducerFile` makes (a test replaces them by a model of the
    page cache and the device, ``tests/storage/test_producers_in_place.py``)."""

    open = staticmethod(os.open)
    pwrite = staticmethod(os.pwrite)
    fdatasync = staticmethod(os.fdatasync)
    dup = staticmethod(os.dup)
    close = staticmethod(os.close)
    range_sync = staticmethod(range_sync)


_io = _OS()

_helpers: ThreadPoolExecutor | None = None
_helpers_lock = threading.Lock()


def _start_sync(fn: Callable[[], None]) -> None:
    """Run ``fn`` (an fdatasync) on a helper thread (made on first use)."""
    global _helpers
    with _helpers_lock:
        if _helpers is None:
            _helpers = ThreadPoolExecutor(2, thread_name_prefix="pymetaq-producers-sync")
        try:
            _helpers.submit(fn)
        except RuntimeError:  # the interpreter is shutting down: the waiters sync it themselves
            pass


def _write_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    view = memoryview(data)
    while view:
        n = _io.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n


def _zero(fd: int, start: int, end: int) -> None:
    """Write zeros over ``[start, end)`` of ``fd``."""
    while start < end:
        n = min(end - start, len(_ZEROS))
        _write_all(fd, memoryview(_ZEROS)[:n], start)
        start += n


class ProducerFile:
    """``producers.idem`` of one partition directory (see the module docstring).

    ``sync``: ``auto`` (in place where the filesystem allows it) or ``fdatasync``."""

    def __init__(self, directory: str, *, sync: str = "auto") -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, not {sync!r}")
        self.directory = directory
        self.path = os.path.join(directory, FILE_NAME)
        self._sync = sync
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one fdatasync at a time
        self._fd = -1
        #: the filesystem's name when entries are made durable in place, else None (load)
        self.in_place: str | None = None
        #: entries appended since this object was made (never reset: tickets for :meth:`sync`)
        self.appended = 0
        self._durable = 0  # of those, the first this many are durable
        self.size = 0  # bytes of entries in the file (the reserve not counted)
        self._zeroed = 0  # bytes written in the file, entries and reserve (its size)
        self._prepared = 0  # of those, the first this many an fdatasync made durable
        self._ranged = 0  # entry bytes written to the device by before_flush
        self._renewing = False  # a reserve's fdatasync is on its way
        self._generation = 0  # bumped by rewrite (positions change)

    def _decide(self) -> None:
        if self._sync == "auto" and self.in_place is None:
            self.in_place = in_place_filesystem(self.directory)

    def load(self) -> list[ProducerEntry]:
        """Every intact entry, oldest first; what follows them is cleared.  Opens the file."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                raw = b""
            entries, good = decode_entries(raw)
            self._decide()
            self._fd = _io.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            if self.in_place:
                end = max(len(raw), good + RESERVE_MIN)
                if raw.count(0, good) != len(raw) - good or end > len(raw):
                    _zero(self._fd, good, end)
                # also when nothing was written: a process crash may have left a reserve
                # in the page cache that no fdatasync covered
                _io.fdatasync(self._fd)
            else:
                end = good
                if good != len(raw):
                    os.ftruncate(self._fd, good)
            self.size = self._ranged = good
            self._zeroed = self._prepared = end
            return entries

    def read(self) -> list[ProducerEntry]:
        """Every intact entry in the file now (any thread; the file stays as it is)."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return []
        return decode_entries(raw)[0]

    def append(self, entry: ProducerEntry) -> int:
        """Write one entry (page cache; durable with the log's next flush or :meth:`sync`);
        returns its ticket."""
        data = entry.encode()
        with self._lock:
            if self._fd < 0:
                raise OSError(f"{self.path} is closed")
            _write_all(self._fd, data, self.size)
            self.appended += 1
            self.size += ENTRY_SIZE
            self._zeroed = max(self._zeroed, self.size)
            if self.in_place and not self._renewing and self._zeroed - self.size < RESERVE_MIN // 2:
                self._renew_locked()
            return self.appended

    def _renew_locked(self) -> None:
        """Write the next reserve of zeros and start its fdatasync (lock held)."""
        n = min(max(RESERVE_MIN, self.size // RESERVE_MIN * RESERVE_MIN), RESERVE_MAX)
        _zero(self._fd, self._zeroed, self._zeroed + n)
        self._zeroed += n
        self._renewing = True
        _start_sync(self._renewed)

    def _renewed(self) -> None:
        try:
            self.sync(force=True)
        except OSError as exc:  # entries past the last reserve wait for an fdatasync of their own
            log.warning("%s: syncing the next reserve failed: %s", self.path, exc)
        finally:
            with self._lock:
                self._renewing = False

    def pending(self) -> bool:
        """Is an entry written and not yet durable?"""
        return self._durable < self.appended

    def before_flush(self, overlap: Callable[[], None] | None = None) -> int | None:
        """The log is about to fdatasync (group commit, waiters to acknowledge): in place,
        write the entries since the last round to the device and return the ticket the log's
        flush will make durable (:meth:`after_flush`); else start this file's fdatasync beside
        the log's and return None (the module docstring).  ``overlap()``, the log's own
        writeback, runs first, so both writes are under way at once (in place only)."""
        with self._lock:
            if self._fd < 0 or self._durable >= self.appended:
                return None
            if not self.in_place or self.size > self._prepared:
                start = True
            else:
                start = False
                target, lo, hi, generation = (
                    self.appended,
                    self._ranged,
                    self.size,
                    self._generation,
                )
                fd = -1
                if hi > lo:
                    try:
                        fd = _io.dup(self._fd)
                    except OSError:  # no descriptor to spare: the waiters fdatasync instead
                        return None
        if start:
            _start_sync(self.sync)
            return None
        if fd >= 0:
            try:
                if overlap is not None:
                    overlap()  # the log's write on its way to the device first
                # ours written beside it, and waited for (WAIT_BEFORE, WRITE, WAIT_AFTER): one
                # call, not a start and a wait - the same latency, 9 us less CPU per round
                # on this VM (each call costs a ctypes round trip and a queue kick)
                _io.range_sync(fd, lo, hi - lo)
            except OSError:  # the waiters' own fdatasync reports what is wrong
                return None
            finally:
                _io.close(fd)
            with self._lock:
                if self._generation == generation:
                    self._ranged = max(self._ranged, hi)
        return target

    def after_flush(self, ticket: int) -> None:
        """The log's fdatasync that followed :meth:`before_flush` succeeded: the entries up
        to ``ticket`` are durable."""
        with self._lock:
            self._durable = max(self._durable, ticket)

    def sync(self, ticket: int | None = None, *, force: bool = False) -> None:
        """fdatasync unless the entries up to ``ticket`` (default: all written) are already
        durable (``force``: in any case, for a new reserve); every entry written and the
        reserve become durable (any thread)."""
        with self._sync_lock:
            with self._lock:
                target = self.appended if ticket is None else ticket
                if self._fd < 0 or (self._durable >= target and not force):
                    return
                target, zeroed, generation = self.appended, self._zeroed, self._generation
                try:
                    fd = _io.dup(self._fd)
                except OSError:  # no descriptor to spare: fsync under the lock, as before
                    _io.fdatasync(self._fd)
                    self._synced(target, zeroed, generation)
                    return
            try:
                _io.fdatasync(fd)
            finally:
                _io.close(fd)
            with self._lock:
                self._synced(target, zeroed, generation)

    def _synced(self, target: int, zeroed: int, generation: int) -> None:
        """An fdatasync that started with ``appended == target`` and ``_zeroed == zeroed``
        succeeded (lock held)."""
        self._durable = max(self._durable, target)
        if generation == self._generation:  # a rewrite since: its own reserve counts, not ours
            self._prepared = max(self._prepared, zeroed)

    def rewrite(self, entries: list[ProducerEntry]) -> None:
        """Replace the file by ``entries`` (atomically: a crash leaves the old or the new)."""
        self._decide()
        tmp = self.path + ".new"
        data = b"".join(e.encode() for e in entries)
        reserve = RESERVE_MIN if self.in_place else 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data, 0)
            _zero(fd, len(data), len(data) + reserve)
            _io.fdatasync(fd)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            os.replace(tmp, self.path)
            fsync_dir(self.directory)
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = fd
            self._generation += 1
            self._durable = self.appended  # the new file holds every live entry, synced
            self.size = self._ranged = len(data)
            self._zeroed = self._prepared = len(data) + reserve

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class _Readable(Protocol):
    """What :func:`batch_intact` needs of a partition log."""

    @property
    def min_offset(self) -> int: ...

    def read(self, offset: int, max_size: int) -> object: ...


def batch_intact(plog: _Readable, entry: ProducerEntry) -> bool:
    """Is ``entry``'s batch in the log exactly as it was written?  (True when retention has
    deleted its segment: it was durable then.)"""
    if entry.offset < plog.min_offset:
        return True
    buf = bytearray()
    while len(buf) < entry.length:
        res = plog.read(entry.offset + len(buf), entry.length - len(buf))
        region = getattr(res, "region", None)
        if getattr(res, "status", None) is not ReadStatus.OK or region is None:
            return False
        try:
            buf += region.read_bytes()
        except OSError:
            return False
        finally:
            region.close()
    try:
        count, last_id = count_records(buf)
    except InvalidRecords:
        return False
    first_id: int = _ID.unpack_from(buf, 8)[0]
    return (
        count == entry.count
        and first_id == entry.first_id
        and last_id == entry.first_id + count - 1
    )
