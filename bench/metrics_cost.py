"""What monitoring costs the broker, as a share of one core: ``python bench/metrics_cost.py``.

A throughput A/B (``python -m bench --systems pymetaq,pymetaq-nometrics``) cannot resolve a
few percent on a shared 2-core machine: single runs vary by 2x.  This script measures the cost
itself, in CPU time, which other work on the machine does not inflate much:

| part | how it is measured | when it runs |
|---|---|---|
| scrape | the broker process's CPU time (``/proc/<pid>/stat``) over ``--scrapes`` ``GET /metrics``, per scrape | every scrape (Prometheus's default interval: 15 s; ``--interval``) |
| idle HTTP + rate sampler | the broker's CPU time idle for ``--idle`` s with ``dashboardHttpPort`` on, minus off | always, while on |
| per fsync round | ``StoreMetrics.sync_round`` timed in-process (``timeit``) | once per group-commit round |
| per get | ``Monitor.record_sent`` timed in-process | once per ``get`` served |

The broker holds ``--topics`` x 4 partitions with data and ``--groups`` consumer groups that
fetched each partition (so ``/metrics`` has per-partition series and lag rows).  The overhead at
a workload is ``scrape/interval + idle/s + syncs/s x per-sync + gets/s x per-get`` as a share of
one CPU second, evaluated for the busiest put and get rates this broker reaches (``--syncs``,
``--gets``: ~1,000 group-commit rounds/s and ~5,000 gets/s on this machine).  Printed as a table
and, with ``--json``, one JSON object; compared against the issue's bound (3 %).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import timeit
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pymetaq.server.config import SystemConfig  # noqa: E402
from pymetaq.server.monitor.state import Monitor  # noqa: E402
from pymetaq.storage.metrics import StoreMetrics  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402

BOUND = 0.03
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def reply(f: Any) -> bytes:
    """One reply's body: ``value <len> <opaque>`` or ``result <code> <len> <opaque>``."""
    head = f.readline().split()
    return bytes(f.read(int(head[1] if head[0] == b"value" else head[2])))


def fill(address: tuple[str, int], topics: int, groups: int) -> None:
    """A record in every partition, then one get per group and partition (the lag rows)."""
    with socket.create_connection(address, timeout=30) as s:
        f = s.makefile("rb")
        record = b"x" * 100
        for t in range(topics):
            for p in range(4):
                s.sendall(f"put m{t} {p} {len(record)} 0 1\r\n".encode() + record)
                assert reply(f).endswith(b" 0"), "put failed"
        for g in range(groups):
            for t in range(topics):
                for p in range(4):
                    s.sendall(f"get m{t} g{g} {p} 0 1048576 2\r\n".encode())
                    reply(f)


def broker_cpu(base: Path, http: bool, args: argparse.Namespace) -> dict[str, float]:
    system = {"dashboardHttpPort": free_port() if http else 0, "unflushThreshold": 0}
    topics = {f"m{t}": {"numPartitions": 4} for t in range(args.topics)}
    name = "on" if http else "off"
    with BrokerProcess.start(base, system=system, topics=topics, name=name) as b:
        assert b.proc is not None
        pid = b.proc.pid
        fill(b.address, args.topics, args.groups)
        time.sleep(1.0)  # let startup work settle
        c0 = cpu_s(pid)
        time.sleep(args.idle)
        out = {"idle_cpu_per_s": (cpu_s(pid) - c0) / args.idle}
        if http:
            url = b.http_url + "metrics"
            body = urllib.request.urlopen(url, timeout=30).read()
            out["series"] = float(sum(1 for line in body.splitlines() if not line.startswith(b"#")))
            c0 = cpu_s(pid)
            for _ in range(args.scrapes):
                urllib.request.urlopen(url, timeout=30).read()
            out["scrape_cpu_s"] = (cpu_s(pid) - c0) / args.scrapes
        return out


def hot_path_costs() -> dict[str, float]:
    metrics = StoreMetrics()
    n = 200_000
    per_sync = (
        min(timeit.repeat(lambda: metrics.sync_round(0.0021, 65536, 640), number=n, repeat=5)) / n
    )
    monitor = Monitor(SystemConfig())
    per_get = (
        min(timeit.repeat(lambda: monitor.record_sent("t", 3, 1048576), number=n, repeat=5)) / n
    )
    return {"per_sync_s": per_sync, "per_get_s": per_get}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=25, help="topics of 4 partitions")
    ap.add_argument("--groups", type=int, default=4, help="consumer groups with lag rows")
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU sampling")
    ap.add_argument("--interval", type=float, default=15.0, help="scrape interval, seconds")
    ap.add_argument("--syncs", type=float, default=1000.0, help="group-commit rounds per second")
    ap.add_argument("--gets", type=float, default=5000.0, help="gets per second")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="metrics-cost-") as tmp:
        on = broker_cpu(Path(tmp), True, args)
        off = broker_cpu(Path(tmp), False, args)
    hot = hot_path_costs()
    idle = max(0.0, on["idle_cpu_per_s"] - off["idle_cpu_per_s"])
    parts = {
        "scrape": on["scrape_cpu_s"] / args.interval,
        "idle HTTP + sampler": idle,
        "fsync-round histograms": args.syncs * hot["per_sync_s"],
        "per-get accounting": args.gets * hot["per_get_s"],
    }
    total = sum(parts.values())
    doc = {
        "partitions": args.topics * 4,
        "groups": args.groups,
        "series": int(on["series"]),
        "scrape_cpu_ms": round(on["scrape_cpu_s"] * 1000, 3),
        "idle_cpu_on_per_s": round(on["idle_cpu_per_s"], 5),
        "idle_cpu_off_per_s": round(off["idle_cpu_per_s"], 5),
        "per_sync_us": round(hot["per_sync_s"] * 1e6, 3),
        "per_get_us": round(hot["per_get_s"] * 1e6, 3),
        "interval_s": args.interval,
        "shares": {k: round(v, 6) for k, v in parts.items()},
        "total_share": round(total, 6),
        "bound": BOUND,
        "within_bound": total < BOUND,
    }
    if args.json:
        print(json.dumps(doc))
    out = sys.stderr if args.json else sys.stdout
    print(
        f"broker: {doc['partitions']} partitions, {args.groups} groups, {doc['series']} series;"
        f" scrape {doc['scrape_cpu_ms']} ms CPU; idle CPU on {doc['idle_cpu_on_per_s']:.4f}"
        f" s/s, off {doc['idle_cpu_off_per_s']:.4f} s/s; sync_round {doc['per_sync_us']} us;"
        f" record_sent {doc['per_get_us']} us",
        file=out,
    )
    print(f"{'part':<26}{'share of one core':>18}", file=out)
    for k, v in parts.items():
        print(f"{k:<26}{v * 100:>17.3f}%", file=out)
    verdict = "within" if total < BOUND else "OVER"
    print(f"{'total':<26}{total * 100:>17.3f}%   ({verdict} the {BOUND:.0%} bound)", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
