"""server.limits as pure logic: the body budget's reservations, connection counts per IP, the
auto-created partition cap and the throttled log line."""

from __future__ import annotations

import logging
import random

import pytest

from pymetaq.server.limits import (
    AutoCreated,
    BodyBudget,
    ConnectionCounts,
    MemoryReturn,
    Throttled,
)


class Client:
    def __init__(self, name: str) -> None:
        self.name = name
        self.granted = 0

    def budget_granted(self) -> None:
        self.granted += 1

    def __repr__(self) -> str:
        return self.name


def test_reservations_wait_in_order_and_are_granted_on_release() -> None:
    budget = BodyBudget(100)
    a, b, c, d = (Client(x) for x in "abcd")
    assert budget.reserve(a, 60)
    assert not budget.reserve(b, 60)  # does not fit: waits
    assert not budget.reserve(c, 10)  # fits, but b is first in line
    assert budget.waiting == 2
    budget.release(a)
    assert (b.granted, c.granted) == (1, 1)  # 60 + 10 fit together
    assert budget.used == 70 and budget.held(b) == 60
    assert not budget.reserve(d, 40)
    budget.release(c)
    assert d.granted == 1 and budget.used == 100


def test_one_body_larger_than_the_budget_is_granted_alone() -> None:
    budget = BodyBudget(100)
    a, b = Client("a"), Client("b")
    assert budget.reserve(a, 500)  # nothing else reserved: no deadlock on a huge body
    assert not budget.reserve(b, 1)
    budget.release(a)
    assert b.granted == 1


def test_a_waiter_that_leaves_gives_up_its_place() -> None:
    budget = BodyBudget(100)
    a, b, c = Client("a"), Client("b"), Client("c")
    assert budget.reserve(a, 100)
    assert not budget.reserve(b, 50)
    assert not budget.reserve(c, 50)
    budget.release(b)  # closed while waiting
    budget.release(a)
    assert (b.granted, c.granted) == (0, 1)


def test_the_budget_never_exceeds_its_limit_under_random_traffic(seed: int) -> None:
    rng = random.Random(seed)
    budget = BodyBudget(1000)
    clients = [Client(str(i)) for i in range(20)]
    for _ in range(5000):
        c = rng.choice(clients)
        if budget.held(c) or rng.random() < 0.4:
            budget.release(c)
        else:
            budget.reserve(c, rng.randrange(1, 600))
        held = sum(budget.held(x) for x in clients)
        assert held == budget.used
        assert budget.used <= 1000 or len([x for x in clients if budget.held(x)]) == 1


def test_connections_per_ip() -> None:
    counts = ConnectionCounts(2)
    assert counts.admit("10.0.0.1") and counts.admit("10.0.0.1")
    assert not counts.admit("10.0.0.1")
    assert counts.admit("10.0.0.2")
    counts.release("10.0.0.1")
    assert counts.admit("10.0.0.1")
    for _ in range(2):
        counts.release("10.0.0.1")
    assert counts.count("10.0.0.1") == 0


def test_auto_created_partitions_are_capped_and_existing_ones_count() -> None:
    auto = AutoCreated(3, [("a", 0), ("a", 1)])
    assert auto.admit("a", 0)  # already there: free
    assert auto.admit("b", 0)
    assert not auto.admit("c", 0)
    auto.forget("b", 0)  # its creation failed
    assert auto.admit("c", 0) and len(auto) == 3


def test_throttled_logs_once_per_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    throttled = Throttled(logging.getLogger("t"), 5.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="t"):
        for i in range(10):
            now[0] = i * 0.1
            throttled.log("k", logging.INFO, "closing %s", i)
        now[0] = 6.0
        throttled.log("k", logging.INFO, "closing %s", 99)
        throttled.log("other", logging.INFO, "other key")
    assert [r.getMessage() for r in caplog.records] == [
        "closing 0",
        "closing 99 (and 9 more like it in the last 5 s)",
        "other key",
    ]


def test_memory_is_returned_once_enough_body_bytes_were_released() -> None:
    budget = BodyBudget(100 << 20)
    trims: list[int] = []
    memory = MemoryReturn(threshold=10 << 20)

    def observed_trim(pad: int) -> int:  # the libc call, observed
        trims.append(pad)
        return 1

    memory._trim = observed_trim
    a = Client("a")
    budget.reserve(a, 6 << 20)
    budget.release(a)
    assert not memory.maybe_trim(budget) and trims == []  # 6 MiB: not yet
    budget.reserve(a, 6 << 20)
    budget.release(a)
    assert memory.maybe_trim(budget) and trims == [0]
    assert not memory.maybe_trim(budget)  # counted from zero again
