"""Broadcast config invalidation benchmark: propagation delay from ``invalidate()`` to the last
of N subscriber processes (``tests/invalidation/_subscriber.py``: a ``ConfigCache`` with a
state directory, so each event is also written to its snapshot and offsets before the next
batch), against a broker subprocess with group commit (an event is acknowledged after its
fsync).

Events are published open loop at ``--rates`` per second for ``--seconds`` each (event *i* is
due at ``start + i/rate``; ``--threads`` publisher threads, each ``invalidate`` waits for its
ack); an event's delay is the time from its publish call (the ``ts`` it carries) to the
moment the last subscriber had applied it (its ``on_event`` time), p50/p99 over all events.

    .venv/bin/python -m bench.invalidation --subscribers 5 --rates 100,1000 --seconds 10
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
from pathlib import Path

from bench.common import ServerProcess, free_port, progress


def start_broker(workdir: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    ini = workdir / "server.ini"
    ini.write_text(
        f"[system]\nserverPort={port}\ndashboardHttpPort=0\ndataPath={workdir / 'data'}\n"
        "numPartitions=1\nunflushThreshold=0\n[zookeeper]\nzk.zkEnable=false\n"
        "[topic=app-config-*]\nnumPartitions=2\n"
    )
    argv = [sys.executable, "-m", "pymetaq.server.cli", "server", "-f", str(ini)]
    server = ServerProcess(argv, workdir / "broker.log", port)
    server.wait_ready()
    return server, f"meta://127.0.0.1:{port}"


def publish(servers: str, topic: str, rate: int, seconds: float, threads: int) -> dict[str, float]:
    from pymetaq.client.invalidation import ConfigPublisher

    total = int(rate * seconds)
    ts: dict[str, float] = {}
    lock = threading.Lock()
    counter = iter(range(total))
    start = time.time() + 0.2
    with ConfigPublisher(servers, topic) as pub:

        def worker() -> None:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                time.sleep(max(0.0, start + i / rate - time.time()))
                t = time.time()
                pub.invalidate(f"key-{i % 1000}", event_id=f"e{i}")
                ts[f"e{i}"] = t

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    return ts


def received(log: Path) -> dict[str, float]:
    out = {}
    for line in log.read_text().splitlines():
        if line.startswith("E "):
            _e, eid, t = line.split()
            out.setdefault(eid, float(t))  # the first time (a replay comes later)
    return out


def run_rate(
    servers: str, work: Path, n: int, rate: int, seconds: float, threads: int
) -> dict[str, float]:
    topic = f"app-config-{rate}"
    db = work / f"config-{rate}.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE config (key text PRIMARY KEY, version integer NOT NULL)")
    logs = [work / f"sub-{rate}-{i}.log" for i in range(n)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.invalidation._subscriber",
                servers,
                topic,
                str(work / f"state-{rate}-{i}"),
                f"s{i}",
                str(db),
                str(log),
                "0",
            ]
        )
        for i, log in enumerate(logs)
    ]
    deadline = time.monotonic() + 120
    while not all(log.exists() and "ready" in log.read_text() for log in logs):
        if time.monotonic() > deadline:
            raise RuntimeError("subscribers did not start")
        time.sleep(0.05)
    sent = publish(servers, topic, rate, seconds, threads)
    deadline = time.monotonic() + 120
    while True:
        got = [received(log) for log in logs]
        if all(len(g) >= len(sent) for g in got) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)
    delays = sorted(
        max(g[eid] for g in got) - t for eid, t in sent.items() if all(eid in g for g in got)
    )
    if len(delays) < len(sent):
        raise RuntimeError(f"only {len(delays)} of {len(sent)} events reached every subscriber")
    span = max(sent.values()) - min(sent.values())
    return {
        "subscribers": n,
        "rate": rate,
        "events": len(sent),
        "achieved_rate": round(len(sent) / span) if span else 0,
        "p50_ms": round(delays[len(delays) // 2] * 1000, 1),
        "p99_ms": round(delays[int(len(delays) * 0.99)] * 1000, 1),
        "max_ms": round(delays[-1] * 1000, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subscribers", type=int, default=5)
    ap.add_argument("--rates", default="100,1000")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=16, help="publisher threads")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-invalidation-"))
    broker, servers = start_broker(work)
    results = []
    try:
        for rate in (int(r) for r in args.rates.split(",")):
            progress(f"{rate} invalidations/s to {args.subscribers} subscribers")
            r = run_rate(servers, work, args.subscribers, rate, args.seconds, args.threads)
            results.append({"case": "invalidation_delay", **r})
    finally:
        broker.stop()
    for r in results:
        print(json.dumps(r))
    for r in results:
        print("  ".join(f"{k}={v}" for k, v in r.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
