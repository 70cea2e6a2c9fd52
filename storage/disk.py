"""The one narrow interface through which segment bytes reach the disk.

Every segment write, fsync, truncate, create, rename and unlink goes through a :class:`Disk`
and the :class:`SegmentFile` objects it returns, so a test double can drop unsynced writes and
simulate a power loss.  The real implementation, :class:`MmapDisk`:

- creates a segment sized (``ftruncate``, sparse) to its capacity and maps it with the
  stdlib :mod:`mmap` (shared, read/write); ``write_at`` is one slice assignment into the map —
  no memoryview of the map is ever created, so the map can always be closed;
- **reserves space before a byte is written into the map**: a store into a sparse page that
  the filesystem cannot back raises SIGBUS and kills the process, so ``write_at`` first makes
  sure the range is allocated with ``os.posix_fallocate``, in chunks ahead of the write
  position (the chunk doubles with the space already reserved, from ``RESERVE_MIN_BYTES`` to
  ``RESERVE_MAX_BYTES``: an idle partition holds at most 64 KiB it has not written, a busy one
  4 MiB, and ``seal``/``close`` trim the rest; never the whole segment up front, which would
  allocate ``max_segment_size`` per partition).  ENOSPC/EDQUOT become
  :class:`~pymetaq.storage.errors.DiskFull` and nothing is written;
- ``sync`` runs ``os.fdatasync`` on a ``dup`` of the descriptor (it covers pages written
  through a shared map on Linux, and measured cheaper than ``mmap.flush``); the dup keeps a
  concurrent ``close`` from invalidating the descriptor mid-call;
- ``seal(size)`` drops the map and trims the file to ``size`` (after a roll, by the flusher,
  and at clean close); ``grow(capacity)`` enlarges a mapped file and its map (an empty active
  segment receiving a batch larger than it);
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
    """A real segment file; mapped while writable."""

    def __init__(self, path: str, fd: int, capacity: int) -> None:
        self.path = path
        self._fd = fd
        self._lock = threading.Lock()
        self._closed = False
        self._map: mmap.mmap | None = None
        self._reserved = 0  # bytes from 0 known to be allocated (safe to store through the map)
        self._can_reserve = True
        if capacity > 0:
            size = os.fstat(fd).st_size
            self._reserved = min(size, capacity)
            if size < capacity:
                os.ftruncate(fd, capacity)
            self._map = mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        m = self._map
        if m is None:
            os.pwrite(self._fd, data, pos)
            return
        end = pos + len(data)
        if end > self._reserved:
            self._reserve(end, len(m))
        m[pos:end] = data

    def _reserve(self, end: int, capacity: int) -> None:
        """Allocate ``[reserved, end + chunk)`` before anything is stored there (no SIGBUS)."""
        if not self._can_reserve:
            return
        start = self._reserved
        chunk = min(RESERVE_MAX_BYTES, max(RESERVE_MIN_BYTES, start))
        new = min(capacity, max(end, start + chunk))
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

    def seal(self, size: int) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        os.ftruncate(self._fd, size)

    def truncate(self, size: int) -> None:
        """Cut the file at ``size``; a mapped file is re-extended (zeros) to its capacity."""
        if self._map is None:
            os.ftruncate(self._fd, size)
            return
        capacity = len(self._map)
        self._map.close()
        os.ftruncate(self._fd, size)
        os.ftruncate(self._fd, capacity)
        self._reserved = min(self._reserved, size)
        self._map = mmap.mmap(self._fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def grow(self, capacity: int) -> None:
        """Enlarge a mapped file (and its map) to ``capacity`` bytes."""
        if self._map is None or capacity <= len(self._map):
            return
        self._map.close()
        os.ftruncate(self._fd, capacity)
        self._map = mmap.mmap(self._fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

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


class MmapDisk:
    """The real disk: files under the OS, writable segments memory-mapped."""

    def create(self, path: str, capacity: int) -> SegmentFile:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            return MmapSegmentFile(path, fd, capacity)
        except BaseException:
            os.close(fd)
            raise

    def open(self, path: str, *, writable: bool, capacity: int = 0) -> SegmentFile:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            return MmapSegmentFile(path, fd, capacity if writable else 0)
        except BaseException:
            os.close(fd)
            raise

    def sync_dir(self, path: str) -> None:
        fsync_dir(path)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)
