"""``pymetaq cdc`` benchmark: PostgreSQL -> ``pymetaq cdc capture`` -> broker ->
``pymetaq cdc apply`` -> replica, every part a real process (the broker with group commit: a
message is acknowledged after its fsync; PostgreSQL with ``synchronous_commit=on`` and, being a
test server, ``fsync=off``).

* **throughput**: ``--transactions`` source transactions of ``--changes`` inserted rows each,
  committed before capture and apply start; changes/s from their start to the replica holding
  the last row (start-up included: it is what a catch-up costs).
* **delay**: transactions of ``--changes`` rows committed at ``--rate`` per second (open loop:
  transaction *i* is due at ``start + i/rate`` and carries that time in its rows) while capture
  and apply run; the delay from a transaction's due time to the moment a reader polling the
  replica every 5 ms sees it, p50/p99 (an upper bound of commit -> applied: it adds the poll).

Replica: SQLite (the embedded default) or ``--replica postgresql``. Output: a JSON line per
case on stdout and a table on stderr.

    .venv/bin/python -m bench.cdc --transactions 2000 --changes 10 --rate 200 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from bench.common import ServerProcess, free_port, progress

DDL = "CREATE TABLE events (id bigint PRIMARY KEY, due double precision NOT NULL, body text)"
BODY = "x" * 60


def start_broker(workdir: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    ini = workdir / "server.ini"
    ini.write_text(
        f"[system]\nserverPort={port}\ndashboardHttpPort=0\ndataPath={workdir / 'data'}\n"
        "numPartitions=1\nunflushThreshold=0\n[zookeeper]\nzk.zkEnable=false\n[topic=cdc-*]\n"
    )
    argv = [sys.executable, "-m", "pymetaq.server.cli", "server", "-f", str(ini)]
    server = ServerProcess(argv, workdir / "broker.log", port)
    server.wait_ready()
    return server, f"meta://127.0.0.1:{port}"


@contextmanager
def postgres() -> Iterator[object]:
    from tests import _helpers
    from tests._services import PostgresServer

    _helpers.set_current_test("bench", True)
    with PostgresServer(settings={"synchronous_commit": "on"}) as pg:
        yield pg


class Pipeline:
    """Capture and apply processes for one case (a fresh source, slot, topic offsets, replica)."""

    def __init__(self, pg: object, servers: str, work: Path, name: str, replica: str) -> None:
        self.pg = pg
        self.source = pg.url_for(pg.create_database())  # type: ignore[attr-defined]
        self.target = (
            pg.url_for(pg.create_database())  # type: ignore[attr-defined]
            if replica == "postgresql"
            else f"sqlite:///{work / (name + '.db')}"
        )
        for url in (self.source, self.target):
            eng = sa.create_engine(url, poolclass=sa.NullPool)
            with eng.begin() as c:
                c.exec_driver_sql(DDL)
            eng.dispose()
        self.capture_argv = [sys.executable, "-m", "pymetaq.server.cli", "cdc", "capture",
            "--servers", servers, "--source", self.source, "--topic", f"cdc-{name}", "--slot", name,
            "--spool-dir", str(work / f"spool-{name}")]  # fmt: skip
        self.apply_argv = [sys.executable, "-m", "pymetaq.server.cli", "cdc", "apply",
            "--servers", servers, "--target", self.target, "--topic", f"cdc-{name}",
            "--group", name]  # fmt: skip
        subprocess.run([*self.capture_argv, "--once", "--quiet"], check=True)  # the slot
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for argv in (self.capture_argv, self.apply_argv):
            self.procs.append(subprocess.Popen([*argv, "--quiet"], stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            p.wait(60)

    def replica_reader(self) -> Callable[[int], list[tuple[int, float]]]:
        """``read(after_id)`` -> the replica's ``(id, due)`` rows with a larger id."""
        if self.target.startswith("sqlite"):
            con = sqlite3.connect(self.target.removeprefix("sqlite:///"), timeout=30)

            def read_sqlite(after: int) -> list[tuple[int, float]]:
                q = "SELECT id, due FROM events WHERE id > ? ORDER BY id"
                return [(int(r[0]), float(r[1])) for r in con.execute(q, (after,))]

            return read_sqlite
        eng = sa.create_engine(self.target, isolation_level="AUTOCOMMIT")

        def read_pg(after: int) -> list[tuple[int, float]]:
            with eng.connect() as c:
                q = sa.text("SELECT id, due FROM events WHERE id > :a ORDER BY id")
                return [(int(r[0]), float(r[1])) for r in c.execute(q, {"a": after})]

        return read_pg


