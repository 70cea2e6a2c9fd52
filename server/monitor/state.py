"""What the dispatcher records for monitoring on the request paths, and the ``stats lag`` item.

The put path records nothing here (puts are counted by storage's own per-log counters and read
at scrape time); it only asks :attr:`Monitor.closed` whether a partition is closed, and only
when some partition is.  The get path records the group's position
(:meth:`~pymetaq.server.monitor.lag.LagTracker.record`) and the bytes each data reply carries
(:meth:`Monitor.record_sent`: one dict lookup and two additions).

``stats lag`` (pymetaq extension): one line per tracked (group, topic, partition), sorted::

    <group> <topic> part <p> fetch_offset <n> max_offset <n> lag_bytes <n> lag_seconds <s> idle_seconds <s>

``lag_seconds`` is ``unknown`` when the group's offset is not the start of a record.

Thread-safety: owned by the broker's event-loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pymetaq.server.config import SystemConfig
from pymetaq.server.monitor.lag import LagRow, LagTracker
from pymetaq.server.monitor.ops import ClosedPartitions

if TYPE_CHECKING:
    from pymetaq.storage import PartitionLog

LAG_HELP = "Returns each consumer group's fetch position and lag per partition (pymetaq)."


class Monitor:
    """Lag positions, traffic out per partition, closed partitions, protocol errors."""

    def __init__(self, system: SystemConfig) -> None:
        self.lag = LagTracker(system.max_lag_entries)
        self.closed = ClosedPartitions()
        #: (topic, partition) -> [bytes sent by get replies, get replies carrying data]
        self.sent: dict[tuple[str, int], list[int]] = {}
        self.protocol_errors = 0

    def record_sent(self, topic: str, partition: int, nbytes: int) -> None:
        counts = self.sent.get((topic, partition))
        if counts is None:
            counts = self.sent[(topic, partition)] = [0, 0]
        counts[0] += nbytes
        counts[1] += 1

    def lag_rows(self, logs: list[PartitionLog]) -> list[LagRow]:
        by_key = {(p.topic, p.partition): p for p in logs}
        return self.lag.rows(lambda t, p: by_key.get((t, p)))

    def lag_lines(self, logs: list[PartitionLog]) -> list[str]:
        return [lag_line(r) for r in self.lag_rows(logs)]


def lag_line(r: LagRow) -> str:
    lag_s = "unknown" if r.lag_seconds is None else f"{r.lag_seconds:.3f}"
    return (
        f"{r.group} {r.topic} part {r.partition} fetch_offset {r.fetch_offset} "
        f"max_offset {r.max_offset} lag_bytes {r.lag_bytes} lag_seconds {lag_s} "
        f"idle_seconds {r.idle_seconds:.3f}"
    )
