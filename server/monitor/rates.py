"""Per-second rates for the dashboard: a sampler of the broker's monotonic totals.

Every ``PERIOD_S`` the sampler (a ``call_later`` chain on the broker's loop, running only while
the HTTP port is on) reads, per partition, messages in, bytes in (storage's per-log counters),
bytes out (the get path's counter) and the broker's request counters, and keeps the last
``WINDOW`` samples.  A rate is the difference between the newest and the oldest sample over the
time between them (a 10 s moving average); a total that went down (a log reopened) counts
from zero.  Cost: one pass over the partitions per second, nothing on the request paths.

Thread-safety: loop thread only.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

PERIOD_S = 1.0
WINDOW = 11  # samples: 10 s between the oldest and the newest

Totals = dict[object, tuple[int, ...]]


@dataclass(frozen=True)
class Sample:
    when: float
    totals: Totals


class RateSampler:
    """Keeps the last ``WINDOW`` samples of ``read()`` (key -> tuple of monotonic totals)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        read: Callable[[], Totals],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = loop
        self._read = read
        self._clock = clock
        self._samples: collections.deque[Sample] = collections.deque(maxlen=WINDOW)
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.sample()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sample(self) -> None:
        self._samples.append(Sample(self._clock(), self._read()))
        self._timer = self._loop.call_later(PERIOD_S, self.sample)

    def rate(self, key: object) -> tuple[float, ...]:
        """Per-second rates of ``key``'s totals over the window (zeros until two samples)."""
        if len(self._samples) < 2:
            return ()
        first, last = self._samples[0], self._samples[-1]
        now = last.totals.get(key)
        if now is None:
            return ()
        then = first.totals.get(key, tuple(0 for _ in now))
        span = last.when - first.when
        if span <= 0:
            return ()
        return tuple(max(0, b - (a if a <= b else 0)) / span for a, b in zip(then, now))
