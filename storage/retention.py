"""Retention (MetaQ's deletePolicy): pure eligibility predicates and the actions on files.

Eligible (Kafka style, pure): a segment that is *immutable* (not the active one) and whose file
mtime is older than the policy's keep time: ``now - mtime > keep_seconds``.  Only a prefix of
the log is removed (the first non-eligible segment stops the walk), so the log stays contiguous
and ``min_offset`` moves up to the first kept segment.

``consumed,<groups>[,min-age]`` (:mod:`pymetaq.storage.consumed`): a closed segment goes once
every named group's committed offset is past its end and it is min-age old, or, as the last
resort, once it is older than the topic's ``maxRetention``; a segment the cap removes that a
group had not consumed is logged (WARNING) and carried in :attr:`RetentionAction.lost`.  The
committed offsets are read once per partition and run from a :class:`ConsumerProgress`, before
the log's lock is taken (a slow store never stalls appends); when they cannot be read (or there
is no source) nothing is deleted for consumption.

Actions: ``delete`` (and ``consumed``) unlinks; ``archive`` renames to ``<seg>.meta.arc``;
``archive,N,true`` compresses to ``<seg>.meta.lz4`` (see :mod:`pymetaq.storage.archive`).  A reader holding a
:class:`~pymetaq.storage.segment.FileRegion` keeps its bytes (private descriptor).

Thread-safety: predicates are pure; :func:`apply_retention` detaches segments under the log's
lock, then works on files nobody else references.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import threading
import time
from dataclasses import dataclass

from pymetaq.storage.archive import compress_segment
from pymetaq.storage.config import DeletePolicy, RetentionKind, parse_delete_policy
from pymetaq.storage.consumed import (
    KEEP,
    ConsumerProgress,
    Decision,
    Verdict,
    count_records_from,
    decide,
)
from pymetaq.storage.disk import Disk
from pymetaq.storage.log import PartitionLog
from pymetaq.storage.segment import ARCHIVE_SUFFIX, Segment, segment_path

log = logging.getLogger(__name__)


class RetentionActionKind(enum.Enum):
    DELETED = "deleted"
    ARCHIVED = "archived"
    COMPRESSED = "compressed"


@dataclass(frozen=True)
class RetentionAction:
    topic: str
    partition: int
    start: int  # the segment's start offset
    size: int  # bytes removed from the live log
    kind: RetentionActionKind
    path: str  # the resulting file (archive) or the deleted one
    #: ``consumed`` policies: why it went (``consumed`` or ``capped``), else empty
    reason: str = ""
    #: capped segments: (group, bytes, messages) the group had not consumed
    lost: tuple[tuple[str, int, int], ...] = ()

    def describe(self) -> str:
        """One line for a person (what the broker logs)."""
        why = {
            "consumed": " (every named group consumed it)",
            "capped": " (older than maxRetention)",
        }.get(self.reason, "")
        line = (
            f"{self.topic}-{self.partition}: {self.kind.value} the segment at offset "
            f"{self.start} ({self.size} bytes){why}: {self.path}"
        )
        for group, nbytes, msgs in self.lost:
            line += f"; group {group} had not consumed {msgs} message(s), {nbytes} bytes of it"
        return line


def is_expired(mtime: float, now: float, keep_seconds: float) -> bool:
    """MetaQ's time predicate: ``now - mtime > keep``."""
    return now - mtime > keep_seconds


def is_eligible(*, mutable: bool, mtime: float, now: float, policy: DeletePolicy) -> bool:
    """A segment may be removed: immutable and expired.  The active segment never is."""
    return not mutable and is_expired(mtime, now, policy.keep_seconds)


def apply_retention(
    plog: PartitionLog,
    policy: DeletePolicy | str,
    now: float,
    disk: Disk,
    progress: ConsumerProgress | None = None,
) -> list[RetentionAction]:
    """Remove the eligible prefix of ``plog``'s segments per ``policy``; return what was done.

    ``progress``: where a ``consumed`` policy reads committed offsets (None: no source, so
    only ``maxRetention`` removes anything)."""
    if isinstance(policy, str):
        policy = parse_delete_policy(policy)
    pol = policy
    if pol.kind is RetentionKind.CONSUMED:
        return _apply_consumed(plog, pol, now, disk, progress)

    def keep(seg: Segment) -> bool:
        try:
            mtime = os.stat(seg.path).st_mtime
        except FileNotFoundError:
            return True
        return not is_eligible(mutable=seg.mutable, mtime=mtime, now=now, policy=pol)

    actions = []
    for seg in plog.detach_prefix(keep):
        seg.file.close()
        actions.append(_act(plog, seg, pol, disk))
        log.info("retention: %s", actions[-1].describe())
    return actions


