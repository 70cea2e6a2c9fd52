"""The one narrow interface through which segment bytes reach the disk.

Every segment write, fsync, truncate, create, rename and unlink goes through a :class:`Disk`
and the :class:`SegmentFile` objects it returns, so a test double can drop unsynced writes and
simulate a power loss.  The real implementation, :class:`MmapDisk`:

- creates a segment preallocated (``ftruncate``, sparse) to its capacity and maps it with the
  stdlib :mod:`mmap` (shared, read/write); ``write_at`` is one slice assignment into the map —
  no memoryview of the map is ever created, so the map can always be closed;
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

import mmap
import os
import threading
from typing import Protocol


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


class MmapSegmentFile:
    """A real segment file; mapped while writable."""

    def __init__(self, path: str, fd: int, capacity: int) -> None:
        self.path = path
        self._fd = fd
        self._lock = threading.Lock()
        self._closed = False
        self._map: mmap.mmap | None = None
        if capacity > 0:
            if os.fstat(fd).st_size < capacity:
                os.ftruncate(fd, capacity)
            self._map = mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        m = self._map
        if m is None:
            os.pwrite(self._fd, data, pos)
            return
        m[pos : pos + len(data)] = data

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
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)
