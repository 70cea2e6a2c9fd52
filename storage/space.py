"""The low-disk reserve: refuse appends before the filesystem is actually full.

Space for every write is reserved with ``posix_fallocate`` (:mod:`pymetaq.storage.disk`), so a
full disk is an error reply, never a crash.  But a disk filled to the last block also starves
everything else on it (the clean-shutdown marker, the transaction journal, the OS), so the
broker stops accepting puts while the free space of the filesystem holding a data directory is
below ``min_free_disk_bytes`` (``[system] minFreeDiskBytes``; 0 turns the check off).  Reads
keep working, and appends resume by themselves once space is freed.

The free space (``statvfs``) is re-read at most every ``RECHECK_S`` seconds, or sooner once a
quarter of the reserve has been appended since the last look; while below the reserve it is
re-read at most every ``LOW_RECHECK_S`` so a refused producer sees recovery quickly.

Thread-safety: :meth:`SpaceGuard.admit` may be called concurrently from several partitions'
append paths; the fields are plain ints/floats updated racily (a stale read only delays a
re-check by one call).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from pymetaq.storage.errors import DiskFull

RECHECK_S = 1.0
LOW_RECHECK_S = 0.05
MiB = 1 << 20


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class SpaceGuard:
    """The reserve of one filesystem (shared by every log stored on it)."""

    def __init__(
        self, path: str, min_free: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.min_free = min_free
        self._clock = clock
        self._next = 0.0
        self._budget = 0  # bytes that may be appended before the next look
        self.free = -1
        self.low = False

    def admit(self, nbytes: int) -> None:
        """Raise :class:`DiskFull` if the filesystem is below the reserve."""
        if self.min_free <= 0:
            return
        self._budget -= nbytes
        now = self._clock()
        if now >= self._next or self._budget < 0:
            self._look(now)
        if self.low:
            raise DiskFull(
                f"the disk holding {self.path} is low on disk space: {self.free / MiB:.1f} MiB "
                f"free, below the {self.min_free / MiB:.1f} MiB reserve (minFreeDiskBytes); "
                "puts resume when space is freed"
            )

    def _look(self, now: float) -> None:
        try:
            self.free = free_bytes(self.path)
        except OSError:
            self.free = self.min_free  # cannot tell: do not refuse on a failed statvfs
        self.low = self.free < self.min_free
        self._next = now + (LOW_RECHECK_S if self.low else RECHECK_S)
        self._budget = max(0, (self.free - self.min_free) // 4)
