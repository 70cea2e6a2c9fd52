"""Opening one partition directory: continuity, crash recovery of the tail, offsets that never
go backwards.  Every byte it discards is counted in the :class:`RecoveryReport`.

Steps (MetaQ's ``MessageStore`` + ``FileMessageSet.recover``, reported as NATS does):

1. list ``<start>.meta`` segments, ``<start>.meta.new`` roll segments, accepted ``<start>.gap``
   holes and the ``highwater`` mark (see :mod:`pymetaq.storage.segment`);
2. continuity: every segment but the last must end exactly where the next starts, or where an
   accepted gap ends; a hole or an overlap, or a file that cannot be read, raises
   :class:`~pymetaq.storage.errors.CorruptLogError` (the manager fences that partition only);
3. the tail: the last ``.meta`` segment, scanned record by record (header complete,
   ``length >= 0``, inside the file, CRC32 equal, id not 0; an all-zero header is the end of
   the preallocated tail) unless the clean-shutdown marker vouches for it *and* its size and
   trailing bytes match what the marker recorded.  Then each ``.meta.new`` that starts exactly
   where the scanned log ends is **adopted**: it is a roll the flusher had not finished when the
   process died (threshold mode acknowledges before the fsync, so it may hold acknowledged
   messages); the segment before it is trimmed, it is renamed to ``.meta`` and scanned in turn.
   A ``.meta.new`` that does not continue the log (a power loss tore the segment before it) is
   deleted and its records and bytes are counted as cut;
4. everything from the first bad record on is cut (truncated), so a corrupt record is never
   served;
5. (first of all) a cut a crash interrupted is completed (:mod:`pymetaq.storage.truncate`);
6. offsets never go backwards: if the recovered end is below the ``highwater`` mark (the newest
   segment was deleted, a damaged tail was cut), the log continues at the mark and the hole is
   recorded as a gap (:mod:`pymetaq.storage.highwater`); the report says so.

``bytes_cut`` counts discarded bytes up to the last non-zero byte of each file (the zero tail of
a preallocation is not "cut"); ``records_cut`` counts the records the framing walk finds there.

Thread-safety: runs before the log is shared; no locking.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field

from pymetaq.storage.disk import Disk, transient_error
from pymetaq.storage.errors import CorruptLogError
from pymetaq.storage.highwater import read_gaps, read_high_water, write_gap
from pymetaq.storage.scan import ScanResult, TailState, scan_segment, tail_crc
from pymetaq.storage.segment import (
    GAP_SUFFIX,
    NEW_SUFFIX,
    SUFFIX,
    Segment,
    parse_segment_name,
    segment_name,
    segment_path,
)
from pymetaq.storage.truncate import finish_truncation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecoveryReport:
    """What opening one partition found and what it discarded."""

    topic: str
    partition: int
    directory: str
    clean: bool = False  # the clean-shutdown marker vouched for this partition: no scan
    segments: int = 0
    min_offset: int = 0
    max_offset: int = 0
    records_scanned: int = 0  # records validated in the tail (0 when clean)
    bytes_scanned: int = 0
    records_cut: int = 0  # records discarded (torn/corrupt tails, .meta.new not continuing)
    bytes_cut: int = 0
    truncated_at: int | None = None  # absolute offset of the first cut, None if nothing cut
    last_msg_id: int = 0  # highest id seen in the scanned segments (0 if unknown/empty)
    adopted: int = 0  # .meta.new roll segments adopted (they continued the log exactly)
    gap: tuple[int, int] | None = None  # [end, high-water): handed-out offsets whose data is gone
    fenced: str | None = None  # why the partition is fenced (damaged); then nothing was opened
    notes: tuple[str, ...] = ()
    created: bool = (
        False  # a new, empty partition (no files, no high-water mark): nothing to recover
    )

    @property
    def lost_data(self) -> bool:
        """Something that had been written is gone (cut, missing or unreadable)."""
        return bool(self.records_cut or self.bytes_cut or self.gap or self.fenced)

    def describe(self) -> str:
        """One line for a person (what the broker logs when it opens the partition)."""
        name = f"{self.topic}-{self.partition}"
        if self.fenced:
            return f"{name}: damaged and fenced: {self.fenced}"
        if self.created:
            return f"{name}: created in {self.directory}"
        how = (
            "clean shutdown, not scanned"
            if self.clean
            else f"scanned {self.records_scanned} record(s), {self.bytes_scanned} bytes"
        )
        parts = [
            f"{name}: recovered {self.segments} segment(s), offsets "
            f"{self.min_offset}..{self.max_offset} ({how})"
        ]
        parts.extend(self.notes)  # what was cut, adopted or skipped, and why
        return "; ".join(parts)


@dataclass
class _Listing:
    metas: list[tuple[int, str]]
    news: list[tuple[int, str]]
    gaps: dict[int, int]
    high_water: int | None
    notes: list[str] = field(default_factory=list)


def list_segments(directory: str, suffix: str = SUFFIX) -> list[tuple[int, str]]:
    """``(start, path)`` of every ``suffix`` file in ``directory``, sorted by start."""
    found = []
    for name in os.listdir(directory):
        start = parse_segment_name(name, suffix)
        if start is not None:
            found.append((start, os.path.join(directory, name)))
    found.sort()
    return found


def list_partition(directory: str) -> _Listing:
    gaps, notes = read_gaps(directory)
    high_water, note = read_high_water(directory)
    listing = _Listing(
        list_segments(directory), list_segments(directory, NEW_SUFFIX), gaps, high_water, notes
    )
    if note:
        listing.notes.append(note)
    return listing


def check_continuity(
    sized: list[tuple[int, int]], next_start: int, gaps: dict[int, int], directory: str
) -> None:
    """Each ``(start, size)`` must end where the next segment starts (or an accepted gap ends
    there); else :class:`CorruptLogError` naming the hole or the overlap."""
    starts = [*(s for s, _ in sized[1:]), next_start]
    for (start, size), nxt in zip(sized, starts):
        end = start + size
        if end == nxt or gaps.get(end) == nxt:
            continue
        what = f"a hole of {nxt - end} bytes" if end < nxt else f"{end - nxt} overlapping bytes"
        raise CorruptLogError(
            f"{directory}: segment {segment_name(start)} ({size} bytes) ends at {end} but the "
            f"next segment starts at {nxt} ({what}); run `pymetaq check` / `pymetaq repair`"
        )


def open_segments(
    disk: Disk,
    directory: str,
    topic: str,
    partition: int,
    *,
    max_segment_size: int,
    marker: TailState | None = None,
    initial_offset: int = 0,
    create: bool = True,
) -> tuple[list[Segment], RecoveryReport] | None:
    """Open (and if needed create or recover) the segments of one partition directory.

    ``marker``: the clean-shutdown marker's record of this partition (None: scan the tail).
    ``create=False``: return None instead of creating a first segment in an empty directory.
    ``initial_offset``: where a first segment starts (a replica starting at its master's
    first offset); the high-water mark still wins when it is further.
    """
    try:
        if finish_truncation(directory) is not None:
            marker = None  # the marker vouched for the tail before the cut
        listing = list_partition(directory)
        if not listing.metas and not listing.news:
            if not create:
                return None
            return _create_first(
                disk, directory, topic, partition, max_segment_size, listing, initial_offset
            )
        return _open_existing(disk, directory, topic, partition, max_segment_size, marker, listing)
    except OSError as e:
        err = transient_error(e, directory)
        if err is not None:
            raise err from e
        raise CorruptLogError(f"{directory}: cannot read the partition's files: {e}") from e


def _create_first(
    disk: Disk,
    directory: str,
    topic: str,
    partition: int,
    capacity: int,
    listing: _Listing,
    initial_offset: int = 0,
) -> tuple[list[Segment], RecoveryReport]:
    used = listing.high_water or 0
    start = max(used, initial_offset)
    notes = list(listing.notes)
    if used:
        notes.append(f"no segment files; offsets up to {start} were used: continuing there")
    path = segment_path(directory, start)
    file = disk.create(path, capacity)
    disk.sync_dir(directory)
    seg = Segment(start, file, 0, 0, capacity, path)
    report = RecoveryReport(
        topic,
        partition,
        directory,
        segments=1,
        min_offset=start,
        max_offset=start,
        notes=tuple(notes),
        created=not notes,
    )
    return [seg], report


def _open_existing(
    disk: Disk,
    directory: str,
    topic: str,
    partition: int,
    capacity: int,
    marker: TailState | None,
    listing: _Listing,
) -> tuple[list[Segment], RecoveryReport]:
    metas = listing.metas
    if not metas:  # only roll segments: the first one is where the log starts
        start, path = listing.news.pop(0)
        disk.rename(path, segment_path(directory, start))
        metas = [(start, segment_path(directory, start))]
        listing.notes.append(f"no .meta segment: adopted {segment_name(start, NEW_SUFFIX)}")
    for start in [s for s, end in listing.gaps.items() if end <= metas[0][0]]:
        disk.unlink(segment_path(directory, start, GAP_SUFFIX))  # retention removed its data
        del listing.gaps[start]
    segments: list[Segment] = []
    try:
        for start, path in metas[:-1]:
            file = disk.open(path, writable=False)
            size = file.size()
            segments.append(Segment(start, file, size, size, 0, path))
        sized = [(s.start, s.written) for s in segments]
        check_continuity(sized, metas[-1][0], listing.gaps, directory)
        tail = _Tail(disk, directory, capacity, listing)
        report = tail.recover(metas[-1], marker if not listing.news else None)
        segments += tail.segments
        report = _apply_floor(disk, directory, capacity, segments, listing, report)
    except BaseException:
        for s in segments:
            s.file.close()
        raise
    last_id = report.last_msg_id
    if not last_id and len(segments) > 1:  # the newest id is in an earlier segment
        prev = next((s for s in reversed(segments[:-1]) if s.written), None)
        if prev is not None:
            last_id = scan_segment(prev.file, prev.written).last_msg_id
    report = dataclasses.replace(
        report,
        topic=topic,
        partition=partition,
        segments=len(segments),
        min_offset=segments[0].start,
        max_offset=segments[-1].end,
        last_msg_id=last_id,
        notes=tuple(listing.notes),
    )
    return segments, report


class _Tail:
    """Recovers the tail: the last ``.meta`` segment and the roll segments that continue it."""

    def __init__(self, disk: Disk, directory: str, capacity: int, listing: _Listing) -> None:
        self.disk, self.directory, self.capacity = disk, directory, capacity
        self.listing = listing
        self.segments: list[Segment] = []
        self.cut_records = self.cut_bytes = self.scanned = self.scanned_bytes = 0
        self.truncated_at: int | None = None

    def _scan(
        self, path: str, start: int, marker: TailState | None
    ) -> tuple[int, ScanResult, bool]:
        probe = self.disk.open(path, writable=False)
        try:
            size = probe.size()
            if (
                marker is not None
                and (marker.start, marker.size) == (start, size)
                and (size == 0 or tail_crc(probe, size) == marker.crc)
            ):
                return size, ScanResult(size, 0, 0, 0, 0), True
            if marker is not None:
                self.listing.notes.append(
                    f"the clean-shutdown marker does not match {segment_name(start)} "
                    f"(recorded {marker.size} bytes at {marker.start}, found {size}): scanned"
                )
            return size, scan_segment(probe, size), False
        finally:
            probe.close()

    def _count(self, start: int, scan: ScanResult) -> None:
        self.scanned += scan.records
        self.scanned_bytes += scan.valid_end
        if scan.bytes_cut or scan.records_cut:
            self.cut_records += scan.records_cut
            self.cut_bytes += scan.bytes_cut
            at = start + scan.valid_end
            self.truncated_at = at if self.truncated_at is None else min(self.truncated_at, at)
            reason = f" ({scan.reason})" if scan.reason else ""
            self.listing.notes.append(
                f"cut {scan.bytes_cut} bytes ({scan.records_cut} records) at {at}{reason}"
            )

    def recover(self, base: tuple[int, str], marker: TailState | None) -> RecoveryReport:
        start, path = base
        size, scan, clean = self._scan(path, start, marker)
        self._count(start, scan)
        chain: list[tuple[int, str, int, ScanResult]] = [(start, path, size, scan)]
        last_id = scan.last_msg_id
        adopted = 0
        news = [n for n in self.listing.news if n[0] > start]
        self._discard([n for n in self.listing.news if n[0] <= start], "starts inside the log")
        for i, (nstart, npath) in enumerate(news):
            cstart, _, _, cscan = chain[-1]
            if nstart != cstart + cscan.valid_end:
                self._discard(
                    news[i:], f"does not continue the log (it ends at {cstart + cscan.valid_end})"
                )
                break
            nsize, nscan, _ = self._scan(npath, nstart, None)
            self._count(nstart, nscan)
            chain.append((nstart, npath, nsize, nscan))
            last_id = nscan.last_msg_id or last_id
            adopted += 1
            self.listing.notes.append(
                f"adopted {segment_name(nstart, NEW_SUFFIX)} (a roll the crash interrupted)"
            )
        self._finish(chain)
        end = self.segments[-1].end
        return RecoveryReport(
            "",
            0,
            self.directory,
            clean=clean,
            max_offset=end,
            records_scanned=self.scanned,
            bytes_scanned=self.scanned_bytes,
            records_cut=self.cut_records,
            bytes_cut=self.cut_bytes,
            truncated_at=self.truncated_at,
            last_msg_id=last_id,
            adopted=adopted,
        )

    def _discard(self, news: list[tuple[int, str]], why: str) -> None:
        for nstart, npath in news:
            _, scan, _ = self._scan(npath, nstart, None)
            records, nbytes = scan.records + scan.records_cut, scan.valid_end + scan.bytes_cut
            self.cut_records += records
            self.cut_bytes += nbytes
            if nbytes:
                at = nstart
                self.truncated_at = at if self.truncated_at is None else min(self.truncated_at, at)
            self.listing.notes.append(
                f"deleted {segment_name(nstart, NEW_SUFFIX)}: {why}; {records} records, "
                f"{nbytes} bytes discarded"
            )
            log.warning("%s: deleting %s: %s", self.directory, os.path.basename(npath), why)
            self.disk.unlink(npath)
        if news:
            self.disk.sync_dir(self.directory)

    def _finish(self, chain: list[tuple[int, str, int, ScanResult]]) -> None:
        """Trim every chain segment to its valid end (in order, each durable before the next
        is renamed), rename adopted ones to ``.meta``, open the last one for appends."""
        for k, (start, path, size, scan) in enumerate(chain):
            final = segment_path(self.directory, start)
            if path != final:  # an adopted roll segment: its predecessor is trimmed by now
                self.disk.rename(path, final)
                self.disk.sync_dir(self.directory)
            valid = scan.valid_end
            if valid < size:
                file = self.disk.open(final, writable=True, capacity=0)
                try:
                    file.truncate(valid)
                    file.sync()
                finally:
                    file.close()
            if k < len(chain) - 1:
                file = self.disk.open(final, writable=False)
                self.segments.append(Segment(start, file, valid, valid, 0, final))
                continue
            cap = max(self.capacity, valid)
            file = self.disk.open(final, writable=True, capacity=cap)
            self.segments.append(Segment(start, file, valid, valid, cap, final))


def _apply_floor(
    disk: Disk,
    directory: str,
    capacity: int,
    segments: list[Segment],
    listing: _Listing,
    report: RecoveryReport,
) -> RecoveryReport:
    """If the log ends below its high-water mark, continue at the mark (offsets never go
    backwards): seal the old last segment (or drop it if empty), record the gap, start a new
    segment at the mark."""
    floor = listing.high_water
    end = segments[-1].end
    if floor is None or end >= floor:
        return report
    last = segments[-1]
    if last.written == 0:
        last.file.close()
        disk.unlink(last.path)
        segments.pop()
    else:
        last.file.seal(last.written)
        last.file.sync()
        last.capacity = 0
    gap_start = segments[-1].end if segments else floor
    if gap_start < floor:
        write_gap(directory, gap_start, floor)
    path = segment_path(directory, floor)
    segments.append(Segment(floor, disk.create(path, capacity), 0, 0, capacity, path))
    disk.sync_dir(directory)
    msg = (
        f"the log ends at {end} but offsets up to {floor} were handed out (data deleted or "
        f"cut): continuing at {floor}; readers in [{end}, {floor}) are moved to {floor}"
    )
    listing.notes.append(msg)
    log.warning("%s: %s", directory, msg)
    return dataclasses.replace(report, gap=(end, floor))


__all__ = [
    "RecoveryReport",
    "TailState",
    "check_continuity",
    "list_partition",
    "list_segments",
    "open_segments",
    "scan_segment",
]
