"""CPU per ``send_async`` call: ``python bench/send_cpu.py [--against OTHER_PYTHON | --pure] [--json]``.

The per-message produce loop a Kafka or Redis user writes first::

    for _ in range(n):
        producer.send_async("bench", payload)   # 100 bytes, no key
    producer.flush()

Wall-clock throughput on a shared 2-core machine swings by tens of percent from run to run;
CPU time does far less, so this is how two versions of the client are compared (``--against``
names the Python of another checkout's virtualenv, measured alternately on the same broker;
``--pure`` compares this checkout with itself run as pure Python, ``PYMETAQ_NO_EXTENSIONS=1``:
what the C accelerators save).
Each round is a fresh producer process (``--face thread``: ``Producer.send_async``; ``--face
asyncio``: ``AsyncProducer.send_nowait`` on its own loop, yielding to it every ``--batch``
messages, as an asyncio program must); it reports

* ``app_ns``: the calling thread's CPU time (``time.thread_time``) per call - the cost the
  issue bounds (no lock, no future, no per-message wake-up);
* ``proc_ns``: the process's CPU time (every thread: the caller's and the I/O loop's) per
  acknowledged message, send loop plus ``flush()``;
* ``msgs_per_s``: messages over the wall time of loop + flush (noisy on a shared machine).

``--callbacks`` adds ``add_done_callback`` on every handle (the ack latency case's pattern).

One broker (``tests/_broker.py``, group commit), one partition, ``--messages`` per round, a
warm-up round per process first. ``--profile`` prints a cProfile of the send loop instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import variant_table  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402

CHILD = r"""
import asyncio, cProfile, json, pstats, sys, time
from pymetaq.client import AsyncProducer, Producer
port, total, face, batch, profile = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
callbacks = sys.argv[6] == "1"
acked = [0]
WINDOW = 32

def on_ack(handle):
    acked[0] += 1

url = f"meta://127.0.0.1:{port}"
payload = b"x" * 100
prof = cProfile.Profile() if profile else None

def thread_round(p, n):
    send = p.send_async
    w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
    if prof: prof.enable()
    if callbacks:
        for _ in range(n):
            send("bench", payload).add_done_callback(on_ack)
    else:
        for _ in range(n):
            send("bench", payload)
    if prof: prof.disable()
    t1 = time.thread_time()
    assert p.flush(120)
    return t1 - t0, time.process_time() - c0, time.perf_counter() - w0

async def async_round(p, n):
    send = p.send_nowait
    app = 0.0
    pending = []
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n // batch):
        t0 = time.thread_time()
        if prof: prof.enable()
        if callbacks:
            for _ in range(batch):
                handle = send("bench", payload)
                handle.add_done_callback(on_ack)
        else:
            for _ in range(batch):
                handle = send("bench", payload)
        if prof: prof.disable()
        app += time.thread_time() - t0
        # at most WINDOW bursts unacknowledged (as python -m bench's asyncio loop): a
        # send_nowait never blocks, so a loop faster than the broker would fill buffer_bytes
        pending.append(handle)
        if len(pending) >= WINDOW:
            await pending.pop(0)
        else:
            await asyncio.sleep(0)
    await p.flush()
    return app, time.process_time() - c0, time.perf_counter() - w0

def report(n, app, proc, wall):
    print(json.dumps({"app_ns": app / n * 1e9, "proc_ns": proc / n * 1e9, "msgs_per_s": n / wall}))

if face == "thread":
    with Producer(url, linger_ms=5, batch_messages=1000, max_in_flight=8) as p:
        p.partitions("bench")
        thread_round(p, min(total, 100_000))
        report(total, *thread_round(p, total))
else:
    async def main():
        async with AsyncProducer(url, linger_ms=5, batch_messages=1000, max_in_flight=8) as p:
            await p.publish("bench")
            await async_round(p, min(total, 100_000))
            report(total, *(await async_round(p, total)))
    asyncio.run(main())
if prof:
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)
"""

FIELDS = ("app_ns", "proc_ns", "msgs_per_s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--face", choices=("thread", "asyncio"), default="thread")
    ap.add_argument("--batch", type=int, default=1000, help="asyncio: sends between yields")
    ap.add_argument("--against", help="the python of another checkout's venv")
    ap.add_argument(
        "--pure",
        action="store_true",
        help="against this checkout without its C accelerators (PYMETAQ_NO_EXTENSIONS=1)",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile the send loop (1 round)")
    ap.add_argument(
        "--callbacks",
        action="store_true",
        help="add_done_callback on every handle (ack latency's pattern)",
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
    found: dict[str, list[dict[str, float]]] = {name: [] for name in pythons}
    rounds = 1 if args.profile else args.rounds
    with (
        tempfile.TemporaryDirectory(prefix="send-cpu-") as tmp,
        BrokerProcess.start(Path(tmp), topics={"bench": {"numPartitions": 1}}) as b,
    ):
        for r in range(rounds):
            for name, python in pythons.items():
                argv = [python, "-c", CHILD, str(b.port), str(args.messages), args.face]
                argv += [str(args.batch), "1" if args.profile else "0"]
                argv += ["1" if args.callbacks else "0"]
                env = {**os.environ, **envs.get(name, {})}
                out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
                if args.profile:
                    print(f"--- {name}\n{out.stderr}", file=sys.stderr)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                found[name].append(row)
                print(f"round {r + 1}: {name} " + _brief(row), file=sys.stderr)
    out = sys.stderr if args.json else sys.stdout
    print(f"face {args.face}, {args.messages:,} x 100 B per round, medians (min-max)", file=out)
    medians, lines = variant_table(found, FIELDS, "client", 26)
    print("\n".join(lines), file=out)
    if args.json:
        for name, rows in found.items():
            print(json.dumps({"client": name, "face": args.face, **medians[name], "runs": rows}))
    if "against" in pythons:
        for f in FIELDS:
            ratio = medians["this"][f] / medians["against"][f]
            print(f"this / against {f}: {ratio:.3f}", file=out)
    return 0


def _brief(row: dict[str, float]) -> str:
    return f"app {row['app_ns']:.0f} ns, proc {row['proc_ns']:.0f} ns, {row['msgs_per_s']:,.0f}/s"


if __name__ == "__main__":
    raise SystemExit(main())
