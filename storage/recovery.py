"""Loading a partition directory and recovering its last segment after an unclean stop.

Steps (MetaQ's ``MessageStore`` + ``FileMessageSet.recover``, reported as NATS does):

1. delete leftover ``<20 digits>.meta.new`` files (a segment created by a roll that the flusher
   had not yet renamed: nothing in it was ever durable); list ``<20 digits>.meta`` files,
   sorted by start offset;
2. continuity: every segment but the last must satisfy ``start + file size == next.start``,
   else :class:`~pymetaq.storage.errors.CorruptLogError` (startup must stop, as in MetaQ);
3. after a clean shutdown (marker present) the last segment's file length is its written
   length; otherwise scan it record by record: a complete header, ``length >= 0``, the record
   inside the file, CRC32 of the data equal to the header's.  An all-zero header is the end of
   the preallocated zero-filled tail.  Everything from the first incomplete or corrupt record on
   is cut (zeroed/truncated), so a corrupt record is never served;
4. the result is a :class:`RecoveryReport`, logged by the manager and asserted by tests.

``bytes_cut`` counts the discarded bytes up to the last non-zero byte of the file (the zero
tail of the preallocation is not "cut"); ``records_cut`` counts the records the framing walk
finds in that discarded range (corrupt, torn or following ones; a torn tail counts as one).

Thread-safety: runs before the log is shared; no locking.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
import zlib
from dataclasses import dataclass

from pymetaq.storage.disk import Disk, SegmentFile
from pymetaq.storage.errors import CorruptLogError
from pymetaq.storage.record import HEADER_SIZE
from pymetaq.storage.segment import NEW_SUFFIX, Segment, parse_segment_name, segment_name

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">iiqi")
_ZERO_HEADER = bytes(HEADER_SIZE)
_CHUNK = 4 << 20
_MASK = 0x7FFFFFFF


@dataclass(frozen=True)
class RecoveryReport:
    """What opening one partition found and what it discarded."""

    topic: str
    partition: int
    directory: str
    clean: bool  # the clean-shutdown marker was present: no scan
    segments: int
    min_offset: int
    max_offset: int
    records_scanned: int  # records validated in the last segment (0 when clean)
    bytes_scanned: int
    records_cut: int
    bytes_cut: int
    truncated_at: int | None  # absolute offset of the cut, None if nothing was cut
    last_msg_id: int  # highest id seen in the scanned segment (0 if unknown/empty)


@dataclass(frozen=True)
class ScanResult:
    valid_end: int  # relative to the segment start
    records: int
    last_msg_id: int
    records_cut: int
    bytes_cut: int


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
    crc32 = zlib.crc32
    while pos + HEADER_SIZE <= size:
        header = win.get(pos, HEADER_SIZE)
        if header == _ZERO_HEADER:
            break
        length, crc, msg_id, _flag = _HEADER.unpack(header)
        stop = pos + HEADER_SIZE + length
        if length < 0 or stop > size:
            break
        if crc32(win.get(pos + HEADER_SIZE, length)) & _MASK != crc:
            break
        records += 1
        last_id = msg_id
        pos = stop
    garbage_end = _last_nonzero_end(file, pos, size)
    return ScanResult(pos, records, last_id, _count_cut(win, pos, garbage_end), garbage_end - pos)


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
        if header == _ZERO_HEADER:
            break
        length = _HEADER.unpack(header)[0]
        if length < 0:
            break
        pos += HEADER_SIZE + length
    return count


def list_segments(directory: str) -> list[tuple[int, str]]:
    """``(start, path)`` of every segment file in ``directory``, sorted by start."""
    found = []
    for name in os.listdir(directory):
        start = parse_segment_name(name)
        if start is not None:
            found.append((start, os.path.join(directory, name)))
    found.sort()
    return found


def open_segments(
    disk: Disk,
    directory: str,
    topic: str,
    partition: int,
    *,
    max_segment_size: int,
    clean: bool,
    initial_offset: int = 0,
) -> tuple[list[Segment], RecoveryReport]:
    """Open (and if needed create or recover) the segments of one partition directory."""
    _remove_unfinished(disk, directory)
    found = list_segments(directory)
    if not found:
        path = os.path.join(directory, segment_name(initial_offset))
        file = disk.create(path, max_segment_size)
        disk.sync_dir(directory)
        seg = Segment(initial_offset, file, 0, 0, max_segment_size, path)
        report = RecoveryReport(
            topic,
            partition,
            directory,
            clean,
            1,
            initial_offset,
            initial_offset,
            0,
            0,
            0,
            0,
            None,
            0,
        )
        return [seg], report
    segments: list[Segment] = []
    try:
        for start, path in found[:-1]:
            file = disk.open(path, writable=False)
            size = file.size()
            segments.append(Segment(start, file, size, size, 0, path))
        _check_continuity([(s.start, s.written) for s in segments], found[-1][0], directory)
        last, report = _recover_last(
            disk, found[-1], topic, partition, directory, max_segment_size, clean
        )
    except BaseException:
        for s in segments:
            s.file.close()
        raise
    segments.append(last)
    last_id = report.last_msg_id
    if not clean and report.records_scanned == 0 and len(segments) > 1:
        prev = segments[-2]  # crashed right after a roll: the newest id is in the previous one
        last_id = scan_segment(prev.file, prev.written).last_msg_id
    report = dataclasses.replace(
        report, segments=len(segments), min_offset=segments[0].start, last_msg_id=last_id
    )
    return segments, report


def _remove_unfinished(disk: Disk, directory: str) -> None:
    """Delete ``.meta.new`` files: rolls whose new segment was never renamed (never durable)."""
    leftovers = [
        n
        for n in os.listdir(directory)
        if n.endswith(NEW_SUFFIX) and parse_segment_name(n[: -len(".new")]) is not None
    ]
    for name in leftovers:
        log.warning("%s: deleting %s, a segment from an unfinished roll", directory, name)
        disk.unlink(os.path.join(directory, name))
    if leftovers:
        disk.sync_dir(directory)


def _check_continuity(sized: list[tuple[int, int]], last_start: int, directory: str) -> None:
    starts = [*(s for s, _ in sized), last_start]
    for (start, size), nxt in zip(sized, starts[1:]):
        if start + size != nxt:
            raise CorruptLogError(
                f"{directory}: segment {segment_name(start)} ({size} bytes) ends at "
                f"{start + size} but the next segment starts at {nxt}; refusing to open "
                "(move the damaged files away or restore them)"
            )


def _recover_last(
    disk: Disk,
    found: tuple[int, str],
    topic: str,
    partition: int,
    directory: str,
    max_segment_size: int,
    clean: bool,
) -> tuple[Segment, RecoveryReport]:
    start, path = found
    probe = disk.open(path, writable=False)
    try:
        size = probe.size()
        scan = ScanResult(size, 0, 0, 0, 0) if clean and size > 0 else scan_segment(probe, size)
    finally:
        probe.close()
    capacity = max(max_segment_size, scan.valid_end)
    file = disk.open(path, writable=True, capacity=0)
    try:
        if scan.valid_end < size:
            file.truncate(scan.valid_end)
            file.sync()
    finally:
        file.close()
    file = disk.open(path, writable=True, capacity=capacity)
    seg = Segment(start, file, scan.valid_end, scan.valid_end, capacity, path)
    cut = scan.bytes_cut > 0 or scan.records_cut > 0
    report = RecoveryReport(
        topic,
        partition,
        directory,
        clean,
        1,
        start,
        seg.end,
        scan.records,
        scan.valid_end,
        scan.records_cut,
        scan.bytes_cut,
        start + scan.valid_end if cut else None,
        scan.last_msg_id,
    )
    return seg, report
