"""MetaQ's ``recoverOffset``: consumer offsets in ZooKeeper mapped onto this broker's log by
message id, before it registers as the master of its brokerId.

A consumer group's position in a partition is stored as ``consumers/<group>/offsets/<topic>/
<brokerId>-<partition>`` = ``<msgId>-<offset>`` (the id of the last message it consumed and
the byte position it fetches next).  A broker that takes over as the master (a gregor slave
promoted by :mod:`pymetaq.ha.failover`, or a samsa master started with ``recoverOffset=true``
after a manual failover) may hold the same messages at other byte positions, so each
position is recomputed from the msgId: the new offset is where the first record with an id
greater than ``msgId`` starts in the local log (its end when there is none), and the stored
msgId becomes the id of the record just before that offset (``-1`` at the log's start).  A
group whose value has no msgId (``-1``, or a pre-1.4 value) is left alone (MetaQ skips them
too); a value that already names the right position is not rewritten.

The search is by segment first (each segment's first id, binary search: ids grow along a log,
the master's id worker issues them in time order), then a scan of the one segment:
``O(log segments)`` small reads plus at most one segment read per group and partition.

Thread-safety: blocking calls (ZooKeeper and file reads) for one thread, before the broker
registers; storage reads are safe alongside the broker's appends.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any

from pymetaq.client.protocol.zk import ZkPaths, decode_offset, encode_offset
from pymetaq.storage import PartitionLog
from pymetaq.storage.record import HEADER_SIZE
from pymetaq.storage.results import ReadStatus

log = logging.getLogger("pymetaq.ha")

_HEAD = struct.Struct(">iiqi")  # length, crc, msgId, flag
#: bytes read at a time while scanning a segment
SCAN_CHUNK = 1 << 20


@dataclass(frozen=True)
class Recovered:
    """One offset node rewritten: what it held and what it holds now."""

    path: str
    old: tuple[int, int]  # (msgId, offset)
    new: tuple[int, int]


def _read(plog: PartitionLog, offset: int, size: int) -> bytes:
    result = plog.read(offset, size)
    if result.status is not ReadStatus.OK or result.region is None:
        return b""
    try:
        return result.region.read_bytes()
    finally:
        result.region.close()


def _first_id(plog: PartitionLog, start: int) -> int | None:
    head = _read(plog, start, HEADER_SIZE)
    return _HEAD.unpack_from(head)[2] if len(head) == HEADER_SIZE else None


def position_after(plog: PartitionLog, msg_id: int) -> tuple[int, int]:
    """(offset of the first record whose id is greater than ``msg_id`` - the log's end if
    none, id of the record before it - -1 if none): where a group that consumed ``msg_id``
    fetches next in this log."""
    starts = [seg.start for seg in plog.segments]
    lo, hi = 0, len(starts) - 1
    while lo < hi:  # the last segment whose first id is <= msg_id
        mid = (lo + hi + 1) // 2
        first = _first_id(plog, starts[mid])
        if first is not None and first <= msg_id:
            lo = mid
        else:
            hi = mid - 1
    pos, end, before = starts[lo], plog.max_offset, -1
    while pos < end:
        data = _read(plog, pos, SCAN_CHUNK)
        at = 0
        while at + HEADER_SIZE <= len(data):
            length, _crc, rid, _flag = _HEAD.unpack_from(data, at)
            if at + HEADER_SIZE + length > len(data):
                break
            if rid > msg_id:
                return pos + at, before
            before = rid
            at += HEADER_SIZE + length
        if at == 0:
            break  # nothing readable here (a record larger than a read, or a gap)
        pos += at
    return end, before


def recover_offsets(
    client: Any, paths: ZkPaths, broker_id: int, logs: list[PartitionLog]
) -> list[Recovered]:
    """Rewrite every consumer group's offset node of ``logs`` (see the module doc)."""
    from kazoo.exceptions import BadVersionError, NoNodeError

    try:
        groups = client.get_children(paths.consumers)
    except NoNodeError:
        return []
    done: list[Recovered] = []
    for plog in logs:
        node = f"{broker_id}-{plog.partition}"
        for group in sorted(groups):
            path = paths.offset(group, plog.topic, node)
            try:
                raw, stat = client.get(path)
                msg_id, offset = decode_offset(raw)
            except NoNodeError:
                continue
            except ValueError:
                log.warning(
                    "recoverOffset: %s holds %r, not <msgId>-<offset>: left alone", path, raw
                )
                continue
            if msg_id <= 0:
                continue
            new_offset, new_id = position_after(plog, msg_id)
            if (new_id, new_offset) == (msg_id, offset):
                continue
            try:
                client.set(path, encode_offset(new_id, new_offset), version=stat.version)
            except BadVersionError:
                log.info("recoverOffset: %s changed meanwhile: left as the group wrote it", path)
                continue
            done.append(Recovered(path, (msg_id, offset), (new_id, new_offset)))
            log.info("recoverOffset: %s %d-%d -> %d-%d", path, msg_id, offset, new_id, new_offset)
    return done
