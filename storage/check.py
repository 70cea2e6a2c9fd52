"""Checking and repairing partition directories for operators (``pymetaq check`` / ``repair``).

:func:`check_partition` reads one partition directory and lists what is wrong, never writing:
every segment is walked record by record (CRC, framing, id 0, zero fill) unless ``quick``
(then only the newest one); consecutive segments must be contiguous, or separated by an
accepted gap (:mod:`pymetaq.storage.highwater`); roll segments (``.meta.new``), the high-water
mark and unreadable files are examined.  Each :class:`Finding` says what is wrong, where, and
what ``repair`` would do about it.  A partition the broker would fence (a hole, an overlap, an
unreadable file) or whose data is partly lost is *damaged*; notes are not damage.

:func:`repair_partition` fixes what check found, never deleting data: a damaged file is renamed
aside (``<name>.damaged-<n>``) and, when part of it is good, its valid prefix is written back
under the original name; a missing range becomes an accepted gap (readers are moved past it);
roll segments that do not continue the log are moved aside.  Then the partition is opened once
the way the broker opens it (adopting interrupted rolls, continuing at the high-water mark) and
closed cleanly.  It must run with no broker on the directory (the caller holds the lock).

Thread-safety: single-threaded tools; no broker may run on the directory during a repair.
"""

from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass, field
from typing import BinaryIO

from pymetaq.storage.disk import MmapDisk, fsync_dir
from pymetaq.storage.highwater import read_gaps, read_high_water, write_gap
from pymetaq.storage.recovery import open_segments
from pymetaq.storage.scan import ScanResult, scan_segment
from pymetaq.storage.segment import NEW_SUFFIX, SUFFIX, aside_path, parse_segment_name

_WHOLE = 1 << 62  # scan a file to its end


@dataclass(frozen=True)
class Finding:
    """One problem (``damage``) or remark (not damage) about a partition."""

    damage: bool
    file: str  # the file name it concerns ("" for the partition as a whole)
    message: str
    fix: str = ""  # what repair does about it ("" = nothing to do)


@dataclass
class PartitionCheck:
    topic: str
    partition: int
    directory: str
    segments: int = 0
    records: int = 0
    data_bytes: int = 0
    min_offset: int = 0
    max_offset: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        return any(f.damage for f in self.findings)

    def add(self, damage: bool, file: str, message: str, fix: str = "") -> None:
        self.findings.append(Finding(damage, file, message, fix))


def _listed(directory: str, suffix: str) -> list[tuple[int, str]]:
    """``(start, file name)`` of the ``suffix`` files of a partition directory, by start."""
    found = ((parse_segment_name(n, suffix), n) for n in os.listdir(directory))
    return sorted((s, n) for s, n in found if s is not None)


@dataclass
class _Seg:
    start: int
    name: str
    size: int = 0
    scan: ScanResult | None = None
    error: str = ""


def _scan_file(path: str, limit: int | None) -> tuple[int, ScanResult | None, str]:
    """(file size, the scan of its first ``limit`` bytes or None if not scanned, error)."""
    disk = MmapDisk()
    try:
        file = disk.open(path, writable=False)
    except OSError as e:
        return 0, None, f"cannot open it: {e.strerror or e}"
    try:
        size = file.size()
        if limit is None:
            return size, None, ""
        return size, scan_segment(file, min(size, limit)), ""
    except OSError as e:
        return 0, None, f"cannot read it: {e.strerror or e}"
    finally:
        file.close()


