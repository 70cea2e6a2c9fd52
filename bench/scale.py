"""Aggregate throughput with several broker processes: ``python bench/scale.py [--brokers 1,2,4]``.

MetaQ scales a machine by running several brokers on it (one process per broker; a ``zk://``
cluster registers them all). For each count N in ``--brokers``: N broker processes
(``tests/_broker.py``, ``brokerId`` 0..N-1, group commit, one partition per topic), then

* **produce**: N producer processes at once, process k sending ``--seconds`` of
  ``send_many`` batches of ``--batch`` 100-byte messages (``--size``) to broker k; the figure is
  the sum of their acknowledged messages over the longest of their times (start to last ack);
* **consume**: N consumer processes at once, process k reading broker k's partition from offset
  0 to the end with ``Consumer.poll()`` (CRCs checked); the sum over the longest time.

Each client process talks to one broker, as MetaQ clients spread over a cluster's partitions.
On a machine with C cores the brokers and clients share them: with 2 cores, N brokers + N
clients compete for 2. Output: a table, and JSON lines with ``--json`` (``brokers, case,
msgs_per_s, per_process``).

Thread-safety: a single-threaded script (clients are subprocesses).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests._broker import BrokerProcess  # noqa: E402

PRODUCER = r"""
import json, sys, time
from pymetaq.client import Producer
port, seconds, batch, size = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
values = [b"x" * size] * batch
with Producer(f"meta://127.0.0.1:{port}", linger_ms=5, batch_messages=batch, max_in_flight=8) as p:
    p.partitions("scale")
    sys.stdout.write("ready\n"); sys.stdout.flush(); sys.stdin.readline()
    sent, start = 0, time.perf_counter()
    while time.perf_counter() < start + seconds:
        p.send_many("scale", values)
        sent += batch
    assert p.flush(120)
    elapsed = time.perf_counter() - start
print(json.dumps({"messages": sent, "seconds": elapsed}))
"""

CONSUMER = r"""
import json, sys, time
from pymetaq.client.consumer import Consumer, TopicPartition
port, total, broker = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = Consumer(f"meta://127.0.0.1:{port}", None, initial_position="earliest")
c.subscribe("scale")
c.assign([TopicPartition("scale", broker, 0)])
sys.stdout.write("ready\n"); sys.stdout.flush(); sys.stdin.readline()
n, start = 0, time.perf_counter()
while n < total:
    n += len(c.poll(1.0))
elapsed = time.perf_counter() - start
c.close()
print(json.dumps({"messages": n, "seconds": elapsed}))
"""


def _together(argvs: list[list[str]]) -> list[dict[str, float]]:
    """Start every client, wait until each is ready, release them at once, collect results."""
    procs = [
        subprocess.Popen(a, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for a in argvs
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            stdout, _ = p.communicate(timeout=600)
            if p.returncode:
                raise RuntimeError(f"client exited with {p.returncode}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def run(n: int, tmp: Path, args: argparse.Namespace) -> list[dict[str, object]]:
    py = sys.executable
    with contextlib.ExitStack() as stack:
        brokers = [
            stack.enter_context(
                BrokerProcess.start(
                    tmp / f"b{k}", system={"brokerId": k}, topics={"scale": {"numPartitions": 1}}
                )
            )
            for k in range(n)
        ]
        rows: list[dict[str, object]] = []
        produced = _together(
            [
                [
                    py,
                    "-c",
                    PRODUCER,
                    str(b.port),
                    str(args.seconds),
                    str(args.batch),
                    str(args.size),
                ]
                for b in brokers
            ]
        )
        consumed = _together(
            [
                [py, "-c", CONSUMER, str(b.port), str(int(r["messages"])), str(k)]
                for k, (b, r) in enumerate(zip(brokers, produced, strict=True))
            ]
        )
        for case, results in (("produce", produced), ("consume", consumed)):
            total = sum(r["messages"] for r in results)
            longest = max(r["seconds"] for r in results)
            rows.append(
                {
                    "brokers": n,
                    "case": case,
                    "msgs_per_s": round(total / longest),
                    "per_process": [round(r["messages"] / r["seconds"]) for r in results],
                }
            )
        return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", default="1,2,4", help="comma list of broker counts")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="pymetaq-scale-") as tmp:
        for n in (int(x) for x in args.brokers.split(",") if x):
            d = Path(tmp) / f"n{n}"
            d.mkdir()
            for row in run(n, d, args):
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
    out = sys.stderr if args.json else sys.stdout
    print(f"{'brokers':>8} {'case':<8} {'msgs/s (sum)':>14}  per process", file=out)
    for r in rows:
        per = ", ".join(f"{v:,}" for v in r["per_process"])  # type: ignore[attr-defined]
        print(f"{r['brokers']:>8} {r['case']:<8} {r['msgs_per_s']:>14,}  {per}", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
