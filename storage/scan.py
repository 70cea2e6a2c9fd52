"""Walking a segment file record by record: where its valid records end and what follows.

Used by recovery (the last segment after an unclean stop, adopted roll segments) and by
``pymetaq check``/``repair`` (every segment).  A record is valid when its header is complete,
``length >= 0``, the record lies inside the file, its CRC32 matches and its id is not 0.  An
all-zero header is the end of the preallocated (zero-filled) tail, not a record.

``bytes_cut`` counts the bytes after the valid end up to the last non-zero byte of the file
(the zero tail of a preallocation is not data); ``records_cut`` counts the records the framing
walk finds in that range (corrupt, torn or following ones; a torn tail counts as one).

Thread-safety: pure functions over a file nobody writes meanwhile.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

from pymetaq.storage.checksum import crc32 as _crc32
from pymetaq.storage.disk import SegmentFile
from pymetaq.storage.record import HEADER, HEADER_SIZE, MASK31, ZERO_HEADER

_CHUNK = 4 << 20


@dataclass(frozen=True)
class ScanResult:
    valid_end: int  # relative to the segment start
    records: int
    last_msg_id: int
    records_cut: int
    bytes_cut: int
    reason: str = ""  # why the walk stopped before the end of the data ("" = clean end)


class _Window:
    """Sequential chunked reads of a segment file with lookups by absolute position."""

    def __init__(self, file: SegmentFile, size: int) -> None:
        self.file, self.size = file, size
        self.base, self.buf = 0, b""

    def get(self, pos: int, n: int) -> bytes:
        if pos < self.base or pos + n > self.base + len(self.buf):
            want = max(n, _CHUNK)
            self.base = pos
            self.buf = self.file.read_at(pos, min(want, self.size - pos))
        off = pos - self.base
        return self.buf[off : off + n]


def scan_segment(file: SegmentFile, size: int) -> ScanResult:
    """Validate the records of one segment file of ``size`` bytes; find its valid end."""
    win = _Window(file, size)
    pos = records = 0
    last_id = 0
    crc32 = _crc32
    reason = ""
    while pos + HEADER_SIZE <= size:
        header = win.get(pos, HEADER_SIZE)
        if header == ZERO_HEADER:
            break
        length, crc, msg_id, _flag = HEADER.unpack(header)
        stop = pos + HEADER_SIZE + length
        if length < 0 or stop > size:
            reason = f"bad length {length}" if length < 0 else "record runs past the end"
            break
        if crc32(win.get(pos + HEADER_SIZE, length)) & MASK31 != crc:
            reason = "checksum mismatch"
            break
        if msg_id == 0:
            reason = "message id 0"
            break
        records += 1
        last_id = msg_id
        pos = stop
    garbage_end = _last_nonzero_end(file, pos, size)
    if garbage_end > pos and not reason:
        reason = "incomplete record" if garbage_end - pos < HEADER_SIZE else "zero header"
    cut = _count_cut(win, pos, garbage_end)
    return ScanResult(pos, records, last_id, cut, garbage_end - pos, reason)


def _last_nonzero_end(file: SegmentFile, lo: int, size: int) -> int:
    """One past the last non-zero byte in ``[lo, size)`` (``lo`` if all zero)."""
    end = _data_end(file, lo, size)
    while end > lo:
        start = max(lo, end - _CHUNK)
        chunk = file.read_at(start, end - start).rstrip(b"\0")
        if chunk:
            return start + len(chunk)
        end = start
    return lo


def _data_end(file: SegmentFile, lo: int, size: int) -> int:
    """End of the last allocated extent at or after ``lo`` (SEEK_DATA/SEEK_HOLE), or ``size``."""
    fd = file.dup_fd()
    if fd is None:
        return size
    try:
        end, pos = lo, lo
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after pos
                break
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            end, pos = min(hole, size), hole
        return end
    except OSError:
        return size
    finally:
        os.close(fd)


def _count_cut(win: _Window, pos: int, end: int) -> int:
    count = 0
    while pos < end:
        count += 1
        if pos + HEADER_SIZE > end:
            break
        header = win.get(pos, HEADER_SIZE)
        if header == ZERO_HEADER:
            break
        length = HEADER.unpack(header)[0]
        if length < 0:
            break
        pos += HEADER_SIZE + length
    return count


@dataclass(frozen=True)
class TailState:
    """What the clean-shutdown marker records of a partition's last segment."""

    start: int
    size: int
    crc: int  # CRC32 of its last 4096 bytes (:func:`tail_crc`)


def tail_crc(file: SegmentFile, size: int, n: int = 4096) -> int:
    """CRC32 of the last ``n`` bytes of a file of ``size`` bytes (the clean marker's check)."""
    start = max(0, size - n)
    return zlib.crc32(file.read_at(start, size - start)) & 0xFFFFFFFF
