"""Consumer lag as the broker sees it: per (group, topic, partition), where the group last fetched.

Every ``get`` names its group and its offset, so the broker learns each group's position from
the requests alone - any client, MetaQ's included, and no offset store.  :meth:`LagTracker.record`
runs on the get path (a dict lookup, a move to the end of an ordered dict, two stores); the
lag itself is computed only when someone asks (``stats lag``, ``/metrics``, the dashboard):

| field          | meaning                                                                 |
|----------------|-------------------------------------------------------------------------|
| fetch_offset   | the offset of the group's latest ``get`` on the partition               |
| max_offset     | the partition's durable end (what a ``get`` can return)                 |
| lag_bytes      | ``max_offset - max(fetch_offset, min_offset)`` (0 when caught up)       |
| lag_seconds    | age of the first message the group has not fetched: now minus the time  |
|                | in that record's id (ids carry their epoch milliseconds); 0 when caught |
|                | up; unknown (None) when the offset is not a record's start              |
| idle_seconds   | seconds since the group's latest ``get`` on the partition                |

This is *fetch* lag: a group that fetched a message but has not processed or committed it yet
counts it as consumed.  ``pymetaq cluster`` shows *committed-offset* lag from the offset store
instead (docs/monitoring.md compares the two).

Group names are chosen by clients, so the map is bounded: at most ``max_entries`` entries
(``maxLagEntries``), the longest-idle one forgotten to make room (counted in ``evicted``); an
entry idle for ``IDLE_EXPIRY_S`` is dropped when the lag is next read; a group name longer
than ``MAX_GROUP_CHARS`` is not tracked (counted in ``refused``).  Entries of partitions that
no longer exist are dropped when read.

Thread-safety: not thread-safe; owned by the broker's event-loop thread.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pymetaq.storage.ids import id_time_ms
from pymetaq.storage.record import HEADER, HEADER_SIZE

if TYPE_CHECKING:
    from pymetaq.storage import PartitionLog

#: an entry whose group has not fetched for this long is forgotten (a day)
IDLE_EXPIRY_S = 24 * 3600.0
#: longer group names are not tracked (MetaQ's ZooKeeper paths carry them; 255 is plenty)
MAX_GROUP_CHARS = 255
#: a record time this far in the future means the offset is not a record start
FUTURE_SLACK_S = 60.0

Key = tuple[str, str, int]  # (group, topic, partition)
LogLookup = Callable[[str, int], "PartitionLog | None"]


@dataclass(frozen=True)
class LagRow:
    """One (group, topic, partition) as it stands now."""

    group: str
    topic: str
    partition: int
    fetch_offset: int
    min_offset: int
    max_offset: int
    lag_bytes: int
    lag_seconds: float | None
    idle_seconds: float
    last_fetch: float  # epoch seconds of the latest get
    fetches: int


class _Entry:
    __slots__ = ("fetches", "offset", "when")

    def __init__(self, offset: int, when: float) -> None:
        self.offset = offset
        self.when = when
        self.fetches = 1


class LagTracker:
    """The bounded map of group positions (see the module doc)."""

    def __init__(
        self,
        max_entries: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        idle_expiry_s: float = IDLE_EXPIRY_S,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self.idle_expiry_s = idle_expiry_s
        self._clock = clock
        self._wall = wall
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self.evicted = 0
        self.refused = 0

    def __len__(self) -> int:
        return len(self._entries)

    # -- the get path ------------------------------------------------------------------------
    def record(self, group: str, topic: str, partition: int, offset: int) -> None:
        """A ``get`` from ``group`` at ``offset`` on an existing partition."""
        key = (group, topic, partition)
        entries = self._entries
        entry = entries.get(key)
        now = self._clock()
        if entry is not None:
            entry.offset = offset
            entry.when = now
            entry.fetches += 1
            entries.move_to_end(key)
            return
        if len(group) > MAX_GROUP_CHARS:
            self.refused += 1
            return
        if len(entries) >= self.max_entries:
            entries.popitem(last=False)  # the longest-idle position
            self.evicted += 1
        entries[key] = _Entry(offset, now)

    # -- readers -----------------------------------------------------------------------------
    def expire(self) -> None:
        """Drop entries idle for longer than ``idle_expiry_s`` (the oldest are first)."""
        limit = self._clock() - self.idle_expiry_s
        entries = self._entries
        while entries:
            key, entry = next(iter(entries.items()))
            if entry.when >= limit:
                break
            del entries[key]

    def forget(self, topic: str, partition: int | None = None) -> None:
        """Drop every entry of ``topic`` (or of one of its partitions)."""
        for key in [k for k in self._entries if k[1] == topic and partition in (None, k[2])]:
            del self._entries[key]

    def rows(self, log_for: LogLookup) -> list[LagRow]:
        """Every tracked position with its lag now, sorted by (group, topic, partition)."""
        self.expire()
        now, wall = self._clock(), self._wall()
        out: list[LagRow] = []
        gone: list[Key] = []
        record_times: dict[tuple[str, int, int], float | None] = {}
        for key, entry in self._entries.items():
            group, topic, partition = key
            plog = log_for(topic, partition)
            if plog is None:
                gone.append(key)
                continue
            lo, hi = plog.min_offset, plog.max_offset
            pos = max(entry.offset, lo)
            lag_bytes = max(0, hi - pos)
            lag_s: float | None = 0.0
            if lag_bytes:
                cached = (topic, partition, pos)
                if cached not in record_times:
                    record_times[cached] = record_time(plog, pos, hi, wall)
                born = record_times[cached]
                lag_s = None if born is None else max(0.0, wall - born)
            idle = max(0.0, now - entry.when)
            out.append(
                LagRow(
                    group,
                    topic,
                    partition,
                    entry.offset,
                    lo,
                    hi,
                    lag_bytes,
                    lag_s,
                    idle,
                    wall - idle,
                    entry.fetches,
                )
            )
        for key in gone:
            del self._entries[key]
        out.sort(key=lambda r: (r.group, r.topic, r.partition))
        return out


def record_time(plog: PartitionLog, offset: int, end: int, now: float) -> float | None:
    """Epoch seconds in the id of the record starting at ``offset``, or None when ``offset``
    does not look like a record start (a hostile or stale offset) or cannot be read."""
    try:
        res = plog.read(offset, HEADER_SIZE)
    except Exception:
        return None
    region = res.region
    if region is None:
        return None
    try:
        raw = region.read_bytes()
    except OSError:
        return None
    finally:
        region.close()
    if len(raw) < HEADER_SIZE:
        return None
    length, _crc, msg_id, _flag = HEADER.unpack(raw)
    if length < 0 or msg_id <= 0 or offset + HEADER_SIZE + length > end:
        return None
    born = id_time_ms(msg_id) / 1000.0
    if born > now + FUTURE_SLACK_S:
        return None
    return born
