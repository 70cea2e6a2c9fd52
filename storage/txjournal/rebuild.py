"""Replay of the transaction journal: rebuild every transaction, apply committed ones exactly once.

:class:`Rebuild` is the replay visitor: it folds the records of :mod:`.format` into one
:class:`Recovered` per transaction number (the last BEGIN of a tid resets it: a checkpoint's
relog) plus the open heuristic decisions.  After the whole journal is read, every transaction
whose COMMIT record survived is made present in its partition logs exactly once by
:func:`ensure_applied`, one partition at a time:

1. where is the range?  At the APPLIED offset if one was journaled, else at the first record
   whose bytes equal the transaction's first record, searching from the COMMIT record's
   ``lower_bound`` (the log's write offset before the append: the range cannot start earlier;
   message ids are unique per broker, so the match is unambiguous);
2. all of it there, byte for byte: nothing to do;
3. a prefix of it there (a power loss tore the append; the log's own recovery cut the torn
   record): append the rest, so the range is whole and contiguous;
4. none of it: append it all.  If the search start is older than the log's first segment and
   nothing matched, retention already deleted the range: it was applied long ago.

No consumer ever saw a torn range: reads stop at the fsynced high-water mark and the range's
fsync never completed.  Then the caller journals a fresh APPLIED record and fsyncs.

Thread-safety: runs at startup on one thread, before the broker serves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pymetaq.storage.record import HEADER_SIZE, LEN_CRC
from pymetaq.storage.txjournal.format import (
    Applied,
    Begin,
    Commit,
    Forget,
    Heuristic,
    Prepare,
    Put,
    Record,
    Rollback,
)
from pymetaq.storage.txjournal.journal import JournalPos

log = logging.getLogger(__name__)

PartKey = tuple[str, int]


@dataclass
class Recovered:
    """One transaction as the journal describes it."""

    tid: int
    key: str
    xa: bool
    first: JournalPos
    parts: dict[PartKey, list[bytes]] = field(default_factory=dict)
    prepared: bool = False
    intent: Commit | None = None
    intent_pos: JournalPos | None = None
    applied: dict[PartKey, int] = field(default_factory=dict)


class Rebuild:
    """The replay visitor (see the module docstring)."""

    def __init__(self) -> None:
        self.txs: dict[int, Recovered] = {}
        self.heuristics: dict[str, tuple[Heuristic, JournalPos]] = {}
        self.max_tid = 0
        self.orphans = 0

    def __call__(self, pos: JournalPos, rec: Record) -> None:
        if isinstance(rec, Put):
            tx = self.txs.get(rec.tid)
            if tx is None:
                self.orphans += 1
                return
            tx.parts.setdefault((rec.topic, rec.partition), []).append(rec.record)
        elif isinstance(rec, Begin):
            self.max_tid = max(self.max_tid, rec.tid)
            self.txs[rec.tid] = Recovered(rec.tid, rec.key, rec.xa, pos)
        elif isinstance(rec, Heuristic):
            self.heuristics[rec.key] = (rec, pos)
        elif isinstance(rec, Forget):
            self.heuristics.pop(rec.key, None)
        else:
            self._tx_op(pos, rec)

    def _tx_op(self, pos: JournalPos, rec: Prepare | Commit | Applied | Rollback) -> None:
        tx = self.txs.get(rec.tid)
        if tx is None:  # finished before the checkpoint (APPLIED, ROLLBACK) or a stray record
            return
        if isinstance(rec, Prepare):
            tx.prepared = True
        elif isinstance(rec, Commit):
            tx.intent, tx.intent_pos = rec, pos
        elif isinstance(rec, Applied):
            tx.applied = {(t, p): off for t, p, off in rec.offsets}
        else:
            del self.txs[rec.tid]


class How(Enum):
    PRESENT = "present"  # the whole range was in the log
    COMPLETED = "completed"  # a prefix was there; the rest was appended
    APPENDED = "appended"  # none of it was there; all of it was appended
    EXPIRED = "expired"  # retention deleted it: applied long ago


@dataclass(frozen=True)
class Applied1:
    """Where one partition's range is after :func:`ensure_applied`."""

    offset: int
    how: How
    kept: int = 0  # records already present (COMPLETED)


