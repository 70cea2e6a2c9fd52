"""Retention by consumer progress (``deletePolicy=consumed,<groups>[,min-age]``): the pure
decision for one closed segment, the source of committed offsets it reads, and the count of
records a deletion takes from a group.

A closed segment ``[start, end)`` of a partition is **consumed** when every named group's
committed offset for that partition (the next byte it fetches) is ``>= end``; a group with no
committed offset for the partition has consumed nothing of it.  With ``*`` the groups are the
ones the offset store knows for the topic; when it knows none, nothing counts as consumed.

:func:`decide` for one segment, given its age (``now - mtime``):

1. the active (mutable) segment is always kept;
2. age > ``maxRetention`` (when > 0): **capped** — removed whatever the groups did; every named
   group whose offset is below ``end`` loses the bytes ``[max(offset, start), end)``
   (all of them when the offsets could not be read: no proof of consumption);
3. offsets could not be read: kept (an unreadable store never causes deletion);
4. age < min-age: kept;
5. consumed: **consumed** — removed; else kept.

Thread-safety: pure functions, except :func:`count_records_from` which reads a file nobody
writes (a detached segment).
"""

from __future__ import annotations

import bisect
import enum
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

#: record header: length (4), checksum (4), message id (8), flag (4) - see storage.record
_LENGTH = struct.Struct(">i")
_HEADER_SIZE = 20
_CHUNK = 64 * 1024  # header reads: small records share a read, a big one costs 64 KiB


class ConsumerProgress(Protocol):
    """Where the broker reads groups' committed offsets (ZooKeeper or SQL: the server's)."""

    def committed(
        self, topic: str, partition: int, groups: tuple[str, ...] | None
    ) -> dict[str, int | None]:
        """group -> committed offset of ``topic``/``partition`` on this broker (None: none).

        ``groups`` None means every group that committed offsets for ``topic``.  Raises
        (anything) when the store cannot be read."""
        ...


class Verdict(enum.Enum):
    KEEP = "keep"
    CONSUMED = "consumed"  # every named group passed it and it is old enough
    CAPPED = "capped"  # older than maxRetention: removed whatever the groups did


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    #: capped only: group -> the first byte of the segment that group had not consumed
    unconsumed_from: Mapping[str, int]


KEEP = Decision(Verdict.KEEP, {})


def is_consumed(end: int, offsets: Mapping[str, int | None]) -> bool:
    """Every group's committed offset is at or past ``end`` (and there is a group)."""
    return bool(offsets) and all(o is not None and o >= end for o in offsets.values())


def unconsumed_from(start: int, end: int, offsets: Mapping[str, int | None]) -> dict[str, int]:
    """group -> first unconsumed byte in ``[start, end)`` for each group that had not passed
    ``end`` (no offset: the whole segment)."""
    out: dict[str, int] = {}
    for group, off in offsets.items():
        if off is None or off < end:
            out[group] = start if off is None else max(off, start)
    return out


def decide(
    *,
    start: int,
    end: int,
    mutable: bool,
    age_s: float,
    min_age_s: float,
    cap_s: float,
    offsets: Mapping[str, int | None] | None,
    named: tuple[str, ...] | None,
) -> Decision:
    """The verdict for one segment (see the module doc).  ``offsets`` None: the store could
    not be read; ``named`` the policy's groups (None = ``*``)."""
    if mutable:
        return KEEP
    if cap_s > 0 and age_s > cap_s:
        if offsets is None:  # no proof any named group consumed it
            return Decision(Verdict.CAPPED, dict.fromkeys(named or (), start))
        return Decision(Verdict.CAPPED, unconsumed_from(start, end, offsets))
    if offsets is None or age_s < min_age_s:
        return KEEP
    return Decision(Verdict.CONSUMED, {}) if is_consumed(end, offsets) else KEEP


def count_records_from(path: str, start: int, firsts: Sequence[int], size: int) -> list[int]:
    """For each log offset in ``firsts``: how many records of the segment file ``path`` (log
    offset ``start``, ``size`` bytes written) begin at or after it.  One pass over the record
    headers whatever the number of offsets; stops at a torn or zero header."""
    order = sorted(firsts)
    hist = [0] * (len(order) + 1)  # hist[k]: records at or after exactly the first k offsets
    pos = 0
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        buf = b""
        buf_at = 0
        while pos + _HEADER_SIZE <= size:
            if pos + 4 > buf_at + len(buf):
                buf_at = pos
                buf = os.pread(fd, min(_CHUNK, size - pos), pos)
                if len(buf) < 4:
                    break
            (length,) = _LENGTH.unpack_from(buf, pos - buf_at)
            stop = pos + _HEADER_SIZE + length
            if length < 0 or stop > size or (length == 0 and _zero_header(fd, pos)):
                break
            hist[bisect.bisect_right(order, start + pos)] += 1
            pos = stop
    at_or_after = {}
    for k, first in enumerate(order):
        at_or_after[first] = sum(hist[k + 1 :])
    return [at_or_after[first] for first in firsts]


def _zero_header(fd: int, pos: int) -> bool:
    return os.pread(fd, _HEADER_SIZE, pos) == bytes(_HEADER_SIZE)
