"""The coordinator's decision log (pure file logic): replay, torn tails, damage, the lock,
group commit and compaction."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

from pymetaq.client.transaction import DecisionLog, DecisionLogError


def reopen(path: Path, name: str = "c1") -> DecisionLog:
    log = DecisionLog(path, name)
    log.open()
    return log


def test_replay_keeps_undone_decisions(tmp_path: Path) -> None:
    path = tmp_path / "d.log"
    log = reopen(path)
    log.decide_commit("aa", 0)
    log.decide_commit("bb", 1)
    log.done("aa")
    log.heuristic("cc", "broker", "rollback")
    log.close()
    log = reopen(path)
    assert log.pending() == {"bb": 1}
    assert log.state.heuristics == [("cc", "broker", "rollback")]
    log.close()


@pytest.mark.parametrize("tail", [b"C dd 0", b"C dd 0 0000", b"\x00" * 40, b"D bb 123456"])
def test_a_torn_tail_is_cut(tmp_path: Path, tail: bytes) -> None:
    path = tmp_path / "d.log"
    log = reopen(path)
    log.decide_commit("bb", 2)
    log.close()
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(tail)
    log = reopen(path)
    assert log.pending() == {"bb": 2} and log.state.cut_bytes == len(tail)
    assert path.stat().st_size == size
    log.decide_commit("ee", 0)  # appends after the cut
    log.close()
    assert reopen(path).pending() == {"bb": 2, "ee": 0}


def test_damage_before_a_later_decision_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "d.log"
    log = reopen(path)
    for g in ("a1", "a2", "a3"):
        log.decide_commit(g, 0)
    log.close()
    data = bytearray(path.read_bytes())
    i = data.index(b"C a2")
    data[i + 2] ^= 0x01  # flips a bit of a2's record; a3's commit follows it
    path.write_bytes(bytes(data))
    with pytest.raises(DecisionLogError, match="damaged record 3 before later commit"):
        reopen(path)


def test_one_process_per_log_and_the_owner_name(tmp_path: Path) -> None:
    path = tmp_path / "d.log"
    log = reopen(path)
    with pytest.raises(DecisionLogError, match="in use by another coordinator"):
        reopen(path)
    log.close()
    with pytest.raises(DecisionLogError, match="belongs to coordinator 'c1'"):
        reopen(path, "c2")
    (tmp_path / "other").write_bytes(b"hello\n")
    with pytest.raises(DecisionLogError, match="not a pymetaq decision log"):
        reopen(tmp_path / "other")


def test_concurrent_decisions_are_all_durable(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "d.log"
    log = reopen(path)
    syncs = []
    real = os.fsync

    def counting(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    rng = random.Random(seed)

    def worker(t: int) -> None:
        for i in range(50):
            log.decide_commit(f"{t:02x}{i:04x}", rng.randrange(3))
            if i % 2:
                log.done(f"{t:02x}{i:04x}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    monkeypatch.undo()
    assert len(syncs) <= 400  # at most one per decision; shared when they overlap
    pending = log.pending()
    log.close()
    assert reopen(path).pending() == pending and len(pending) == 8 * 25


def test_compaction_keeps_what_is_pending(tmp_path: Path) -> None:
    path = tmp_path / "d.log"
    log = DecisionLog(path, "c1", compact_bytes=2000)
    log.open()
    for i in range(100):
        log.decide_commit(f"{i:032x}", 0)
        if i != 42:
            log.done(f"{i:032x}")
    log.heuristic("ff", "broker", "commit")
    assert path.stat().st_size > 2000
    assert log.compact()
    assert path.stat().st_size < 400
    log.decide_commit("77", 1)
    log.close()
    again = reopen(path)
    assert again.pending() == {f"{42:032x}": 0, "77": 1}
    assert again.state.heuristics == [("ff", "broker", "commit")]
    assert not (tmp_path / "d.log.tmp").exists()
