"""``pymetaq tail`` keeps its promise: lines written at a steady rate while one file is rotated
by rename + create and another by copytruncate, and the agent (a real process, started from an
INI config in tail4j's layout) SIGKILLed at random moments; at the end the topic holds every
line exactly once, in order per file.

The seed is printed (``PYMETAQ_SEED`` replays a run).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from functools import partial
from pathlib import Path
from typing import BinaryIO

import pytest

from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.client._helpers import fetch_all

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]

ROUNDS = 8
PARTITIONS = 2
ROTATE_EVERY = 300  # lines of one file between two rotations
RATE = 1500  # lines/s over both files


class Writer(threading.Thread):
    """Writes ``a <seq> ...`` and ``b <seq> ...`` lines (100 bytes) at a steady rate; rotates
    a.log by rename (a.log.N) + create and b.log by copy (b.log.N) + truncate."""

    def __init__(self, directory: Path, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.dir = directory
        self.rng = rng
        self.count = {"a": 0, "b": 0}
        self.rotations = {"a": 0, "b": 0}
        self.stop = threading.Event()
        self.files = {n: self.open(n) for n in "ab"}

    def open(self, name: str) -> BinaryIO:
        return (self.dir / f"{name}.log").open("ab", buffering=0)  # closed by rotate()/run()

    def line(self, name: str) -> bytes:
        seq = self.count[name]
        self.count[name] += 1
        return f"{name} {seq:08d} ".encode().ljust(99, b"x") + b"\n"

    def rotate(self, name: str) -> None:
        self.rotations[name] += 1
        k = self.rotations[name]
        if name == "a":
            self.files["a"].close()
            os.rename(self.dir / "a.log", self.dir / f"a.log.{k}")
            self.files["a"] = self.open("a")
        else:
            shutil.copyfile(self.dir / "b.log", self.dir / f"b.log.{k}")
            os.truncate(self.dir / "b.log", 0)

    def run(self) -> None:
        tick = 0.02
        per_tick = max(1, int(RATE * tick / 2))
        next_at = time.monotonic()
        while not self.stop.is_set():
            for name in "ab":
                n = self.rng.randint(1, 2 * per_tick)
                self.files[name].write(b"".join(self.line(name) for _ in range(n)))
                if self.count[name] // ROTATE_EVERY > self.rotations[name]:
                    self.rotate(name)
            next_at += tick
            self.stop.wait(max(0.0, next_at - time.monotonic()))
        for f in self.files.values():
            f.close()


def start_agent(ini: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pymetaq.server.cli", "tail", "--config", str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def started(log: Path, n: int) -> bool:
    return log.read_text().count("pymetaq tail: following") >= n


def test_kill9_and_rotation_lose_nothing_and_ship_nothing_twice(tmp_path: Path) -> None:
    seed = int(os.environ.get("PYMETAQ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    logs = tmp_path / "logs"
    logs.mkdir()
    with BrokerProcess.start(
        tmp_path / "broker", topics={"logs": {"numPartitions": PARTITIONS}}
    ) as broker:
        ini = tmp_path / "tail.ini"
        ini.write_text(
            "[system]\n"
            f"checkpoint_path={tmp_path / 'checkpoints'}\n"
            "max_buf_size=4096\n"
            "poll_interval_ms=20\n"
            "[meta]\n"
            f"server_url=meta://{broker.host}:{broker.port}\n"
            "[app]\n"
            "topic=logs\n"
            f"log_base_path={logs}\n"
            # the rotated names match too: a file rotated away while the agent is down is
            # still found; a renamed file is known by its inode, b's copies are told from
            # new files by their content
            "log_name_regx=[ab]\\.log.*\n"
            "ordered=true\n"
            "checkpoint_name=app\n"
        )
        agent_log = tmp_path / "agent.log"
        agent_log.touch()
        writer = Writer(logs, rng)
        writer.start()
        starts = 0
        try:
            for _ in range(ROUNDS):
                proc = start_agent(ini, agent_log)
                starts += 1
                wait_for(partial(started, agent_log, starts), 60, "the agent to start")
                time.sleep(rng.uniform(0.1, 1.5))  # a random moment, not a synchronisation
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
        finally:
            writer.stop.set()
            writer.join(30)
        assert writer.rotations["a"] >= 2 and writer.rotations["b"] >= 2, writer.rotations
        total = sum(writer.count.values())

        def stored() -> int:
            return sum(len(fetch_all(broker.address, "logs", p)) for p in range(PARTITIONS))

        proc = start_agent(ini, agent_log)
        starts += 1
        try:
            # the last kill may come after the last line was shipped: then the topic is
            # complete at once, and a SIGTERM sent before the agent has installed its handler
            # (it does so before it says "following") ends it with the default action
            wait_for(partial(started, agent_log, starts), 60, "the agent to start")
            try:
                wait_for(lambda: stored() >= total, 60, f"{total} lines in the topic")
            except AssertionError:
                pass  # the checks below say which lines are missing
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, agent_log.read_text()[-3000:]
        messages = [m for p in range(PARTITIONS) for m in fetch_all(broker.address, "logs", p)]
    values = Counter(m.value for m in messages)
    twice = [v for v, n in values.items() if n > 1]
    where = [
        (m.partition, m.offset, m.attribute) for m in messages if twice and m.value == twice[0]
    ]
    assert not twice, (
        f"{len(twice)} lines shipped twice, e.g. {twice[:3]} at {where}\n"
        + (agent_log.read_text()[-3000:])
    )
    expected = {
        f"{name} {seq:08d} ".encode().ljust(99, b"x")
        for name in "ab"
        for seq in range(writer.count[name])
    }
    missing = sorted(expected - set(values))
    assert not missing, (
        f"{len(missing)} lines lost, e.g. {missing[:3]}\n" + agent_log.read_text()[-3000:]
    )
    assert set(values) == expected
    per_file: dict[str, list[int]] = defaultdict(list)
    for m in messages:  # each file's lines went to one partition: log order = file order
        assert m.attribute is not None
        ident = m.attribute.split(";")[1]
        per_file[ident].append(int(m.value.split()[1]))
    for ident, seqs in per_file.items():
        assert seqs == sorted(seqs), f"file {ident} out of order"
    assert len(per_file) > 4  # the rotations made new files
