"""``python -m bench.stalls``: where in a latency run the slow messages are (stall windows).

Runs one latency case of one system with every sample traced, then prints the windows in which
latency exceeded ``--over-ms``: when each window started (ms after the first recorded message),
how long it lasted and its worst latency. A window of N ms whose latencies fall linearly from
about N ms to 0 is a stall: nothing was acked (or delivered) for N ms, then everything at once.

    python -m bench.stalls --system pymetaq --mode group --size 1024 --seconds 3

Thread-safety: a single-threaded script.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench.common import trace_latencies
from bench.systems import NAMES, create


def windows(trace: list[tuple[int, int]], over_ns: int, gap_ns: int) -> list[tuple[int, int, int]]:
    """(start_ns, end_ns, worst_ns) of runs of samples slower than ``over_ns``; runs closer than
    ``gap_ns`` (by scheduled time) merge."""
    out: list[tuple[int, int, int]] = []
    for scheduled, latency in sorted(trace):
        if latency <= over_ns:
            continue
        if out and scheduled - out[-1][1] <= gap_ns:
            start, _, worst = out[-1]
            out[-1] = (start, scheduled, max(worst, latency))
        else:
            out.append((scheduled, scheduled, latency))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stalls", description=__doc__.split("\n")[0])
    p.add_argument("--system", choices=NAMES, default="pymetaq")
    p.add_argument("--mode", default=None, help="durability mode (default: the system's first)")
    p.add_argument("--case", choices=("ack_latency", "e2e_latency"), default="ack_latency")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--rate", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--over-ms", type=float, default=20.0, help="a sample slower than this is slow")
    args = p.parse_args(argv)
    system = create(args.system)
    workdir = Path(tempfile.mkdtemp(prefix="pymetaq-stalls-"))
    try:
        system.start(workdir)
        mode = args.mode or system.modes[0].name
        trace = trace_latencies()
        run = system.ack_latency if args.case == "ack_latency" else system.e2e_latency
        result = run(args.rate, args.size, args.batch, args.seconds, mode)
    finally:
        system.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.system}[{mode}] {args.case} {args.size} B at {args.rate:,}/s: {result.metrics()}")
    if not trace:
        return 0
    first = min(s for s, _ in trace)
    found = windows(trace, int(args.over_ms * 1e6), gap_ns=20_000_000)
    slow = sum(1 for _, lat in trace if lat > args.over_ms * 1e6)
    print(f"{slow} of {len(trace)} samples over {args.over_ms:g} ms, in {len(found)} window(s):")
    for start, end, worst in found[:30]:
        print(
            f"  at {(start - first) / 1e6:8.1f} ms  lasting {(end - start) / 1e6:6.1f} ms  "
            f"worst {worst / 1e6:7.1f} ms"
        )
    return 0 if result.recorded else 1


if __name__ == "__main__":
    sys.exit(main())
