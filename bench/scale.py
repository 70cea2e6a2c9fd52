"""Several brokers on one machine: ``python bench/scale.py [--brokers 1,2,4] [--json]``.

MetaQ scales a machine by running several broker processes (each one Python process, so one
core's worth of work), registered side by side. For each broker count N this starts N broker
subprocesses (their own data directories, durable group commit), then N producer processes
(one per broker, ``Producer.send_many`` of 1,000 100-byte messages per call for ``--seconds``),
all starting together, then N consumer processes (one per broker, ``poll()`` from the start
until they have read what was produced). Aggregate msgs/s = all messages ÷ the wall time from
the common start to the last process's end. Every process reports its CPU time, so the table
also shows how much of the machine's cores the run used: with more busy processes than cores,
the aggregate stops growing (this machine has ``os.cpu_count()`` cores).

Prints one JSON object per broker count (``--json``) and a table.

Thread-safety: a single-threaded script (the work is in subprocesses).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import progress, text_table  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402

TOPIC = "scale"

PRODUCE = """
import sys, time
from pymetaq.client import Producer
url, seconds, start_at = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
values = [b"x" * 100] * 1000
with Producer(url) as p:
    while time.time() < start_at:
        time.sleep(0.001)
    t0, n, handles = time.time(), 0, []
    while time.time() - t0 < seconds:
        handles.append(p.send_many("scale", values, partition=0))
        n += len(values)
        if len(handles) >= 8:
            assert all(r.success for r in handles.pop(0).result(60))
    for h in handles:
        assert all(r.success for r in h.result(60))
print(n, time.time(), time.process_time())
"""

CONSUME = """
import sys, time
from pymetaq.client import Consumer, TopicPartition
url, want, start_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with Consumer(url, None, initial_position="earliest") as c:
    c.assign([TopicPartition("scale", 0, 0)])
    while time.time() < start_at:
        time.sleep(0.001)
    n = 0
    while n < want:
        n += len(c.poll(5.0))
print(n, time.time(), time.process_time())
"""


def _run_all(code: str, args: list[list[str]], start_at: float) -> tuple[list[int], float, float]:
    """Run one client process per argument list; (messages of each, last end time, CPU s)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *a, str(start_at)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for a in args
    ]
    counts, last, cpu = [], 0.0, 0.0
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"a client process failed (exit {p.returncode})")
        n, end, used = out.split()
        counts.append(int(n))
        last, cpu = max(last, float(end)), cpu + float(used)
    return counts, last, cpu


def _cpu_s(b: BrokerProcess) -> float:
    assert b.proc is not None
    with open(f"/proc/{b.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(n: int, seconds: float, tmp: Path) -> dict[str, Any]:
    progress(f"{n} broker(s)")
    with ExitStack() as stack:
        brokers = [
            stack.enter_context(
                BrokerProcess.start(
                    tmp,
                    name=f"n{n}-b{i}",
                    system={"unflushThreshold": 0},
                    topics={TOPIC: {"numPartitions": 1}},
                )
            )
            for i in range(n)
        ]
        urls = [f"meta://{b.host}:{b.port}" for b in brokers]
        cpu0 = sum(_cpu_s(b) for b in brokers)
        start_at = time.time() + 2.0  # every producer connected by then
        produced, end, cpu_p = _run_all(PRODUCE, [[u, str(seconds)] for u in urls], start_at)
        produce_s = end - start_at
        cpu1 = sum(_cpu_s(b) for b in brokers)
        start_at = time.time() + 2.0
        want = [[u, str(k)] for u, k in zip(urls, produced)]  # each broker's own count
        consumed, end, cpu_c = _run_all(CONSUME, want, start_at)
        consume_s = end - start_at
        cpu2 = sum(_cpu_s(b) for b in brokers)
    return {
        "brokers": n,
        "produce_msgs_s": round(sum(produced) / produce_s),
        "produce_cores_used": round((cpu_p + cpu1 - cpu0) / produce_s, 2),
        "consume_msgs_s": round(sum(consumed) / consume_s),
        "consume_cores_used": round((cpu_c + cpu2 - cpu1) / consume_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", default="1,2,4", help="broker counts, comma separated")
    ap.add_argument("--seconds", type=float, default=5.0, help="produce time per run")
    ap.add_argument("--json", action="store_true", help="one JSON line per broker count")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pymetaq-scale-") as tmp:
        for n in (int(x) for x in args.brokers.split(",")):
            r = one(n, args.seconds, Path(tmp))
            rows.append(r)
            if args.json:
                print(json.dumps(r), flush=True)
    base = rows[0]
    table = text_table(
        ["brokers", "produce msgs/s", "x", "cores used", "consume msgs/s", "x", "cores used"],
        [
            [
                r["brokers"],
                f"{r['produce_msgs_s']:,}",
                f"{r['produce_msgs_s'] / base['produce_msgs_s']:.2f}",
                r["produce_cores_used"],
                f"{r['consume_msgs_s']:,}",
                f"{r['consume_msgs_s'] / base['consume_msgs_s']:.2f}",
                r["consume_cores_used"],
            ]
            for r in rows
        ],
    )
    print(table, file=sys.stderr if args.json else sys.stdout)
    print(f"(this machine: {os.cpu_count()} cores)", file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
