"""Partition-directory file naming (the one place names are built and parsed), the in-memory
segment record, and :class:`FileRegion`.

A partition directory ``<dataPath>/<topic>-<partition>/`` holds:

| file                         | what                                                          |
|------------------------------|---------------------------------------------------------------|
| ``<start>.meta``             | a segment: records from byte offset ``start`` (20+ digits,    |
|                              | zero-padded, MetaQ's naming)                                  |
| ``<start>.meta.new``         | a segment created by a roll, not yet renamed by the flusher   |
| ``<start>.meta.arc``/``.lz4``| an archived segment (retention ``archive,N[,true]``)          |
| ``<start>.gap``              | an accepted hole in the offsets: ``[start, end)`` holds no    |
|                              | data (text: ``end``); see :mod:`pymetaq.storage.recovery`     |
| ``highwater``                | the durable end ever reached (offsets never go backwards)     |
| ``<name>.damaged-<n>``       | a file ``pymetaq repair`` moved aside (never read again)      |

A ``.meta.new`` is renamed to its final name once every segment before it is sealed (trimmed
and fdatasync'd), so a ``.meta`` file in the middle of a log is always trimmed; recovery adopts
a ``.meta.new`` that continues the log exactly and discards (and counts) any other.

Thread-safety: naming functions are pure; :class:`Segment` fields ``written``/``synced`` are
mutated under the owning partition's lock and read racily (ints, atomic in CPython);
:class:`FileRegion` owns a private descriptor and is used by one thread.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from types import TracebackType

from pymetaq.storage.disk import SegmentFile

SUFFIX = ".meta"
NEW_SUFFIX = ".meta.new"
ARCHIVE_SUFFIX = ".meta.arc"
LZ4_SUFFIX = ".meta.lz4"
GAP_SUFFIX = ".gap"
HIGH_WATER_FILE = "highwater"
DAMAGED_INFIX = ".damaged-"
_NAME = re.compile(r"^(\d{20,})(\.meta(?:\.new|\.arc|\.lz4)?|\.gap)$")


def segment_name(start: int, suffix: str = SUFFIX) -> str:
    """``00000000000000001024.meta`` for a segment starting at byte 1024 (or another suffix:
    ``.meta.new``, ``.meta.arc``, ``.meta.lz4``, ``.gap``)."""
    return f"{start:020d}{suffix}"


def segment_path(directory: str, start: int, suffix: str = SUFFIX) -> str:
    """The path of the ``suffix`` file starting at ``start`` in a partition directory."""
    return os.path.join(directory, segment_name(start, suffix))


def parse_segment_name(name: str, suffix: str = SUFFIX) -> int | None:
    """The start offset of a ``<digits><suffix>`` file name, or None if it is not one."""
    m = _NAME.match(name)
    return int(m.group(1)) if m and m.group(2) == suffix else None


def aside_path(path: str) -> str:
    """A free ``<path>.damaged-<n>`` name to move a damaged file to (``pymetaq repair``)."""
    n = 1
    while os.path.lexists(f"{path}{DAMAGED_INFIX}{n}"):
        n += 1
    return f"{path}{DAMAGED_INFIX}{n}"


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """Split ``<topic>-<partition>`` at the last ``-`` (as MetaQ does)."""
    topic, sep, part = name.rpartition("-")
    if not sep or not topic or not part.isdigit():
        return None
    return topic, int(part)


@dataclass(eq=False)
class Segment:
    """One segment: ``start`` offset, bytes ``written``, bytes ``synced`` (both relative)."""

    start: int
    file: SegmentFile
    written: int = 0
    synced: int = 0
    capacity: int = 0  # 0 = no more appends (sealed, or rolled with its seal pending)
    path: str = field(default="")
    #: rolled but not yet sealed: the flusher trims the file to ``written`` and fdatasyncs it
    seal_pending: bool = False
    #: created as ``<name>.meta.new``: the flusher renames it to this path (then syncs the dir)
    final_path: str | None = None

    @property
    def end(self) -> int:
        return self.start + self.written

    @property
    def mutable(self) -> bool:
        """Still changing: the active segment, or one whose seal/rename the flusher owes."""
        return self.capacity > 0 or self.seal_pending or self.final_path is not None


class FileRegion:
    """A slice of one segment file with its own (dup'd) descriptor, for ``sendfile``.

    Retention or a roll may close or delete the segment meanwhile; the private descriptor keeps
    the bytes readable until :meth:`close`.
    """

    __slots__ = ("fd", "length", "position")

    def __init__(self, fd: int, position: int, length: int) -> None:
        self.fd = fd
        self.position = position
        self.length = length

    def read_bytes(self) -> bytes:
        """The region's bytes (``os.pread`` until complete)."""
        out = bytearray()
        while len(out) < self.length:
            chunk = os.pread(self.fd, self.length - len(out), self.position + len(out))
            if not chunk:
                raise OSError(f"segment shorter than region {self.position}+{self.length}")
            out += chunk
        return bytes(out)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FileRegion:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self.close()

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, position={self.position}, length={self.length})"
