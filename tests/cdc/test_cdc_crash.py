"""Ordered binlog replication keeps its promise under SIGKILL: a random workload of inserts,
updates and deletes across tables with foreign keys on a real PostgreSQL (wal_level=logical),
``pymetaq cdc capture`` and ``pymetaq cdc apply`` (real processes) SIGKILLed at random moments
for many rounds; the replica (SQLite, the embedded default, with its foreign keys on; or
PostgreSQL in a slow variant) is
sampled at random points and must always equal the source's state after some commit (never a
transaction's half), and at the end equals the source row for row.

The seed is printed (``PYMETAQ_SEED`` replays a run).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import PostgresServer
from tests.cdc._helpers import State, Workload, create_schema, read_sql, read_sqlite

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.pg]

TOPIC = "cdc"
SLOT = "crash"
RATE = 80.0  # source transactions per second


@pytest.fixture
def source(pg_server: PostgresServer) -> Iterator[str]:
    """A fresh source database; its replication slots are dropped before the database."""
    name = pg_server.create_database()
    try:
        yield pg_server.url_for(name)
    finally:
        eng = sa.create_engine(pg_server.url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        with eng.connect() as c:
            c.exec_driver_sql(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %(d)s",
                {"d": name},
            )
        eng.dispose()
        pg_server.drop_database(name)


class Side:
    """One ``pymetaq cdc`` command as a process that can be SIGKILLed and started again."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.args = args
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self) -> None:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pymetaq.server.cli", "cdc", *self.args],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None
        self.kills += 1

    def run_to_end(self, *extra: str) -> str:
        """Run once more to completion (``--once`` / ``--idle-timeout``); its stderr."""
        r = subprocess.run(
            [sys.executable, "-m", "pymetaq.server.cli", "cdc", *self.args, *extra],
            capture_output=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr.decode()
        return r.stderr.decode()

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.args[0]} exited {self.proc.returncode}: {self.log.read_text()[-3000:]}"
            )


def check_boundary(
    workload: Workload, read: Callable[[], tuple[int, State]], seen: list[int]
) -> None:
    n, state = read()
    assert n <= len(workload.log)
    assert state == workload.state_after(n), f"replica state at txcount={n} was never committed"
    seen.append(n)


@pytest.mark.parametrize(
    ("rounds", "kind"),
    [
        (3, "sqlite"),
        pytest.param(8, "sqlite", marks=pytest.mark.slow),
        pytest.param(6, "postgresql", marks=pytest.mark.slow),
    ],
)
def test_sigkill_capture_and_apply_replica_equals_source(
    tmp_path: Path, pg_server: PostgresServer, source: str, seed: int, rounds: int, kind: str
) -> None:
    rng = random.Random(seed)
    src_engine = sa.create_engine(source, poolclass=sa.NullPool)
    create_schema(src_engine)
    src_engine.dispose()
    replica_db = pg_server.create_database() if kind == "postgresql" else ""
    try:
        run_rounds(tmp_path, rng, source, rounds, replica_db and pg_server.url_for(replica_db))
    finally:
        if replica_db:
            pg_server.drop_database(replica_db)


def kill_rounds(
    rounds: int,
    rng: random.Random,
    capture: Side,
    apply: Side,
    workload: Workload,
    read_replica: Callable[[], tuple[int, State]],
) -> list[int]:
    """Start what is down, let it work (sampling the replica), SIGKILL one side or both;
    the ``txcount`` of every sample."""
    seen: list[int] = []
    pause = threading.Event()
    for r in range(rounds):
        for side in (capture, apply):
            if side.proc is None:
                side.start()
        # a process needs 1-3 s to start on a loaded machine: rounds of 1.6-6 s
        for _ in range(rng.randint(2, 3)):
            pause.wait(rng.uniform(0.8, 2.0))
            check_boundary(workload, read_replica, seen)
        capture.check_alive()
        apply.check_alive()
        victims = rng.choice(((capture,), (apply,), (capture, apply)))
        print(f"round {r}: kill {', '.join(v.args[0] for v in victims)} at "
              f"{len(workload.log)} source transactions, replica at {seen[-1]}")  # fmt: skip
        for v in victims:
            v.kill()
    return seen


def run_rounds(tmp_path: Path, rng: random.Random, source: str, rounds: int, pg: str) -> None:
    """The rounds against a SQLite replica (``pg`` empty) or the PostgreSQL one at ``pg``."""
    target = pg or f"sqlite:///{tmp_path / 'replica.db'}"
    rep_engine = sa.create_engine(target, poolclass=sa.NullPool)
    create_schema(rep_engine)
    rep_engine.dispose()

    def read_replica() -> tuple[int, State]:
        return read_sql(pg) if pg else read_sqlite(str(tmp_path / "replica.db"))

    with BrokerProcess.start(tmp_path / "broker", topics={TOPIC: {"numPartitions": 1}}) as broker:
        servers = f"meta://{broker.host}:{broker.port}"
        pg_url = source.replace("postgresql+psycopg://", "postgresql://")
        capture = Side(
            ["capture", "--servers", servers, "--source", pg_url, "--slot", SLOT, "--topic", TOPIC,
             "--spool-dir", str(tmp_path / "spool"), "--batch-changes", "200"],
            tmp_path / "capture.log",
        )  # fmt: skip
        apply = Side(
            ["apply", "--servers", servers, "--target", target, "--topic", TOPIC,
             "--batch-transactions", "20"],
            tmp_path / "apply.log",
        )  # fmt: skip
        # the slot exists before the first change, so the replica can start empty
        capture.run_to_end("--once")
        workload = Workload(source, rng, RATE)
        workload.start()
        try:
            seen = kill_rounds(rounds, rng, capture, apply, workload, read_replica)
        finally:
            workload.stop.set()
            workload.join(30)
            for side in (capture, apply):
                if side.proc is not None:
                    side.kill()
        assert workload.error is None, workload.error
        total = len(workload.log)
        print(f"{total} source transactions; replica samples at {seen}")
        capture.run_to_end("--once")
        out = apply.run_to_end("--idle-timeout", "1")
        print(out)
        wait_for(lambda: read_replica()[0] == total, 60, "replica caught up")
        n, replica_state = read_replica()
        k, source_state = read_sql(source)
        assert n == k == total
        assert replica_state == source_state  # row for row
        assert replica_state == workload.state_after(total)
        assert capture.kills + apply.kills >= rounds
        assert len(set(seen)) > 1, "the replica never moved while sampled"
