"""Process crash: SIGKILL a group-commit appender at random moments; every ack survives."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pymetaq.storage import MessageStoreManager, StoreConfig, TopicStoreConfig
from pymetaq.storage.record import encode_record
from tests.storage._helpers import read_all
from tests.storage.crash_child import payloads

pytestmark = pytest.mark.integration

ROUNDS = 25
CHILD = Path(__file__).with_name("crash_child.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.crash
def test_sigkill_loses_no_acknowledged_record(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    acked: list[tuple[int, int, int]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(ROUNDS):
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(tmp_path), str(seed)],
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(ROOT),
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # wait for the first ack: the child is running
        assert first, "child died before acknowledging anything"
        lines = [first.decode()]
        deadline = time.monotonic() + rng.uniform(0.0, 0.25)
        while time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        lines += out.decode().splitlines(keepends=True)
        for line in lines:
            if line.endswith("\n"):  # a line cut by the kill was not fully reported
                off, count, b = map(int, line.split())
                acked.append((off, count, b))
    cfg = TopicStoreConfig(unflush_threshold=0)
    m = MessageStoreManager(StoreConfig(str(tmp_path), max_segment_size=8192), lambda t: cfg)
    reports = m.open()
    m.start()
    assert reports and not reports[0].clean
    plog = m.get_log("t", 0)
    assert plog is not None
    recs = {r.offset: r for r in read_all(plog)}  # read_all verifies every CRC
    assert len(acked) >= ROUNDS
    for off, count, b in acked:
        want = payloads(seed, b)
        assert len(want) == count
        pos = off
        for p in want:
            assert pos in recs and recs[pos].data == p, (off, b)
            pos += 20 + len(p)
    ids = [r.msg_id for r in recs.values()]
    assert len(set(ids)) == len(ids)
    res = plog.append_sync(bytearray(encode_record(b"after") * 2), timeout=10)
    assert res.offset == plog.write_offset - res.length and res.first_msg_id > max(ids)
    m.close()
