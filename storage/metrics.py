"""What storage measures about itself for monitoring: fsync latency, group-commit batch sizes,
retention runs and what they removed.

Plain counters and fixed-bucket histograms (no dependency: the broker's Prometheus collector
reads them at scrape time, :mod:`pymetaq.server.monitor.metrics`).  A sync records one
observation per fsync round of a log — the cost is per fsync, never per message — and retention
one per run.

| recorded by                 | what                                                           |
|-----------------------------|----------------------------------------------------------------|
| ``PartitionLog._sync_locked`` | seconds spent making the round durable (fdatasync of the     |
|                             | dirty segment(s), plus seal/rename work of a roll); bytes and  |
|                             | messages the round made durable (the group-commit batch)       |
| ``MessageStoreManager.run_retention`` | runs; segments and bytes removed per action          |
|                             | (``deleted``, ``archived``, ``compressed``); per (topic,       |
|                             | group): segments ``maxRetention`` removed that the group had   |
|                             | not consumed, and the bytes and messages it had not consumed   |

Thread-safety: one lock around every update and every snapshot (syncs run on the flusher
thread and, inline, on the broker's loop; retention on its own thread).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass

#: fsync latency bucket bounds, seconds (0.1 ms .. 10 s)
FSYNC_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip
#: bytes made durable by one fsync round (512 B .. 64 MiB)
BATCH_BYTES_BUCKETS: tuple[float, ...] = tuple(float(512 << (2 * i)) for i in range(9))
#: messages made durable by one fsync round (1 .. 65536)
BATCH_MESSAGES_BUCKETS: tuple[float, ...] = tuple(float(1 << (2 * i)) for i in range(9))


@dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative-free bucket counts (``counts[i]`` = observations <= ``bounds[i]`` and above
    the previous bound; the last entry is +Inf), their sum and count."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float
    count: int

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) pairs, +Inf last (Prometheus's form)."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            running += n
            out.append((bound, running))
        return out


class Histogram:
    """Fixed buckets; not locked itself (its owner's lock guards it)."""

    __slots__ = ("_counts", "_sum", "bounds")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, value)] += 1
        self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.bounds, tuple(self._counts), self._sum, sum(self._counts))


@dataclass(frozen=True)
class StoreMetricsSnapshot:
    fsync_seconds: HistogramSnapshot
    batch_bytes: HistogramSnapshot
    batch_messages: HistogramSnapshot
    retention_runs: int
    #: action ("deleted", "archived", "compressed") -> (segments, bytes)
    retention_removed: dict[str, tuple[int, int]]
    #: (topic, group) -> (segments, bytes, messages) the maxRetention cap removed unconsumed
    unconsumed_removed: dict[tuple[str, str], tuple[int, int, int]]


class StoreMetrics:
    """The store-wide measurements (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fsync = Histogram(FSYNC_BUCKETS_S)
        self._bytes = Histogram(BATCH_BYTES_BUCKETS)
        self._messages = Histogram(BATCH_MESSAGES_BUCKETS)
        self._runs = 0
        self._removed: dict[str, list[int]] = {}
        self._unconsumed: dict[tuple[str, str], list[int]] = {}

    def sync_round(self, seconds: float, nbytes: int, messages: int) -> None:
        """One fsync round of one log: its duration and what it made durable."""
        with self._lock:
            self._fsync.observe(seconds)
            if nbytes > 0:
                self._bytes.observe(nbytes)
                self._messages.observe(messages)

    def retention_run(self, removed: Sequence[tuple[str, int]]) -> None:
        """One retention run; ``removed`` = (action, bytes) per segment it removed."""
        with self._lock:
            self._runs += 1
            for action, nbytes in removed:
                slot = self._removed.setdefault(action, [0, 0])
                slot[0] += 1
                slot[1] += nbytes

    def unconsumed_removed(self, lost: Sequence[tuple[str, str, int, int]]) -> None:
        """(topic, group, bytes, messages) per segment the cap removed before ``group`` had
        consumed it."""
        with self._lock:
            for topic, group, nbytes, messages in lost:
                slot = self._unconsumed.setdefault((topic, group), [0, 0, 0])
                slot[0] += 1
                slot[1] += nbytes
                slot[2] += messages

    def snapshot(self) -> StoreMetricsSnapshot:
        with self._lock:
            return StoreMetricsSnapshot(
                self._fsync.snapshot(),
                self._bytes.snapshot(),
                self._messages.snapshot(),
                self._runs,
                {k: (v[0], v[1]) for k, v in self._removed.items()},
                {k: (v[0], v[1], v[2]) for k, v in self._unconsumed.items()},
            )
