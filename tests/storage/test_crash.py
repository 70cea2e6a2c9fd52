"""Process crash: SIGKILL an appender child at random moments; every ack survives.

Both durability modes, with 8 KiB segments so every round rolls several times (a kill often
lands between a roll and the flusher finishing it).  Threshold mode acknowledges before the
fsync, so a process crash (the kernel keeps the written pages) must still lose nothing: that
is the case that used to lose acknowledged batches written to a ``.meta.new`` segment.
The default run keeps a short loop per mode; the ``slow`` variant runs many more rounds.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pymetaq.storage import MessageStoreManager, StoreConfig, TopicStoreConfig
from pymetaq.storage.record import encode_record
from tests.storage._helpers import read_all
from tests.storage.crash_child import payloads

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("crash_child.py")
ROOT = Path(__file__).resolve().parents[2]
SEGMENT = 8192
MODES = {"group_commit": 0, "threshold": 1000}
_ACK = re.compile(r"\d+ \d+ \d+\n")


@dataclass
class Outcome:
    rounds: int
    acked: int  # acknowledged records
    lost: int  # acknowledged records missing or different after recovery
    rolls: int  # segment files at the end (every round adds some)


def _round(path: Path, seed: int, threshold: int, rng: random.Random) -> list[str]:
    """Run the child until it has acknowledged at least two segments' worth, then a random
    moment later SIGKILL it; return its complete ack lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(path), str(seed), str(threshold), str(SEGMENT)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=str(ROOT),
    )
    assert proc.stdout is not None
    lines: list[str] = []
    first = -1
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # bounded: the child acks thousands per second
        line = proc.stdout.readline().decode()
        assert line, "child died before acknowledging enough"
        lines.append(line)
        off = int(line.split()[0])
        first = off if first < 0 else first
        if off - first >= 2 * SEGMENT:
            break
    pause = time.monotonic() + rng.uniform(0.0, 0.05)
    while time.monotonic() < pause:
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    # Read the rest through the same buffered reader: ``communicate(timeout=...)`` reads the
    # raw descriptor and misses what ``readline`` had buffered, which split an ack line in two
    # under load ("3684311 5 b" became "684311 5 b": a false loss report).
    with proc.stdout:
        rest = proc.stdout.read().decode()
    proc.wait(timeout=30)
    lines += rest.splitlines(keepends=True)
    done = [ln for ln in lines if ln.endswith("\n")]  # a line cut by the kill was not reported
    bad = [ln for ln in done if not _ACK.fullmatch(ln)]
    assert not bad, f"malformed ack lines from the child: {bad[:3]}"
    return done


def crash_loop(path: Path, seed: int, threshold: int, rounds: int) -> Outcome:
    rng = random.Random(seed)
    acked: list[tuple[int, int, int]] = []
    for _ in range(rounds):
        for line in _round(path, seed, threshold, rng):
            off, count, b = map(int, line.split())
            acked.append((off, count, b))
    cfg = TopicStoreConfig(unflush_threshold=threshold)
    m = MessageStoreManager(StoreConfig(str(path), max_segment_size=SEGMENT), lambda t: cfg)
    reports = m.open()
    m.start()
    assert reports and not reports[0].clean
    plog = m.get_log("t", 0)
    assert plog is not None
    recs = {r.offset: r for r in read_all(plog)}  # read_all verifies every CRC
    lost = total = 0
    for off, count, b in acked:
        want = payloads(seed, b)
        assert len(want) == count
        pos = off
        for p in want:
            total += 1
            if pos not in recs or recs[pos].data != p:
                lost += 1
            pos += 20 + len(p)
    ids = [r.msg_id for r in recs.values()]
    assert len(set(ids)) == len(ids) and 0 not in ids
    res = plog.append_sync(bytearray(encode_record(b"after") * 2), timeout=10)
    assert res.offset == plog.write_offset - res.length and res.first_msg_id > max(ids)
    rolls = len(plog.segments)
    m.close()
    return Outcome(rounds, total, lost, rolls)


def _check(tmp_path: Path, seed: int, mode: str, rounds: int) -> Outcome:
    out = crash_loop(tmp_path, seed, MODES[mode], rounds)
    print(f"[crash] {mode}: {out}")
    assert out.lost == 0, out
    assert out.rolls > 2 * out.rounds  # every round rolled (two segments' worth at least)
    return out


@pytest.mark.crash
@pytest.mark.parametrize("mode", list(MODES))
def test_sigkill_loses_no_acknowledged_record(tmp_path: Path, seed: int, mode: str) -> None:
    _check(tmp_path, seed, mode, rounds=12)


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("mode", list(MODES))
def test_sigkill_loop_many_rounds(tmp_path: Path, seed: int, mode: str) -> None:
    _check(tmp_path, seed, mode, rounds=60)
