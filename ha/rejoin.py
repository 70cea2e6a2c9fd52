"""A replaced master rejoining as its successor's slave (pymetaq, beyond MetaQ): the pure parts.

After an automatic failover (:mod:`pymetaq.ha.failover`) the old master may come back (woken
from a hang, or restarted).  It must not write, and it should become the new master's
synchronous slave again so the pair is a pair.  Its log and the new master's agree up to the
point where the new master stopped receiving its syncs; past that point the old master may
hold records it wrote but never got acknowledged (the slave never confirmed them, so the
producer was never told they were stored), and the new master has its own.

- **The divergence point.**  When a gregor slave is promoted, it records each partition's log
  end at that moment (on its event loop, where syncs are applied: nothing slips in between)
  in ZooKeeper, ``brokers/ids/<id>/epochs/<epoch>`` (persistent, JSON ``{"<topic>-<part>":
  <end>, ...}``), before it registers as the master.  That is exactly what it holds of its
  old master's log (Kafka's leader-epoch end offset).  The old master cuts each partition
  there (:func:`cut_point`): everything past it was never acknowledged by the pair.  A
  partition the new master did not have at all is cut to its start.  Before cutting, the
  record ending at the cut is compared with the new master's (:func:`record_ending_at`, then
  a ``get`` there): a log that does not line up (a gregor slave started next to a master that
  already had data holds the same messages at other offsets) is not cut into pieces; that
  partition cannot rejoin and says so.
- **The request to follow.**  The old master, cut, registers ``brokers/ids/<id>/gregor``
  (ephemeral, JSON :class:`GregorNode`: its address, replica id and each partition's end).
  The new master sends it what it lacks from those ends on (the same bytes at the same
  offsets: ``bsync``), then every new batch, and acknowledges puts only once the slave
  confirmed them; each ``bsync`` carries the batch's offset (its 8-token form: the slave
  stores it only where its log ends, 409 otherwise) and its reply must name that offset
  (:mod:`pymetaq.ha.sync`, ``aligned``).  Once the slave holds everything, the new master names it in the epoch node
  (``insync``), and only then may the slave be promoted in turn (:class:`~pymetaq.ha.failover.Promoter`).

Thread-safety: pure functions, and blocking reads of a :class:`PartitionLog` (safe alongside
its appends).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from pymetaq.client.protocol.zk import ZkPaths
from pymetaq.storage import PartitionLog
from pymetaq.storage.record import HEADER_SIZE
from pymetaq.storage.results import ReadStatus

_LEN = struct.Struct(">i")
#: bytes read at a time while looking for the record that ends at a cut
SCAN_CHUNK = 1 << 20

Ends = dict[tuple[str, int], int]


def ends_path(paths: ZkPaths, broker_id: int, epoch: int) -> str:
    """``brokers/ids/<id>/epochs/<epoch>``: the promoted master's log ends at its promotion."""
    return f"{paths.broker(broker_id)}/epochs/{epoch}"


def gregor_path(paths: ZkPaths, broker_id: int) -> str:
    """``brokers/ids/<id>/gregor``: a replaced master asking to follow the current one."""
    return f"{paths.broker(broker_id)}/gregor"


def encode_ends(ends: Ends) -> dict[str, int]:
    return {f"{t}-{p}": n for (t, p), n in sorted(ends.items())}


def decode_ends(doc: object) -> Ends:
    """ValueError unless ``doc`` is ``{"<topic>-<partition>": <offset>, ...}``."""
    if not isinstance(doc, dict):
        raise ValueError(f"not a map of log ends: {doc!r:.200}")
    out: Ends = {}
    for key, end in doc.items():
        topic, sep, part = str(key).rpartition("-")
        if not sep or not topic or not part.isdigit() or not isinstance(end, int) or end < 0:
            raise ValueError(f"not a log end: {key!r}: {end!r}")
        out[(topic, int(part))] = end
    return out


def ends_of(logs: list[PartitionLog]) -> Ends:
    """Each log's written end (call it on the loop that appends, so nothing moves meanwhile)."""
    return {(p.topic, p.partition): p.write_offset for p in logs}


@dataclass(frozen=True)
class GregorNode:
    """The value of ``brokers/ids/<id>/gregor``."""

    url: str  # meta://host:port
    replica: str
    ends: Ends

    def encode(self) -> bytes:
        doc = {"url": self.url, "replica": self.replica, "ends": encode_ends(self.ends)}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> GregorNode:
        try:
            doc = json.loads(raw)
            return cls(str(doc["url"]), str(doc["replica"]), decode_ends(doc["ends"]))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"not a gregor node value: {raw[:200]!r}") from e


def cut_point(plog: PartitionLog, ends: Ends) -> int:
    """Where a replaced master cuts ``plog``: the new master's end at its promotion (never
    past this log's end); the log's start if the new master did not have the partition."""
    end = ends.get((plog.topic, plog.partition))
    if end is None:
        return plog.min_offset
    return max(plog.min_offset, min(end, plog.write_offset))


def _read(plog: PartitionLog, offset: int, size: int) -> bytes:
    result = plog.read(offset, size)
    if result.status is not ReadStatus.OK or result.region is None:
        return b""
    with result.region as region:
        return region.read_bytes()


def record_ending_at(plog: PartitionLog, cut: int) -> tuple[int, bytes] | None:
    """(offset, bytes) of the record of ``plog`` that ends exactly at ``cut``; None when
    ``cut`` is the log's start or not a record boundary (the segment holding the byte before
    ``cut`` is walked from its start: at most one segment read)."""
    if cut <= plog.min_offset:
        return None
    seg = next((s for s in reversed(plog.segments) if s.start < cut), None)
    if seg is None:
        return None
    pos, base, buf = seg.start, seg.start, b""  # buf holds the bytes [base, base + len)
    while pos < cut:
        if pos + HEADER_SIZE > base + len(buf):
            buf, base = buf[pos - base :], pos
            more = _read(plog, base + len(buf), SCAN_CHUNK)
            if not more:
                return None
            buf += more
            continue
        size = HEADER_SIZE + _LEN.unpack_from(buf, pos - base)[0]
        if size < HEADER_SIZE:
            return None
        if pos + size == cut:
            while base + len(buf) < cut:
                more = _read(plog, base + len(buf), cut - base - len(buf))
                if not more:
                    return None
                buf += more
            return pos, bytes(buf[pos - base : cut - base])
        pos += size
    return None


def whole_records(buf: bytes | bytearray | memoryview) -> int:
    """The length of the longest prefix of ``buf`` made of complete records."""
    pos, n = 0, len(buf)
    while pos + HEADER_SIZE <= n:
        size = HEADER_SIZE + _LEN.unpack_from(buf, pos)[0]
        if size < HEADER_SIZE or pos + size > n:
            break
        pos += size
    return pos
