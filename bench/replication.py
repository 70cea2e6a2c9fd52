"""Replication measured in one run: produce throughput and ack latency with no replication,
an asynchronous slave, and a synchronous pair; the async slave's lag under sustained load.

Setups (real broker processes; one real ZooKeeper for the async slave, which finds its master
there), each used for ``--rounds`` rounds, alternating:

* ``none``: one broker.
* ``async``: a master and a ``-Fmetaslave`` slave (``slaveMaxDelayInMills=100``).
* ``sync``: a ``-Fsamsa`` master and its ``-Fgregor`` slave.

Each round: one ``Producer`` sends ``--messages`` messages of ``--size`` bytes to a 2-partition
topic with ``send_async`` + ``flush`` (throughput, msgs/s); then ``--acks`` single sends one at
a time (ack latency p50/p99, microseconds).  During the async rounds, both brokers' ``stats
offsets`` (bytes behind, measured from outside) and the slave's ``stats replication``
(``lag_seconds``) are read every 20 ms: ``lag_max_bytes`` / ``lag_max_s`` are the largest seen,
``catch_up_s`` the time from the producer's last ack until the slave has everything.  Group
commit (``unflushThreshold=0``) on every broker.  Medians over the rounds; ``vs_none`` = the
setup's throughput / the unreplicated one's.

    .venv/bin/python bench/replication.py --rounds 3 --messages 50000 --json

Two cores shared with other work: figures are noisy, repeat runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pymetaq.client.producer.sync import Producer  # noqa: E402
from pymetaq.client.protocol import ResultReply  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402
from tests._services import ZooKeeperServer, free_port  # noqa: E402
from tests.server._helpers import Wire  # noqa: E402

TOPICS = {"bench": {"numPartitions": 2}}
SYSTEM = {"unflushThreshold": 0, "hostName": "127.0.0.1"}


def stats_lines(b: BrokerProcess, item: str) -> list[str]:
    with Wire(b.address) as w:
        reply = w.call(f"stats {item} 1\r\n".encode())
    assert isinstance(reply, ResultReply)
    return [ln for ln in reply.body.decode().split("\r\n") if ln and ln not in ("STATS", "END")]


def max_offsets(b: BrokerProcess) -> dict[str, int]:
    return {" ".join(ln.split()[:3]): int(ln.split()[6]) for ln in stats_lines(b, "offsets")}


def slave_lag(master: BrokerProcess, slave: BrokerProcess) -> tuple[int, float]:
    """(bytes: the master's durable ends minus the slave's, read from outside; the largest
    lag_seconds the slave reports)."""
    ours, theirs = max_offsets(master), max_offsets(slave)
    total = sum(max(0, end - theirs.get(k, 0)) for k, end in ours.items())
    worst = 0.0
    for line in stats_lines(slave, "replication")[1:]:
        f = line.split()
        s = f[f.index("lag_seconds") + 1]
        worst = max(worst, 0.0 if s == "unknown" else float(s))
    return total, worst


class Setup:
    def __init__(self, kind: str, work: Path, zk: ZooKeeperServer) -> None:
        self.kind = kind
        self.procs: list[BrokerProcess] = []
        self.slave: BrokerProcess | None = None
        base = work / kind
        if kind == "none":
            self.master = self._start(base, "master", SYSTEM, None, [])
        elif kind == "async":
            keys = {"zk.zkEnable": "true", "zk.zkConnect": zk.hosts}
            self.master = self._start(base, "master", SYSTEM, keys, [])
            props = base / "async_slave.properties"
            props.write_text("slaveId=0\nslaveMaxDelayInMills=100\n")
            self.slave = self._start(base, "slave", SYSTEM, keys, [f"-Fmetaslave={props}"])
        else:
            port = free_port()
            g = base / "gregor_slave.properties"
            g.parent.mkdir(parents=True, exist_ok=True)
            g.write_text("")
            self.slave = self._start(
                base, "gregor", {**SYSTEM, "serverPort": port}, None, [f"-Fgregor={g}"]
            )
            s = base / "samsa_master.properties"
            s.write_text(f"slave=127.0.0.1:{port}\n")
            self.master = self._start(base, "samsa", SYSTEM, None, [f"-Fsamsa={s}"])

    def _start(
        self, base: Path, name: str, system: Any, zk: Any, extra: list[str]
    ) -> BrokerProcess:
        base.mkdir(parents=True, exist_ok=True)
        p = BrokerProcess.start(
            base, name=name, system=system, topics=TOPICS, zookeeper=zk, extra_args=extra
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in reversed(self.procs):
            p.kill()
            p.__exit__(None, None, None)


def run_round(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    payload = b"x" * args.size
    lag: list[tuple[int, float]] = []
    stop = threading.Event()

    def sample() -> None:
        assert setup.slave is not None
        while not stop.is_set():
            with contextlib.suppress(Exception):
                lag.append(slave_lag(setup.master, setup.slave))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    if setup.kind == "async":
        sampler.start()
    with Producer(f"meta://{setup.master.host}:{setup.master.port}") as p:
        t0 = time.perf_counter()
        for i in range(args.messages):
            p.send_async("bench", payload, partition=i % 2)
        p.flush(120)
        elapsed = time.perf_counter() - t0
        done = time.monotonic()
        caught = None
        if setup.kind == "async":
            assert setup.slave is not None
            while time.monotonic() - done < 60:
                if slave_lag(setup.master, setup.slave)[0] == 0:
                    caught = time.monotonic() - done
                    break
                time.sleep(0.005)
            stop.set()
            sampler.join(5)
        lat = []
        for i in range(args.acks):
            a = time.perf_counter()
            r = p.send("bench", payload, partition=i % 2)
            lat.append((time.perf_counter() - a) * 1e6)
            assert r.success, r.error
    lat.sort()
    out: dict[str, Any] = {
        "setup": setup.kind,
        "msgs_per_s": round(args.messages / elapsed),
        "ack_p50_us": round(lat[len(lat) // 2]),
        "ack_p99_us": round(lat[int(len(lat) * 0.99) - 1]),
    }
    if setup.kind == "async":
        out["lag_max_bytes"] = max((b for b, _ in lag), default=0)
        out["lag_max_s"] = round(max((s for _, s in lag), default=0.0), 3)
        out["catch_up_s"] = None if caught is None else round(caught, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--acks", type=int, default=500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"none": [], "async": [], "sync": []}
    with ZooKeeperServer() as zk, tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        setups = {k: Setup(k, Path(tmp), zk) for k in results}
        try:
            for _ in range(args.rounds):
                for kind, setup in setups.items():
                    results[kind].append(run_round(setup, args))
        finally:
            for s in setups.values():
                s.close()
    rows = []
    base = statistics.median(r["msgs_per_s"] for r in results["none"])
    for kind, rs in results.items():
        row: dict[str, Any] = {"setup": kind, "rounds": len(rs)}
        for key in rs[0]:
            if key != "setup":
                vals = [r[key] for r in rs if r[key] is not None]
                row[key] = round(statistics.median(vals), 3) if vals else None
        row["vs_none"] = round(row["msgs_per_s"] / base, 3)
        rows.append(row)
    out = sys.stderr if args.json else sys.stdout
    if args.json:
        for row in rows:
            print(json.dumps(row))
    keys = list(dict.fromkeys(k for r in rows for k in r))
    print(" | ".join(keys), file=out)
    for r in rows:
        print(" | ".join(str(r.get(k, "")) for k in keys), file=out)


if __name__ == "__main__":
    main()
