"""Automatic failover of a synchronous pair, timed: master SIGKILL -> first successful ack
through the new master, p50 and max over ``--rounds`` rounds.

Each round starts a fresh pair (a ``-Fsamsa`` master and its ``-Fgregor`` slave, both with
ZooKeeper; a fresh registry root in one real ZooKeeper), one ``zk://`` producer sending
100-byte messages one at a time (no retries; a send that fails or raises is tried again after
10 ms), SIGKILLs the master once ``--warmup`` messages are acknowledged, and measures until the
producer's first acknowledgement after the kill (the master is dead: it comes from the
promoted slave, found through ZooKeeper by the same producer).  The time is mostly the
master's ZooKeeper session ending (``--session-timeout-ms``, ``zk.zkSessionTimeoutMs`` on
both brokers; ZooKeeper expires a session on its tick, so up to a tick before the timeout),
then the slave's promotion, its registration and the producer noticing it.

Then the killed master is started again with its ``-Fsamsa`` command line while the producer
keeps sending, and the rejoin is timed: from the restart until the new master has sent it
what it lacked and names it in sync (its log's ``is the in-sync slave`` line); this includes
the process start (a Python interpreter and the imports, about a second).

    .venv/bin/python bench/failover.py --rounds 5 --json

Two cores shared with other work: figures are noisy, repeat runs.
"""

from __future__ import annotations

import argparse
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

from pymetaq.client.errors import MetaClientError  # noqa: E402
from pymetaq.client.producer.sync import Producer  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402
from tests._services import ZooKeeperServer, free_port  # noqa: E402

TOPICS = {"bench": {"numPartitions": 2}}
SYSTEM = {"unflushThreshold": 0, "hostName": "127.0.0.1"}


def start_pair(base: Path, hosts: str, session_ms: int) -> tuple[BrokerProcess, BrokerProcess]:
    base.mkdir(parents=True)
    zk = {
        "zk.zkEnable": "true",
        "zk.zkConnect": hosts,
        "zk.zkSessionTimeoutMs": session_ms,
        "zk.zkSyncTimeMs": 100,
    }
    port = free_port()
    (base / "gregor_slave.properties").write_text("")
    gregor = BrokerProcess.start(
        base,
        name="gregor",
        system={**SYSTEM, "serverPort": port},
        topics=TOPICS,
        zookeeper=zk,
        extra_args=[f"-Fgregor={base / 'gregor_slave.properties'}"],
    )
    (base / "samsa_master.properties").write_text(f"slave=127.0.0.1:{port}\n")
    samsa = BrokerProcess.start(
        base,
        name="samsa",
        system=SYSTEM,
        topics=TOPICS,
        zookeeper=zk,
        extra_args=[f"-Fsamsa={base / 'samsa_master.properties'}"],
    )
    return gregor, samsa


IN_SYNC = "holds everything: it is the in-sync slave"


def one_round(base: Path, hosts: str, args: argparse.Namespace) -> tuple[float, float]:
    gregor, samsa = start_pair(base, hosts, args.session_timeout_ms)
    acks: list[float] = []
    stop = threading.Event()
    producer = Producer(f"zk://{hosts}/meta", retries=0)

    def send() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                ok = producer.send("bench", b"x" * 100, partition=i % 2, timeout_s=10).success
            except MetaClientError:
                ok = False
            if ok:
                acks.append(time.monotonic())
            else:
                stop.wait(0.01)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(acks) < args.warmup:  # bounded: 60 s
            if time.monotonic() > deadline:
                raise RuntimeError("the pair took no messages within 60 s")
            time.sleep(0.01)
        samsa.kill()
        killed = time.monotonic()
        deadline = killed + 120
        while not acks or acks[-1] <= killed:
            if time.monotonic() > deadline:
                raise RuntimeError("no ack through the new master within 120 s")
            time.sleep(0.005)
        first = next(t for t in acks if t > killed)
        restarted = time.monotonic()
        samsa.restart()
        deadline = restarted + 120
        while IN_SYNC not in gregor.log_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the restarted master did not rejoin within 120 s")
            time.sleep(0.005)
        rejoined = time.monotonic()
    finally:
        stop.set()
        thread.join(30)
        producer.close(5)
        for b in (samsa, gregor):
            b.kill()
            b.__exit__(None, None, None)
    return round(first - killed, 3), round(rejoined - restarted, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--session-timeout-ms", type=int, default=4000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rounds: list[tuple[float, float]] = []
    with ZooKeeperServer() as zk, tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        from kazoo.client import KazooClient

        admin = KazooClient(hosts=zk.hosts)
        admin.start(timeout=10)
        try:
            for n in range(args.rounds):
                admin.ensure_path(f"/failover{n}")
                hosts = f"{zk.hosts}/failover{n}"
                rounds.append(one_round(Path(tmp) / f"round{n}", hosts, args))
        finally:
            admin.stop()
            admin.close()
    took = [f for f, _ in rounds]
    rejoin = [r for _, r in rounds]
    row: dict[str, Any] = {
        "rounds": len(rounds),
        "session_timeout_s": args.session_timeout_ms / 1000,
        "failover_p50_s": round(statistics.median(took), 3),
        "failover_max_s": max(took),
        "rejoin_p50_s": round(statistics.median(rejoin), 3),
        "rejoin_max_s": max(rejoin),
    }
    out = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps({**row, "each_s": took, "rejoin_each_s": rejoin}))
    print(" | ".join(row), file=out)
    print(" | ".join(str(v) for v in row.values()), file=out)


if __name__ == "__main__":
    main()