def _read_offsets(
    plog: PartitionLog, policy: DeletePolicy, progress: ConsumerProgress | None
) -> dict[str, int | None] | None:
    """The groups' committed offsets for ``plog``, or None (logged) when they cannot be read."""
    if progress is None:
        log.warning(
            "retention: %s: deletePolicy=consumed but no offset store is configured: "
            "keeping every segment (only maxRetention removes data)",
            plog.name,
        )
        return None
    try:
        offsets = progress.committed(plog.topic, plog.partition, policy.groups)
    except Exception as exc:
        if _unreadable.report(plog.name, str(exc)):
            log.error(
                "retention: %s: cannot read the consumers' offsets (%s): keeping the data "
                "(only maxRetention removes any; repeated at most every %d s)",
                plog.name,
                exc,
                UNREADABLE_LOG_INTERVAL_S,
            )
        return None
    if _unreadable.clear(plog.name):
        log.info("retention: %s: the consumers' offsets can be read again", plog.name)
    return offsets


UNREADABLE_LOG_INTERVAL_S = 600


class _Unreadable:
    """Which logs could not read their offsets, so a retention schedule of seconds does not
    repeat the same ERROR every run (a new reason, or 10 minutes, logs it again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[str, float]] = {}

    def report(self, name: str, why: str) -> bool:
        now = time.monotonic()
        with self._lock:
            prev = self._last.get(name)
            if prev is not None and prev[0] == why and now - prev[1] < UNREADABLE_LOG_INTERVAL_S:
                return False
            self._last[name] = (why, now)
            return True

    def clear(self, name: str) -> bool:
        with self._lock:
            return self._last.pop(name, None) is not None


_unreadable = _Unreadable()


def _apply_consumed(
    plog: PartitionLog,
    policy: DeletePolicy,
    now: float,
    disk: Disk,
    progress: ConsumerProgress | None,
) -> list[RetentionAction]:
    segments = plog.segments
    if len(segments) < 2:
        return []  # only the active segment: nothing to ask the offset store about
    try:
        oldest = now - os.stat(segments[0].path).st_mtime
    except FileNotFoundError:
        return []
    cap = plog.config.max_retention_seconds
    if oldest < policy.keep_seconds and not (cap > 0 and oldest > cap):
        return []  # the first segment (only a prefix goes) is too young either way
    # read before detach_prefix, which holds the log's lock: a slow store never stalls appends
    offsets = _read_offsets(plog, policy, progress)
    decisions: dict[int, Decision] = {}

    def keep(seg: Segment) -> bool:
        try:
            mtime = os.stat(seg.path).st_mtime
        except FileNotFoundError:
            return True
        d = decide(
            start=seg.start,
            end=seg.end,
            mutable=seg.mutable,
            age_s=now - mtime,
            min_age_s=policy.keep_seconds,
            cap_s=cap,
            offsets=offsets,
            named=policy.groups,
        )
        decisions[seg.start] = d
        return d.verdict is Verdict.KEEP

    actions = []
    for seg in plog.detach_prefix(keep):
        seg.file.close()
        d = decisions.get(seg.start, KEEP)
        froms = sorted(d.unconsumed_from.items())
        counts = count_records_from(seg.path, seg.start, [f for _, f in froms], seg.written)
        lost = tuple((g, seg.end - f, n) for (g, f), n in zip(froms, counts))
        action = _act(plog, seg, policy, disk)
        action = dataclasses.replace(action, reason=d.verdict.value, lost=lost)
        actions.append(action)
        log.log(logging.WARNING if lost else logging.INFO, "retention: %s", action.describe())
    return actions


def _act(plog: PartitionLog, seg: Segment, policy: DeletePolicy, disk: Disk) -> RetentionAction:
    base = (plog.topic, plog.partition, seg.start, seg.written)
    if policy.kind in (RetentionKind.DELETE, RetentionKind.CONSUMED):
        disk.unlink(seg.path)
        disk.sync_dir(plog.directory)
        return RetentionAction(*base, RetentionActionKind.DELETED, seg.path)
    if policy.compress:
        dst = compress_segment(disk, seg.path, plog.directory, seg.start)
        return RetentionAction(*base, RetentionActionKind.COMPRESSED, dst)
    dst = segment_path(plog.directory, seg.start, ARCHIVE_SUFFIX)
    disk.rename(seg.path, dst)
    disk.sync_dir(plog.directory)
    return RetentionAction(*base, RetentionActionKind.ARCHIVED, dst)
