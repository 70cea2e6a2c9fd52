"""Retention (MetaQ's deletePolicy): pure eligibility predicates and the actions on files.

Eligible (Kafka style, pure): a segment that is *immutable* (not the active one) and whose file
mtime is older than the policy's keep time: ``now - mtime > keep_seconds``.  Only a prefix of
the log is removed (the first non-eligible segment stops the walk), so the log stays contiguous
and ``min_offset`` moves up to the first kept segment.

Actions: ``delete`` unlinks; ``archive`` renames to ``<seg>.meta.arc``; ``archive,N,true``
compresses to ``<seg>.meta.lz4`` (see :mod:`pymetaq.storage.archive`).  A reader holding a
:class:`~pymetaq.storage.segment.FileRegion` keeps its bytes (private descriptor).

Thread-safety: predicates are pure; :func:`apply_retention` detaches segments under the log's
lock, then works on files nobody else references.
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass

from pymetaq.storage.archive import compress_segment
from pymetaq.storage.config import DeletePolicy, RetentionKind, parse_delete_policy
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

    def describe(self) -> str:
        """One line for a person (what the broker logs)."""
        return (
            f"{self.topic}-{self.partition}: {self.kind.value} the segment at offset "
            f"{self.start} ({self.size} bytes): {self.path}"
        )


def is_expired(mtime: float, now: float, keep_seconds: float) -> bool:
    """MetaQ's time predicate: ``now - mtime > keep``."""
    return now - mtime > keep_seconds


def is_eligible(*, mutable: bool, mtime: float, now: float, policy: DeletePolicy) -> bool:
    """A segment may be removed: immutable and expired.  The active segment never is."""
    return not mutable and is_expired(mtime, now, policy.keep_seconds)


def apply_retention(
    plog: PartitionLog, policy: DeletePolicy | str, now: float, disk: Disk
) -> list[RetentionAction]:
    """Remove the eligible prefix of ``plog``'s segments per ``policy``; return what was done."""
    if isinstance(policy, str):
        policy = parse_delete_policy(policy)
    pol = policy

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


def _act(plog: PartitionLog, seg: Segment, policy: DeletePolicy, disk: Disk) -> RetentionAction:
    base = (plog.topic, plog.partition, seg.start, seg.written)
    if policy.kind is RetentionKind.DELETE:
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
