"""The OffsetStore contract, run against every implementation (file, SQLite, PostgreSQL, ZK)."""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections.abc import Callable

import pytest

from pymetaq.offsets import OffsetEntry, OffsetStore
from tests.offsets import _workers

Factory = Callable[[], OffsetStore]


def test_load_of_missing_is_none(open_store: Factory) -> None:
    store = open_store()
    assert store.load("g", "t", "0-0") is None
    assert store.load_all("g") == []


def test_commit_then_load_round_trips_offset_and_msg_id(open_store: Factory) -> None:
    store = open_store()
    store.commit("g", [OffsetEntry("t", "0-0", 1024, msg_id=7_000_000_001)])
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 1024, 7_000_000_001)
    store.commit("g", [OffsetEntry("t", "0-0", 2048, msg_id=-1)])
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 2048, -1)


def test_commit_never_moves_backwards(open_store: Factory) -> None:
    store = open_store()
    store.commit("g", [OffsetEntry("t", "0-0", 100, msg_id=1)])
    store.commit("g", [OffsetEntry("t", "0-0", 50, msg_id=2)])
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 100, 1)
    store.commit("g", [OffsetEntry("t", "0-0", 100, msg_id=3)])  # equal: ignored
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 100, 1)
    # several entries for one partition in one call: the highest wins
    store.commit("g", [OffsetEntry("t", "0-0", 300, 5), OffsetEntry("t", "0-0", 200, 4)])
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 300, 5)


def test_reset_may_move_backwards(open_store: Factory) -> None:
    store = open_store()
    store.commit("g", [OffsetEntry("t", "0-0", 500, 9), OffsetEntry("t", "0-1", 70, 3)])
    store.reset("g", [OffsetEntry("t", "0-0", 20, -1)])
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 20, -1)
    assert store.load("g", "t", "0-1") == OffsetEntry("t", "0-1", 70, 3)  # untouched
    store.commit("g", [OffsetEntry("t", "0-0", 30, 1)])  # forward again from the reset
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 30, 1)


def test_groups_topics_and_partitions_are_isolated(open_store: Factory, seed: int) -> None:
    rng = random.Random(seed)
    store = open_store()
    expected: dict[tuple[str, str, str], OffsetEntry] = {}
    keys = [
        (g, t, f"{b}-{p}")
        for g in ("g1", "g2", "g3")
        for t in ("alpha", "beta")
        for b in (0, 1)
        for p in (0, 1, 2)
    ]
    for _ in range(3):
        batch_by_group: dict[str, list[OffsetEntry]] = {}
        for g, t, part in rng.sample(keys, 12):
            e = OffsetEntry(t, part, rng.randrange(1 << 40), rng.randrange(1 << 62))
            batch_by_group.setdefault(g, []).append(e)
            old = expected.get((g, t, part))
            if old is None or e.offset > old.offset:
                expected[(g, t, part)] = e
        for g, batch in batch_by_group.items():
            store.commit(g, batch)
    for g, t, part in keys:
        assert store.load(g, t, part) == expected.get((g, t, part))
    for g in ("g1", "g2", "g3", "g4"):
        want = sorted((e for (gg, _, _), e in expected.items() if gg == g), key=lambda e: e.key)
        assert store.load_all(g) == want


def test_offsets_survive_reopen(open_store: Factory) -> None:
    first = open_store()
    first.commit("g", [OffsetEntry("t", "3-7", 4096, 11), OffsetEntry("u", "0-0", 1, 12)])
    first.close()
    second = open_store()
    assert second.load("g", "t", "3-7") == OffsetEntry("t", "3-7", 4096, 11)
    assert second.load_all("g") == [
        OffsetEntry("t", "3-7", 4096, 11),
        OffsetEntry("u", "0-0", 1, 12),
    ]
    second.commit("g", [OffsetEntry("t", "3-7", 10, 1)])
    assert open_store().load("g", "t", "3-7") == OffsetEntry("t", "3-7", 4096, 11)


def test_concurrent_threads_lose_nothing(open_store: Factory) -> None:
    store = open_store()
    threads_n, rounds = 4, 25
    errors: list[BaseException] = []

    def run(worker: int) -> None:
        try:
            for r in range(rounds):
                store.commit(
                    "g",
                    [
                        OffsetEntry("shared", "0-0", r * threads_n + worker + 1),
                        OffsetEntry("own", f"{worker}-0", r + 1),
                    ],
                )
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.load("g", "shared", "0-0") == OffsetEntry("shared", "0-0", rounds * threads_n)
    for i in range(threads_n):
        assert store.load("g", "own", f"{i}-0") == OffsetEntry("own", f"{i}-0", rounds)


@pytest.mark.integration
def test_concurrent_processes_lose_nothing_and_never_go_backwards(
    store_spec: str, open_store: Factory
) -> None:
    workers, rounds = 3, 60
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(workers), ctx.Queue()
    procs = [
        ctx.Process(
            target=_workers.concurrent_committer,
            args=(store_spec, w, workers, rounds, start, results),
        )
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        reports = dict(results.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(60)
    assert [p.exitcode for p in procs] == [0] * workers
    assert reports == {w: [] for w in range(workers)}
    store = open_store()
    top = rounds * workers
    assert store.load(_workers.GROUP, *_workers.SHARED) == OffsetEntry(*_workers.SHARED, top, top)
    for w in range(workers):
        assert store.load(_workers.GROUP, "own", f"{w}-0") == OffsetEntry(
            "own", f"{w}-0", rounds * 10, rounds - 1
        )


def test_negative_offset_is_rejected(open_store: Factory) -> None:
    store = open_store()
    with pytest.raises(ValueError):
        store.commit("g", [OffsetEntry("t", "0-0", -1)])
    assert store.load("g", "t", "0-0") is None