def check_partition(
    directory: str, topic: str, partition: int, *, quick: bool = False, live: bool = False
) -> PartitionCheck:
    """What is wrong with one partition directory (read-only).  ``live``: a broker is writing
    it, so its newest segment's tail and its roll segments are not judged."""
    pc = PartitionCheck(topic, partition, directory)
    metas, news = _listed(directory, SUFFIX), _listed(directory, NEW_SUFFIX)
    gaps, notes = read_gaps(directory)
    for note in notes:
        pc.add(False, "", note)
    segs = [_Seg(start, name) for start, name in metas]
    for k, seg in enumerate(segs):
        last = k == len(segs) - 1
        limit = None if quick and not last else _WHOLE if last else segs[k + 1].start - seg.start
        seg.size, seg.scan, seg.error = _scan_file(os.path.join(directory, seg.name), limit)
    _judge_segments(pc, segs, gaps, live)
    if news and not live:
        _judge_news(pc, segs, news, directory)
    _judge_high_water(pc, segs, directory)
    pc.segments = len(segs)
    if segs:
        pc.min_offset = segs[0].start
        pc.max_offset = segs[-1].start + (
            segs[-1].scan.valid_end if segs[-1].scan else segs[-1].size
        )
    return pc


def _judge_segments(pc: PartitionCheck, segs: list[_Seg], gaps: dict[int, int], live: bool) -> None:
    for k, seg in enumerate(segs):
        last = k == len(segs) - 1
        if seg.error:
            pc.add(True, seg.name, seg.error, "move it aside; its offsets become a gap")
            continue
        scan = seg.scan
        if scan is not None:
            pc.records += scan.records
            pc.data_bytes += scan.valid_end
        if not last:
            end = seg.start + seg.size
            nxt = segs[k + 1].start
            if end > nxt:
                pc.add(
                    True,
                    seg.name,
                    f"it overlaps the next segment by {end - nxt} bytes",
                    "keep its records that end by the next segment's start; move the "
                    "original aside",
                )
            elif end < nxt and gaps.get(end) != nxt:
                pc.add(
                    True,
                    seg.name,
                    f"a hole of {nxt - end} bytes after it: offsets "
                    f"[{end}, {nxt}) have no segment (a deleted or lost file?)",
                    "accept the gap: readers in it are moved to the next segment",
                )
            if scan is not None and scan.valid_end < min(seg.size, nxt - seg.start):
                at = seg.start + scan.valid_end
                pc.add(
                    True,
                    seg.name,
                    f"{scan.reason or 'bad record'} at offset {at}: "
                    f"{seg.size - scan.valid_end} bytes after it cannot be served",
                    "keep the records before it, move the original aside, accept the rest as a gap",
                )
        elif scan is not None and (scan.bytes_cut or scan.records_cut) and not live:
            at = seg.start + scan.valid_end
            pc.add(
                True,
                seg.name,
                f"{scan.reason or 'torn record'} at offset {at}: "
                f"{scan.bytes_cut} bytes ({scan.records_cut} records) after it are damaged",
                "keep the records before it, move the original aside",
            )


def _judge_news(
    pc: PartitionCheck, segs: list[_Seg], news: list[tuple[int, str]], directory: str
) -> None:
    end = segs[-1].start + (segs[-1].scan.valid_end if segs[-1].scan else 0) if segs else -1
    for start, name in news:
        _size, scan, error = _scan_file(os.path.join(directory, name), _WHOLE)
        if error or start != end or scan is None:
            records = scan.records if scan else 0
            pc.add(
                True,
                name,
                f"a roll segment that does not continue the log ({records} "
                "records)" + (f": {error}" if error else ""),
                "move it aside",
            )
            continue
        pc.add(
            False,
            name,
            f"a roll interrupted by a crash ({scan.records} records): the "
            "broker adopts it at start",
        )
        end = start + scan.valid_end


def _judge_high_water(pc: PartitionCheck, segs: list[_Seg], directory: str) -> None:
    high, note = read_high_water(directory)
    if note:
        pc.add(False, "highwater", note)
    if high is None or not segs:
        return
    last = segs[-1]
    end = last.start + (last.scan.valid_end if last.scan else last.size)
    if end < high:
        pc.add(
            True,
            segs[-1].name,
            f"the log ends at {end} but offsets up to {high} were "
            "handed out: the data in between is gone",
            f"record the gap [{end}, {high}) and continue at {high}",
        )


