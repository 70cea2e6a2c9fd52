"""The one narrow interface through which segment bytes reach the disk.

Every segment write, fsync, truncate, create, rename and unlink goes through a :class:`Disk`
and the :class:`SegmentFile` objects it returns, so a test double can drop unsynced writes and
simulate a power loss.  The real implementation, :class:`MmapDisk`:

- creates a segment sized (``ftruncate``, sparse) to its capacity.  How appended bytes reach
  the page cache is the broker's ``[system] segmentWrites`` (:data:`~pymetaq.storage.config.WRITE_MODES`):

  - ``pwrite`` (the default): ``write_at`` is one ``os.pwrite`` (repeated after a short write);
  - ``mmap``: a writable segment is mapped with the stdlib :mod:`mmap` (shared, read/write)
    and ``write_at`` is one slice assignment into the map (no memoryview of the map is ever
    created, so the map can always be closed).

  Both leave the same bytes in the same file, and recovery, reads and fsync are the same.
  ``pwrite`` is the default because it measured about half the broker's CPU per stored message
  (100-byte messages: 335-417 ns against 580-750 ns; ``docs/benchmarks.md``).  The first store
  into a page of a shared map takes a page fault whose kernel path (``filemap_fault``, then the
  filesystem's readpage) zero-fills the page before the copy overwrites it: ``perf`` put 46 %
  of the broker's CPU in that ``memset``.  A ``pwrite`` copies once.  Kafka writes its log
  this way, and RocketMQ's ``transientStorePoolEnable`` exists for the same reason;
- **reserves space before a byte is written**: a store into a sparse page of a map that the
  filesystem cannot back raises SIGBUS and kills the process, and a ``pwrite`` that runs out
  of space halfway leaves part of a batch, so ``write_at`` first makes sure the range is
  allocated with ``os.posix_fallocate``, in chunks ahead of the write position (the chunk
  doubles with the space already reserved, from ``RESERVE_MIN_BYTES`` to
  ``RESERVE_MAX_BYTES``: an idle partition holds at most 64 KiB it has not written, a busy one
  4 MiB, and ``seal``/``close`` trim the rest; never the whole segment up front, which would
  allocate ``max_segment_size`` per partition).  ENOSPC/EDQUOT become
  :class:`~pymetaq.storage.errors.DiskFull` and nothing is written;
- ``sync`` runs ``os.fdatasync`` on a ``dup`` of the descriptor (it covers pages written
  through a shared map on Linux, and measured cheaper than ``mmap.flush``); the dup keeps a
  concurrent ``close`` from invalidating the descriptor mid-call;
- ``seal(size)`` drops the map (if any) and trims the file to ``size`` (after a roll, by the
  flusher, and at clean close); ``grow(capacity)`` enlarges a writable file (and its map) to a
  larger capacity (an empty active segment receiving a batch larger than it);
- reads never touch the map: ``read_at`` is ``os.pread`` and ``dup_fd`` hands a private
  descriptor to a :class:`~pymetaq.storage.segment.FileRegion` (for ``sendfile``).

Thread-safety: ``write_at``/``truncate``/``grow`` are called under the owning partition's lock
only, ``seal`` by the flusher on a segment nobody appends to any more; ``sync``, ``read_at`` and ``dup_fd`` may run on any thread concurrently with them;
``close`` makes later ``dup_fd`` calls return ``None`` and later syncs no-ops.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from typing import Protocol

from pymetaq.storage import syncrange
from pymetaq.storage.config import WRITE_MODES
from pymetaq.storage.errors import DiskFull, ResourceExhausted

log = logging.getLogger(__name__)

RESERVE_MIN_BYTES = 64 << 10
RESERVE_MAX_BYTES = 4 << 20
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
#: shortages that pass: the operation may succeed when retried later (no data was touched)
TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})


def transient_error(exc: OSError, what: str) -> ResourceExhausted | None:
    """The retriable storage error for a transient ``exc`` (no space, no descriptors, no
    memory), or None when ``exc`` is a real I/O failure."""
    if exc.errno in NO_SPACE:
        return DiskFull(
            f"{what}: {os.strerror(exc.errno or 0)} (writes resume when space is freed)"
        )
    if exc.errno in TRANSIENT:
        return ResourceExhausted(f"{what}: {os.strerror(exc.errno or 0)}")
    return None


class SegmentFile(Protocol):
    """One segment file, opened for appends (mapped) or read-only."""

    path: str

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None: ...
    def sync(self) -> None: ...
    def start_writeback(self, pos: int, n: int) -> None: ...
    def seal(self, size: int) -> None: ...
    def truncate(self, size: int) -> None: ...
    def grow(self, capacity: int) -> None: ...
    def read_at(self, pos: int, n: int) -> bytes: ...
    def size(self) -> int: ...
    def dup_fd(self) -> int | None: ...
    def close(self) -> None: ...


class Disk(Protocol):
    """Creates and opens segment files and changes directories."""

    def create(self, path: str, capacity: int) -> SegmentFile: ...
    def open(self, path: str, *, writable: bool, capacity: int = 0) -> SegmentFile: ...
    def sync_dir(self, path: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...


def fsync_dir(path: str) -> None:
    """fsync a directory: makes the creations, renames and unlinks in it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MmapSegmentFile:
    """A real segment file; writable when opened with a capacity (and then mapped if
    ``mapped``: ``segmentWrites=mmap``)."""

    def __init__(self, path: str, fd: int, capacity: int, *, mapped: bool = False) -> None:
        self.path = path
        self._fd = fd
        self._lock = threading.Lock()
        self._closed = False
        self._map: mmap.mmap | None = None
        self._mapped = mapped and capacity > 0
        #: the file's size while it takes appends (0: opened read-only, or sealed)
        self._capacity = capacity
        self._reserved = 0  # bytes from 0 known to be allocated (safe to store through the map)
        self._can_reserve = True
        if capacity > 0:
            size = os.fstat(fd).st_size
            self._reserved = min(size, capacity)
            if size < capacity:
                os.ftruncate(fd, capacity)
            if self._mapped:
                self._map = _map(fd, capacity)

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        end = pos + len(data)
        if end > self._reserved and self._capacity:
            self._reserve(end, self._capacity)
        m = self._map
        if m is not None:
            m[pos:end] = data
            return
        try:
            done = os.pwrite(self._fd, data, pos)
            if done < len(data):  # a short write: a signal, or a filesystem without fallocate
                view = memoryview(data).cast("B")
                while done < len(view):
                    n = os.pwrite(self._fd, view[done:], pos + done)
                    if n <= 0:
                        raise DiskFull(f"{self.path}: nothing written at {pos + done}")
                    done += n
        except OSError as e:
            err = transient_error(e, self.path)
            if err is None:
                raise
            raise err from e

    def _reserve(self, end: int, capacity: int) -> None:
        """Allocate ``[reserved, end + chunk)`` before anything is stored there (no SIGBUS)."""
        if not self._can_reserve:
            return
        start = self._reserved
        chunk = min(RESERVE_MAX_BYTES, max(RESERVE_MIN_BYTES, start))
        new = min(capacity, max(end, start + chunk))
        if new <= start:  # nothing left to reserve below the capacity
            return
        try:
            os.posix_fallocate(self._fd, start, new - start)
        except OSError as e:
            if e.errno in _UNSUPPORTED:  # a filesystem without fallocate: write unprotected
                log.warning("%s: cannot reserve space (%s); a full disk may crash", self.path, e)
                self._can_reserve = False
                return
            err = transient_error(e, self.path)
            if err is None:
                raise
            raise err from e
        self._reserved = new

    def sync(self) -> None:
        fd = self.dup_fd()
        if fd is None:
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def start_writeback(self, pos: int, n: int) -> None:
        """Start writing ``[pos, pos + n)`` to the device without waiting (a hint: only
        :meth:`sync` makes anything durable; :mod:`pymetaq.storage.syncrange`)."""
        fd = self.dup_fd()
        if fd is None:
            return
        try:
            syncrange.start_writeback(fd, pos, n)
        except OSError:  # a hint only: the fdatasync that follows reports what is wrong
            pass
        finally:
            os.close(fd)

    def seal(self, size: int) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        self._capacity = 0
        os.ftruncate(self._fd, size)

    def truncate(self, size: int) -> None:
        """Cut the file at ``size``; a writable file is re-extended (zeros) to its capacity."""
        if not self._capacity:
            os.ftruncate(self._fd, size)
            return
        if self._map is not None:
            self._map.close()
            self._map = None
        os.ftruncate(self._fd, size)
        os.ftruncate(self._fd, self._capacity)
        self._reserved = min(self._reserved, size)
        if self._mapped:
            self._map = _map(self._fd, self._capacity)

    def grow(self, capacity: int) -> None:
        """Enlarge a writable file (and its map) to ``capacity`` bytes."""
        if not self._capacity or capacity <= self._capacity:
            return
        if self._map is not None:
            self._map.close()
            self._map = None
        os.ftruncate(self._fd, capacity)
        self._capacity = capacity
        if self._mapped:
            self._map = _map(self._fd, capacity)

    def read_at(self, pos: int, n: int) -> bytes:
        return os.pread(self._fd, n, pos)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def dup_fd(self) -> int | None:
        with self._lock:
            return None if self._closed else os.dup(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._map is not None:
                self._map.close()
                self._map = None
            os.close(self._fd)


def _map(fd: int, capacity: int) -> mmap.mmap:
    return mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


class MmapDisk:
    """The real disk: files under the OS; appends by ``pwrite``, or with ``writes="mmap"``
    through a shared map of each writable segment (``[system] segmentWrites``)."""

    def __init__(self, writes: str = "pwrite") -> None:
        if writes not in WRITE_MODES:
            raise ValueError(f"segment writes must be {' or '.join(WRITE_MODES)}, not {writes!r}")
        self.writes = writes
        self._mapped = writes == "mmap"

    def create(self, path: str, capacity: int) -> SegmentFile:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            return MmapSegmentFile(path, fd, capacity, mapped=self._mapped)
        except BaseException:
            os.close(fd)
            raise

    def open(self, path: str, *, writable: bool, capacity: int = 0) -> SegmentFile:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            capacity = capacity if writable else 0
            return MmapSegmentFile(path, fd, capacity, mapped=self._mapped)
        except BaseException:
            os.close(fd)
            raise

    def sync_dir(self, path: str) -> None:
        fsync_dir(path)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)
