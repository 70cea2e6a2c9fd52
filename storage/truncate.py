"""Cutting a closed partition's log back to an offset, crash-safely (a replica rejoining).

A master that was replaced by its slave (automatic failover, :mod:`pymetaq.ha.rejoin`) may
hold a tail its successor never received: records it wrote but never acknowledged.  Before it
follows the new master it cuts its log at the new master's end; :func:`truncate_partition`
does that on a partition directory whose log is closed, and counts (and logs) exactly what it
discards: records and bytes.

Crash safety: the cut is first recorded as an **intent**, ``<dir>/truncate`` (text: ``<offset,
20 digits> <crc32 of the digits, 8 hex>\\n``, written to a temporary file, fsynced, renamed,
directory fsynced).  Then, idempotently: every segment (``.meta``/``.meta.new``) starting at
or after the cut is deleted (the newest first), the segment holding the cut is truncated to
it and fsynced, gap files at or after the cut are deleted, the ``highwater`` mark is rewritten
to the cut (fsynced: offsets never go backwards *past a cut someone asked for*), the
idempotent producers' ``producers.idem`` (:mod:`pymetaq.storage.producers`) is rewritten
without the entries of batches that end past the cut (atomically: written aside, fsynced,
renamed), the directory is fsynced, and the intent is removed.  :func:`finish_truncation`, run by recovery before it
opens a partition, completes an intent a crash left behind, so a crash at any point leaves a
log that recovers to the cut point (never to its old end).  A cut at the log's first offset
keeps an empty first segment (the log still starts where it started).

Thread-safety: the caller owns the directory (its log closed, or before it is opened).
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass

from pymetaq.storage.disk import fsync_dir
from pymetaq.storage.errors import StorageError
from pymetaq.storage.highwater import encode_high_water, read_gaps
from pymetaq.storage.producers import ENTRY_SIZE, ProducerFile
from pymetaq.storage.record import HEADER_SIZE
from pymetaq.storage.segment import GAP_SUFFIX, HIGH_WATER_FILE, NEW_SUFFIX, SUFFIX, segment_path

log = logging.getLogger(__name__)

INTENT_FILE = "truncate"
_LEN = struct.Struct(">i")


@dataclass(frozen=True)
class TruncateReport:
    """What a cut discarded from one partition."""

    directory: str
    offset: int  # the cut: the log's end afterwards
    old_end: int
    records: int  # whole records discarded
    bytes: int  # bytes discarded (old_end - offset)
    producer_entries: int = 0  # producers.idem entries of batches past the cut, dropped

    def describe(self) -> str:
        entries = f", {self.producer_entries} producer entries" if self.producer_entries else ""
        return (
            f"{self.directory}: truncated to {self.offset} (was {self.old_end}): "
            f"{self.records} record(s), {self.bytes} byte(s){entries} discarded"
        )


def _segments(directory: str) -> list[tuple[int, str]]:
    """``(start, path)`` of every ``.meta`` and ``.meta.new`` file, by start."""
    found = []
    for name in os.listdir(directory):
        for suffix in (NEW_SUFFIX, SUFFIX):
            if name.endswith(suffix):
                head = name[: -len(suffix)]
                if len(head) >= 20 and head.isdigit():
                    found.append((int(head), os.path.join(directory, name)))
                break
    found.sort()
    return found


def _count_records(path: str, pos: int, size: int) -> int:
    """Records framed from ``pos`` to ``size`` in ``path`` (a torn last one counts)."""
    count = 0
    with open(path, "rb") as f:
        while pos + HEADER_SIZE <= size:
            f.seek(pos)
            head = f.read(4)
            if len(head) < 4:
                break
            length = _LEN.unpack(head)[0]
            if length < 0 or (length == 0 and f.read(HEADER_SIZE - 4) == bytes(HEADER_SIZE - 4)):
                break  # garbage or the zero tail of a preallocation
            count += 1
            pos += HEADER_SIZE + length
    return count


def truncate_partition(directory: str, offset: int) -> TruncateReport:
    """Cut the (closed) log in ``directory`` at ``offset`` (see the module doc).

    :class:`StorageError` if ``offset`` is outside the log or inside a gap; nothing is
    changed then."""
    segments = _segments(directory)
    if not segments:
        raise StorageError(f"{directory}: no segment to truncate")
    sizes = [(start, path, os.path.getsize(path)) for start, path in segments]
    first, end = sizes[0][0], sizes[-1][0] + sizes[-1][2]
    if not first <= offset <= end:
        raise StorageError(
            f"{directory}: cannot truncate to {offset}: the log holds {first}..{end}"
        )
    if not any(s <= offset <= s + n for s, _, n in sizes):
        raise StorageError(f"{directory}: cannot truncate to {offset}: it is inside a gap")
    records = sum(
        _count_records(path, max(0, offset - start), n)
        for start, path, n in sizes
        if start + n > offset
    )
    _write_intent(directory, offset)
    dropped = _apply(directory, offset)
    report = TruncateReport(directory, offset, end, records, end - offset, dropped)
    if report.bytes:
        log.warning("%s", report.describe())
    return report


def _write_intent(directory: str, offset: int) -> None:
    path = os.path.join(directory, INTENT_FILE)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(encode_high_water(offset))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(directory)


def _read_intent(directory: str) -> int | None:
    try:
        with open(os.path.join(directory, INTENT_FILE), "rb") as f:
            raw = f.read(64)
    except FileNotFoundError:
        return None
    digits = raw[:20]
    if not digits.isdigit() or raw != encode_high_water(int(digits)):
        # the intent is renamed into place whole, so this is foreign content
        raise StorageError(f"{directory}: unreadable {INTENT_FILE} file {raw[:40]!r}")
    return int(digits)


def _cut_producers(directory: str, offset: int) -> int:
    """Rewrite ``producers.idem`` without the entries of batches ending past ``offset``
    (idempotent); how many were dropped."""
    pfile = ProducerFile(directory)
    if not os.path.exists(pfile.path):
        return 0
    entries = pfile.read()
    kept = [e for e in entries if e.offset + e.length <= offset]
    if len(kept) == len(entries) and len(entries) * ENTRY_SIZE == os.path.getsize(pfile.path):
        return 0
    try:
        pfile.rewrite(kept)
    finally:
        pfile.close()
    return len(entries) - len(kept)


def _apply(directory: str, offset: int) -> int:
    """Make the directory's log end at ``offset`` (idempotent), then drop the intent; the
    producer entries dropped."""
    segments = _segments(directory)
    keep_first = segments[0][0] if segments else None
    for start, path in reversed(segments):
        if start >= offset and start != keep_first:
            os.unlink(path)
            continue
        if os.path.getsize(path) > offset - start:
            with open(path, "r+b") as f:
                f.truncate(offset - start)
                f.flush()
                os.fsync(f.fileno())
        if start < offset or start == keep_first:
            break
    gaps, _notes = read_gaps(directory)
    for start in gaps:
        if start >= offset:
            os.unlink(segment_path(directory, start, GAP_SUFFIX))
    hw = os.path.join(directory, HIGH_WATER_FILE)
    with open(hw, "wb") as f:
        f.write(encode_high_water(offset))
        f.flush()
        os.fsync(f.fileno())
    dropped = _cut_producers(directory, offset)
    fsync_dir(directory)
    os.unlink(os.path.join(directory, INTENT_FILE))
    fsync_dir(directory)
    return dropped


def finish_truncation(directory: str) -> int | None:
    """Complete a cut a crash interrupted (recovery calls this first); the cut, or None."""
    offset = _read_intent(directory)
    if offset is None:
        return None
    log.warning("%s: completing an interrupted truncation to %d", directory, offset)
    _apply(directory, offset)
    return offset
