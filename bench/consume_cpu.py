"""CPU per consumed message: ``python bench/consume_cpu.py [--against OTHER_PYTHON | --pure] [--json]``.

Throughput on a shared 2-core machine varies by ±25 % from run to run; the CPU time the
consumer process spends per message varies far less, so this is how two versions of the client
are compared (e.g. before and after a restructuring: ``--against`` names the Python of another
checkout's virtualenv, whose ``pymetaq`` is then measured against this one's, alternating, on the
same broker and the same data; ``--pure`` measures this checkout against itself run as pure
Python, ``PYMETAQ_NO_EXTENSIONS=1``: what the C accelerators save).

One broker (``tests/_broker.py``), ``--messages`` 100-byte messages in one partition; each
round a fresh consumer process (ungrouped, ``poll()``, CRCs checked, counted with ``len()``)
reads them all (``--mode``: counting with ``len(poll())``, a ``Message`` per record with ``for m
in poll()``, or the listener path); its ``time.process_time()`` (every thread: the caller's and the I/O loop's) over
the messages is the figure.  Prints a table (stderr with ``--json``) and JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pymetaq.client import Producer  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402

CHILD = """
import sys, threading, time
from pymetaq.client.consumer import Consumer, TopicPartition
port, total = int(sys.argv[1]), int(sys.argv[2])
mode = sys.argv[3]
done = threading.Event()
seen = [0]

def listener(m):
    seen[0] += 1
    if seen[0] >= total:
        done.set()

c = Consumer(f"meta://127.0.0.1:{port}", None, initial_position="earliest")
c.subscribe("bench", listener if mode == "listener" else None)
c.assign([TopicPartition("bench", 0, 0)])
n = 0
c0 = time.process_time()
if mode == "len":
    while n < total:
        n += len(c.poll(1.0))
elif mode == "messages":
    while n < total:
        for m in c.poll(1.0):
            n += m.value is not None
else:
    c.start()
    done.wait(600)
    n = seen[0]
cpu = time.process_time() - c0
c.close()
print(cpu / n * 1e9)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=3_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", help="the python of another checkout's venv")
    ap.add_argument(
        "--pure",
        action="store_true",
        help="against this checkout without its C accelerators (PYMETAQ_NO_EXTENSIONS=1)",
    )
    ap.add_argument(
        "--mode",
        choices=("len", "messages", "listener"),
        default="len",
        help="len: count with len(poll()); messages: for m in poll(): m.value (a Message per "
        "record); listener: subscribe(topic, listener) + start(), called per message",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pythons = {"this": sys.executable}
    envs: dict[str, dict[str, str]] = {"this": {}}
    if args.against and args.pure:
        ap.error("--against and --pure: choose one")
    if args.against:
        pythons["against"] = args.against
    if args.pure:
        pythons["against"] = sys.executable
        envs["against"] = {"PYMETAQ_NO_EXTENSIONS": "1"}
    found: dict[str, list[float]] = {name: [] for name in pythons}
    with tempfile.TemporaryDirectory(prefix="consume-cpu-") as tmp:
        topics = {"bench": {"numPartitions": 1}}
        with BrokerProcess.start(Path(tmp), topics=topics) as b:
            with Producer(f"meta://127.0.0.1:{b.port}") as p:
                for _ in range(args.messages // 10_000):
                    p.send_many("bench", [b"x" * 100] * 10_000, partition=0)
                p.flush()
            total = args.messages // 10_000 * 10_000
            for r in range(args.rounds):
                for name, python in pythons.items():
                    argv = [python, "-c", CHILD, str(b.port), str(total), args.mode]
                    env = {**os.environ, **envs.get(name, {})}
                    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
                    found[name].append(float(out.stdout.strip()))
                    print(f"round {r + 1}: {name} {found[name][-1]:.0f} ns/msg", file=sys.stderr)
    out = sys.stderr if args.json else sys.stdout
    print(f"{'client':<10}{'median ns/msg':>15}{'range':>16}", file=out)
    for name, values in found.items():
        med = statistics.median(values)
        print(f"{name:<10}{med:>15.0f}{f'{min(values):.0f}-{max(values):.0f}':>16}", file=out)
        if args.json:
            print(json.dumps({"client": name, "ns_per_msg": round(med), "runs": values}))
    if "against" in pythons:
        ratio = statistics.median(found["this"]) / statistics.median(found["against"])
        print(f"this / against: {ratio:.3f}", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
