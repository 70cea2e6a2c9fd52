"""IdWorker: MetaQ's layout, strictly increasing across clock steps, seeding."""

from __future__ import annotations

import random

from pymetaq.storage.ids import EPOCH_MS, IdWorker, id_time_ms


def test_layout() -> None:
    w = IdWorker(5, clock=lambda: EPOCH_MS + 1000)
    i = w.next_id()
    assert i == (1000 << 22) | (5 << 12) | 0
    assert w.next_id() == i + 1
    assert id_time_ms(i) == EPOCH_MS + 1000


def test_strictly_increasing_when_clock_steps_back(seed: int) -> None:
    rng = random.Random(seed)
    now = [EPOCH_MS + 10**9]

    def clock() -> int:
        now[0] += rng.choice([-5000, -1, 0, 0, 1, 3, 1000])
        return now[0]

    w = IdWorker(1023, clock=clock)
    last = 0
    for _ in range(20000):
        n = rng.choice([1, 1, 7, 100, 4096])
        first = w.reserve(n)
        assert first > last
        assert (first >> 12) & 0x3FF == 1023  # the broker bits are never touched
        assert (first & 0xFFF) + n <= 4096  # a batch never carries into the broker bits
        last = first + n - 1


def test_observe_seeds_above_existing_ids() -> None:
    w = IdWorker(0, clock=lambda: EPOCH_MS + 5)  # the clock is far behind the log
    existing = (10**6 << 22) | (9 << 12) | 4095
    w.observe(existing)
    assert w.next_id() > existing
    assert w.high_water() >= existing
