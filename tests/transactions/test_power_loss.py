"""Power loss under transactions: the journal and the partition logs on one fault-injecting disk
(unsynced writes dropped, the last one torn), many seeded rounds.

Invariants checked after every restart, over every transaction of every earlier round:

- a transaction acknowledged as committed is in the logs exactly once, each partition's part
  contiguous and in put order;
- nothing else is applied partially: a transaction's messages are all there or none;
- a rolled-back (acknowledged) or never-committed transaction is absent;
- an acknowledged PREPARE comes back as a prepared branch, with its messages, not in the log;
- no message id appears twice in the logs.

Partition logs run in group commit and in MetaQ's threshold mode (a commit is acknowledged
before the partition's fsync: the journal's COMMIT record then carries the transaction).
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pymetaq.storage import StorageError, TopicStoreConfig
from pymetaq.storage.txjournal import HeldTx, JournalError
from tests.storage.faultdisk import FaultDisk
from tests.transactions._store import Env, abandon, close, open_env, read_records

PARTITIONS = 3
MODES = {
    "group-commit": TopicStoreConfig(num_partitions=PARTITIONS, unflush_threshold=0),
    "threshold": TopicStoreConfig(
        num_partitions=PARTITIONS, unflush_threshold=5, unflush_interval_ms=60_000
    ),
}


@dataclass
class T:
    key: str
    xa: bool
    held: HeldTx
    msgs: list[tuple[int, bytes]] = field(default_factory=list)  # (partition, record)
    status: str = (
        "open"  # open prepare-sent prepared commit-sent committed rollback-sent rolled-back
    )
    was_prepared: bool = False

    def ids(self) -> list[int]:
        return [int.from_bytes(r[8:16], "big") for _, r in self.msgs]


def check(env: Env, ledger: dict[str, T]) -> None:
    where: dict[int, tuple[int, int, int]] = {}  # msg id -> (partition, offset, size)
    for p in range(PARTITIONS):
        for r in read_records(env.log("t", p)):
            assert r.msg_id not in where, f"message {r.msg_id} appears twice"
            where[r.msg_id] = (p, r.offset, r.size)
    restored = {tx.key: tx for tx in env.recovery.prepared}
    for key, t in ledger.items():
        present = [i in where for i in t.ids()]
        if t.status == "committed" or (t.status == "commit-sent" and all(present) and present):
            assert all(present), f"{key}: acknowledged commit lost"
            _contiguous(t, where)
            t.status = "committed"
            continue
        assert not any(present), f"{key} ({t.status}) is partly or wrongly applied"
        if t.status == "prepared":
            assert key in restored, f"{key}: acknowledged PREPARE lost"
        if key in restored:
            assert t.status in ("prepared", "prepare-sent") or t.was_prepared, (key, t.status)
            parts = restored[key].parts
            assert {p for _, p in parts} == {p for p, _ in t.msgs}
            for (_, p), recs in parts.items():
                assert recs == [r for q, r in t.msgs if q == p]
            t.status, t.held, t.was_prepared = "prepared", restored[key], True
        elif t.status != "committed":
            t.status = "rolled-back"
    assert set(restored) <= set(ledger)


def _contiguous(t: T, where: dict[int, tuple[int, int, int]]) -> None:
    by_part: dict[int, list[int]] = {}
    for (p, _), i in zip(t.msgs, t.ids()):
        by_part.setdefault(p, []).append(i)
    for p, ids in by_part.items():
        spots = [where[i] for i in ids]
        assert all(s[0] == p for s in spots)
        for a, b in itertools.pairwise(spots):
            assert b[1] == a[1] + a[2], f"{t.key}: partition {p} range is not contiguous/in order"


def workload(
    env: Env, disk: FaultDisk, rng: random.Random, ledger: dict[str, T], round_: int
) -> None:
    target = disk.syncs + rng.randrange(1, 30)
    n = 0
    while disk.syncs < target and n < 400:
        n += 1
        live = [t for t in ledger.values() if t.status in ("open", "prepared")]
        op = rng.random()
        try:
            if op < 0.35 or not live:
                xa = rng.random() < 0.5
                key = f"XID:1:{round_:04x}:{n:04x}:q" if xa else f"TX:s{round_}:{n}"
                t = ledger[key] = T(key, xa, env.store.begin(key, xa))
                for _ in range(rng.randrange(1, 5)):
                    p = rng.randrange(PARTITIONS)
                    rec = env.record(rng.randbytes(rng.randrange(1, 300)))
                    env.store.add(t.held, "t", p, rec)
                    t.msgs.append((p, rec))
            else:
                t = rng.choice(live)
                _decide(env, rng, t)
            if rng.random() < 0.05:
                job = env.store.checkpoint_begin()
                if job is not None:
                    job.run()
                    env.store.checkpoint_end(job, None)
        except (JournalError, StorageError, OSError):
            break
        env.drain_now()


def _decide(env: Env, rng: random.Random, t: T) -> None:
    r = rng.random()
    if t.status == "open" and t.xa and r < 0.4:
        t.status = "prepare-sent"

        def prepared(exc: BaseException | None, t: T = t) -> None:
            if exc is None and t.status == "prepare-sent":
                t.status, t.was_prepared = "prepared", True

        env.store.prepare(t.held, prepared)
    elif r < 0.8:
        t.status = "commit-sent"

        def committed(result: object, exc: BaseException | None, t: T = t) -> None:
            if exc is None:
                t.status = "committed"

        env.store.commit(t.held, committed)
    else:
        t.status = "rollback-sent"

        def rolled_back(exc: BaseException | None, t: T = t) -> None:
            if exc is None and t.status == "rollback-sent":
                t.status = "rolled-back"

        env.store.rollback(t.held, rolled_back)


def run(tmp_path: Path, seed: int, mode: str, rounds: int) -> None:
    rng = random.Random(seed)
    ledger: dict[str, T] = {}
    path = str(tmp_path / mode)
    acked = 0
    for round_ in range(rounds):
        disk = FaultDisk(random.Random(rng.random()))
        env = open_env(
            path,
            disk=disk,
            topic=MODES[mode],
            file_size=rng.choice([2048, 16384, 1 << 20]),
            segment=rng.choice([4096, 65536]),
        )
        check(env, ledger)
        workload(env, disk, rng, ledger, round_)
        disk.crash()
        abandon(env)
        env.drain_now()  # acknowledgements whose fsync finished before the power went
        acked += sum(t.status == "committed" for t in ledger.values())
    env = open_env(path, topic=MODES[mode])
    check(env, ledger)
    for t in [t for t in ledger.values() if t.status == "prepared"]:  # the coordinator decides
        _decide(env, rng, t)
        env.drain(functools.partial(_decided, t))
    close(env)
    env = open_env(path, topic=MODES[mode])
    check(env, ledger)
    close(env)
    assert acked > 0 and any(t.status == "committed" for t in ledger.values())


@pytest.mark.parametrize("mode", sorted(MODES))
def test_power_loss_applies_every_acknowledged_commit_exactly_once(
    tmp_path: Path, seed: int, mode: str
) -> None:
    run(tmp_path, seed, mode, rounds=12)


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
def test_power_loss_many_rounds(tmp_path: Path, seed: int, mode: str) -> None:
    run(tmp_path, seed, mode, rounds=80)


def _decided(t: T) -> bool:
    return t.status in ("committed", "rolled-back")