def write_tx(conn: sa.Connection, tx: int, changes: int, due: float) -> None:
    rows = [{"id": tx * changes + j, "due": due, "body": BODY} for j in range(changes)]
    conn.execute(sa.text("INSERT INTO events VALUES (:id, :due, :body)"), rows)


def throughput(pipe: Pipeline, transactions: int, changes: int) -> dict[str, float]:
    eng = sa.create_engine(pipe.source)
    for tx in range(transactions):
        with eng.begin() as c:
            write_tx(c, tx, changes, 0.0)
    eng.dispose()
    read = pipe.replica_reader()
    last_id = transactions * changes - 1
    start = time.perf_counter()
    pipe.start()
    seen = -1
    deadline = time.monotonic() + 900
    while seen < last_id:
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not catch up within 900 s")
        rows = read(seen)
        seen = rows[-1][0] if rows else seen
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    pipe.stop()
    total = transactions * changes
    return {
        "transactions": transactions,
        "changes": total,
        "seconds": round(elapsed, 3),
        "changes_per_s": round(total / elapsed),
        "transactions_per_s": round(transactions / elapsed),
    }


def delay(pipe: Pipeline, rate: int, seconds: float, changes: int) -> dict[str, float]:
    read = pipe.replica_reader()
    pipe.start()
    time.sleep(3.0)  # both processes started and idle
    total = int(rate * seconds)
    eng = sa.create_engine(pipe.source)
    start = time.time()

    def write() -> None:
        with eng.connect() as c:
            for i in range(total):
                due = start + i / rate
                time.sleep(max(0.0, due - time.time()))
                with c.begin():
                    write_tx(c, i, changes, due)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    delays: list[float] = []
    seen = -1
    last_id = total * changes - 1
    deadline = time.monotonic() + seconds + 300
    while seen < last_id and time.monotonic() < deadline:
        rows = read(seen)
        now = time.time()
        delays += [now - due for rid, due in rows if rid % changes == changes - 1]
        seen = rows[-1][0] if rows else seen
        time.sleep(0.005)
    writer.join()
    pipe.stop()
    eng.dispose()
    delays.sort()
    if len(delays) < total:
        raise RuntimeError(f"only {len(delays)} of {total} transactions reached the replica")
    return {
        "rate_tx_per_s": rate,
        "changes_per_tx": changes,
        "transactions": total,
        "delay_p50_ms": round(delays[len(delays) // 2] * 1000, 1),
        "delay_p99_ms": round(delays[int(len(delays) * 0.99)] * 1000, 1),
        "delay_max_ms": round(delays[-1] * 1000, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transactions", type=int, default=2000)
    ap.add_argument("--changes", type=int, default=10, help="rows per transaction")
    ap.add_argument("--rate", type=int, default=200, help="transactions/s in the delay case")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--replica", choices=["sqlite", "postgresql"], default="sqlite")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-cdc-"))
    broker, servers = start_broker(work)
    results = []
    try:
        with postgres() as pg:
            progress(f"throughput: {args.transactions} x {args.changes} changes")
            pipe = Pipeline(pg, servers, work, "tput", args.replica)
            results.append({"case": "cdc_throughput", "replica": args.replica,
                            **throughput(pipe, args.transactions, args.changes)})  # fmt: skip
            progress(f"delay: {args.rate} tx/s for {args.seconds} s")
            pipe = Pipeline(pg, servers, work, "delay", args.replica)
            results.append({"case": "cdc_delay", "replica": args.replica,
                            **delay(pipe, args.rate, args.seconds, args.changes)})  # fmt: skip
    finally:
        broker.stop()
    for r in results:
        print(json.dumps(r))
    for r in results:
        print("  ".join(f"{k}={v}" for k, v in r.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
