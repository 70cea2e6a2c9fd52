"""The offset model of format ``pymetaq`` (pure Python: no PySpark import).

An offset is a partition's **byte position** (MetaQ's): where the next message to read starts.
A set of offsets is ``{topic: {"<brokerId>-<partition>": offset}}``; the streaming source's
checkpointed offsets are exactly that, in canonical JSON (:func:`canonical`: topics and keys
sorted, so two equal offsets are equal strings and Spark never sees a spurious new batch).
In ``startingOffsets``/``endingOffsets`` JSON, ``-2`` means earliest and ``-1`` latest.

Also here, as pure functions: resolving an offsets option against the partitions' bounds, the
data-loss decision (an offset below the first stored one: raise or skip), the admission split
(a per-trigger budget spread over partitions in proportion to their backlog) and the header
walk that turns a byte budget into a record boundary.

Thread-safety: pure functions.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

from pymetaq.client.errors import MetaClientError
from pymetaq.client.types import TopicPartition
from pymetaq.spark.options import SparkOptionError, check_key

EARLIEST = -2
LATEST = -1
Offsets = dict[str, dict[str, int]]
#: a partition's bounds: (first stored offset, end of the log)
Bounds = Mapping[TopicPartition, tuple[int, int]]
_LEN = struct.Struct(">i")
_HEADER_SIZE = 20


class DataLoss(MetaClientError):
    """Offsets a query asked for are no longer stored (retention deleted their segment, or the
    partition is gone) and ``failOnDataLoss`` is true."""


def parse_offsets_option(raw: str, name: str) -> str | Offsets:
    """``"earliest"`` / ``"latest"`` / the JSON form, checked."""
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        doc = json.loads(text)
    except ValueError:
        raise SparkOptionError(
            f"option {name!r} must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0-0": 1234}}}}, not {raw!r}'
        ) from None
    return offsets_from_doc(doc, f"option {name!r}")


def offsets_from_doc(doc: object, what: str) -> Offsets:
    if not isinstance(doc, dict):
        raise SparkOptionError(f'{what} must be a JSON object {{"topic": {{"0-0": offset}}}}')
    out: Offsets = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise SparkOptionError(f"{what}: topic {topic!r} needs an object of offsets")
        for key, value in parts.items():
            check_key(key, what)
            if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
                raise SparkOptionError(f"{what}: {topic} {key}: bad offset {value!r}")
            out.setdefault(str(topic), {})[key] = value
    return out


def canonical(offsets: Mapping[TopicPartition, int]) -> Offsets:
    """``{topic: {key: offset}}`` with topics and keys sorted (partition order)."""
    out: Offsets = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[tp.key] = offsets[tp]
    return out


def to_json(offsets: Mapping[TopicPartition, int]) -> str:
    return json.dumps(canonical(offsets), separators=(",", ":"))


def from_offsets(doc: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {
        TopicPartition.from_key(topic, key): int(off)
        for topic, parts in doc.items()
        for key, off in parts.items()
    }


def resolve(spec: str | Offsets, bounds: Bounds, *, what: str) -> dict[TopicPartition, int]:
    """The offset of every partition in ``bounds`` under ``spec``: earliest/latest are the
    bounds; a JSON spec must name only known partitions and partitions it does not name start
    at their earliest offset (Kafka's rule). Explicit offsets are taken as given (the reader
    checks them against the bounds: :func:`check_start`)."""
    out = {}
    named = from_offsets(spec) if isinstance(spec, dict) else {}
    unknown = sorted(str(tp) for tp in named if tp not in bounds)
    if unknown:
        raise SparkOptionError(f"{what} names partitions that are not read: {', '.join(unknown)}")
    for tp, (first, end) in bounds.items():
        wanted = named.get(tp, EARLIEST) if isinstance(spec, dict) else spec
        if wanted in ("earliest", EARLIEST):
            out[tp] = first
        elif wanted in ("latest", LATEST):
            out[tp] = end
        else:
            assert isinstance(wanted, int)
            out[tp] = wanted
    return out


def check_start(tp: TopicPartition, start: int, first: int, end: int, fail: bool) -> int:
    """Where reading ``tp`` from ``start`` really begins. Below the first stored offset
    (retention deleted it): raise :class:`DataLoss` if ``fail`` else the first offset. Beyond
    the end: raise (the offset is not one of this partition's: a recreated log) or the end."""
    if start < first:
        if fail:
            raise DataLoss(
                f"data loss: {tp} offsets {start}..{first} are no longer stored (retention); "
                "set failOnDataLoss=false to skip to the first stored offset"
            )
        return first
    if start > end:
        if fail:
            raise DataLoss(
                f"data loss: {tp} asked from offset {start} but its log ends at {end} "
                "(the partition was deleted or recreated); set failOnDataLoss=false to go on"
            )
        return end
    return start


def split_budget(backlogs: Mapping[TopicPartition, int], budget: int) -> dict[TopicPartition, int]:
    """Spread ``budget`` over partitions in proportion to their backlog (Kafka's
    ``maxOffsetsPerTrigger`` rule); every partition with a backlog gets at least 1 and no
    partition more than its backlog. The shares add up to at most ``max(budget, #partitions)``."""
    total = sum(b for b in backlogs.values() if b > 0)
    if total <= budget:
        return {tp: max(b, 0) for tp, b in backlogs.items()}
    out = {}
    for tp, b in backlogs.items():
        out[tp] = 0 if b <= 0 else min(b, max(1, budget * b // total))
    return out


def walk_records(
    buf: bytes, base: int, *, max_bytes: int, max_records: int, at_least_one: bool = True
) -> tuple[int, int]:
    """Walk the record headers of ``buf`` (read at offset ``base``, starting at a record):
    ``(offset after the last whole record taken, records taken)`` staying within ``max_bytes``
    of log and ``max_records`` records; with ``at_least_one`` always the first whole record
    (a record larger than the budget must still make progress). Only lengths are read (no CRCs)."""
    pos, n, end = 0, 0, len(buf)
    while n < max_records and pos + _HEADER_SIZE <= end:
        (length,) = _LEN.unpack_from(buf, pos)
        size = _HEADER_SIZE + length
        if length < 0 or pos + size > end or ((n or not at_least_one) and pos + size > max_bytes):
            break
        pos += size
        n += 1
    return base + pos, n