# -- repair ------------------------------------------------------------------------------------


def _keep_prefix(directory: str, name: str, keep: int, actions: list[str]) -> None:
    """Move ``name`` aside and write its first ``keep`` bytes back under ``name``."""
    if keep == 0:
        _move_aside(directory, name, actions)
        return
    path = os.path.join(directory, name)
    aside = aside_path(path)
    os.rename(path, aside)
    tmp = path + ".tmp"
    with open(aside, "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(_Limited(src, keep), dst)
        dst.flush()
        os.fsync(dst.fileno())
    os.rename(tmp, path)
    fsync_dir(directory)
    actions.append(
        f"moved {name} aside to {os.path.basename(aside)}; wrote its first {keep} bytes back"
    )


class _Limited:
    """The first ``n`` bytes of a binary file, as a readable for ``shutil.copyfileobj``."""

    def __init__(self, f: BinaryIO, n: int) -> None:
        self.f, self.n = f, n

    def read(self, size: int = -1) -> bytes:
        if self.n <= 0:
            return b""
        data = self.f.read(self.n if size < 0 else min(size, self.n))
        self.n -= len(data)
        return data


def _move_aside(directory: str, name: str, actions: list[str]) -> None:
    path = os.path.join(directory, name)
    aside = aside_path(path)
    os.rename(path, aside)
    fsync_dir(directory)
    actions.append(f"moved {name} aside to {os.path.basename(aside)}")


def repair_partition(directory: str, topic: str, partition: int) -> list[str]:
    """Fix what :func:`check_partition` finds (see the module doc); the actions taken."""
    actions: list[str] = []
    pc = check_partition(directory, topic, partition)
    for _, name in _listed(directory, NEW_SUFFIX):
        if any(f.file == name and f.damage for f in pc.findings):
            _move_aside(directory, name, actions)
    metas = _listed(directory, SUFFIX)
    for k, (start, name) in enumerate(metas):
        last = k == len(metas) - 1
        limit = metas[k + 1][0] - start if not last else _WHOLE
        size, scan, error = _scan_file(os.path.join(directory, name), limit)
        if error or scan is None:
            _move_aside(directory, name, actions)
        elif scan.valid_end < size and (not last or scan.bytes_cut or scan.records_cut):
            _keep_prefix(directory, name, scan.valid_end, actions)  # (a last one's zero fill
            # is no damage: recovery trims it)
    _accept_holes(directory, actions)
    _reopen(directory, topic, partition, actions)
    return actions


def _accept_holes(directory: str, actions: list[str]) -> None:
    gaps, _ = read_gaps(directory)
    metas = _listed(directory, SUFFIX)
    for (start, name), (nxt, _) in itertools.pairwise(metas):
        end = start + os.path.getsize(os.path.join(directory, name))
        if end < nxt and gaps.get(end) != nxt:
            write_gap(directory, end, nxt)
            actions.append(f"accepted the gap [{end}, {nxt}) after {name}")


def _reopen(directory: str, topic: str, partition: int, actions: list[str]) -> None:
    """Open the partition as the broker does (adopt rolls, cut a torn tail, continue at the
    high-water mark), then close it cleanly."""
    opened = open_segments(
        MmapDisk(), directory, topic, partition, max_segment_size=1 << 20, create=False
    )
    if opened is None:
        return
    segments, report = opened
    for seg in segments:
        if seg.capacity:
            seg.file.seal(seg.written)
            seg.file.sync()
        seg.file.close()
    actions += [f"recovery: {note}" for note in report.notes]
    if report.gap is not None:
        actions.append(
            f"continuing at {report.gap[1]} (the gap [{report.gap[0]}, {report.gap[1]}))"
        )


__all__ = ["Finding", "PartitionCheck", "check_partition", "repair_partition"]