def _read(plog: Any, start: int, end: int) -> bytes:
    """The log's bytes in ``[start, end)`` (stops early at the durable end)."""
    out = bytearray()
    pos = start
    while pos < end:
        res = plog.read(pos, end - pos)
        if res.region is None:
            break
        with res.region as region:
            chunk = region.read_bytes()
        if not chunk:
            break
        out += chunk
        pos += len(chunk)
    return bytes(out)


def _match_at(plog: Any, pos: int, records: list[bytes]) -> int:
    """How many of ``records`` are at ``pos``, consecutively, byte for byte."""
    total = sum(len(r) for r in records)
    data = _read(plog, pos, min(pos + total, plog.max_offset))
    k, off = 0, 0
    for r in records:
        if data[off : off + len(r)] != r:
            break
        k += 1
        off += len(r)
    return k


def _find_first(plog: Any, start: int, first: bytes) -> int | None:
    """The offset of the first record equal to ``first`` at or after ``start``."""
    want_id = first[8:16]
    pos, end = start, plog.max_offset
    while pos < end:
        res = plog.read(pos, end - pos)
        if res.region is None:
            return None
        with res.region as region:
            chunk = region.read_bytes()
        off = 0
        while off + HEADER_SIZE <= len(chunk):
            length = LEN_CRC.unpack_from(chunk, off)[0]
            size = HEADER_SIZE + length
            if length < 0 or off + size > len(chunk):
                break
            if chunk[off + 8 : off + 16] == want_id and chunk[off : off + size] == first:
                return pos + off
            off += size
        if off == 0:  # not even one whole record fits: the log is damaged past here
            return None
        pos += off
    return None


def locate(plog: Any, records: list[bytes], lower_bound: int, applied_at: int | None) -> int | None:
    """Where ``records[0]`` sits in ``plog`` (the recorded position first), or None."""
    if applied_at is not None and _match_at(plog, applied_at, records) > 0:
        return applied_at
    found: int | None = _find_first(plog, max(lower_bound, plog.min_offset), records[0])
    return found


def torn(plog: Any, records: list[bytes], lower_bound: int, applied_at: int | None) -> bool:
    """Only a first part of ``records`` is in ``plog``: a crash cut its range."""
    pos = locate(plog, records, lower_bound, applied_at)
    return pos is not None and 0 < _match_at(plog, pos, records) < len(records)


def ensure_applied(
    plog: Any, records: list[bytes], lower_bound: int, applied_at: int | None
) -> Applied1:
    """Make ``records`` present in ``plog`` exactly once (see the module docstring)."""
    pos = locate(plog, records, lower_bound, applied_at)
    if pos is None:
        if (
            min(lower_bound, applied_at if applied_at is not None else lower_bound)
            < plog.min_offset
        ):
            return Applied1(lower_bound, How.EXPIRED)
        return Applied1(append_records(plog, records), How.APPENDED)
    k = _match_at(plog, pos, records)
    if k == len(records):
        return Applied1(pos, How.PRESENT)
    stop = pos + sum(len(r) for r in records[:k])
    if stop != plog.write_offset:
        log.error(
            "%s: %d of %d records of a committed transaction sit at %d, followed by other data; "
            "appending the other %d at the end",
            plog.name,
            k,
            len(records),
            pos,
            len(records) - k,
        )
    append_records(plog, records[k:])
    return Applied1(pos, How.COMPLETED, k)


def append_records(plog: Any, records: list[bytes]) -> int:
    """Append ``records`` (ids already stamped) as one write and fsync; returns the offset."""
    result = plog.append_sync(bytearray().join(records), stamp_ids=False, timeout=60.0)
    plog.sync()
    offset: int = result.offset
    return offset
