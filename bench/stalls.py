"""``python -m bench.stalls``: where in a latency run the slow messages are (stall windows).

Runs one latency case of one system with every sample traced, then prints the windows in which
latency exceeded ``--over-ms``: when each window started (ms after the first recorded message),
how long it lasted and its worst latency. A window of N ms whose latencies fall linearly from
about N ms to 0 is a stall: nothing was acked (or delivered) for N ms, then everything at once.

    python -m bench.stalls --system pymetaq --mode group --size 1024 --seconds 3

Each window also says what the machine did in it, from two probes that run through the case:
``steal``, the ticks the hypervisor took from this VM's CPUs (``/proc/stat``, sampled every
5 ms), and ``idle``, how late an idle process sleeping 1 ms in a loop woke (its own process,
free to run on any CPU). A window with steal, or with the idle process late by at least half
the window's worst latency, is marked the machine's: in it, the machine did not run even an idle
process. The last line gives the steal of the recorded part of the run and the median interval
between steal events: a hypervisor that caps the VM's CPU time per period (Linux CFS bandwidth
control: 100 ms by default) takes it at that period.

``--cpus 0`` runs the client and the server on the listed CPUs only (``sched_setaffinity``
before the server starts, which inherits it; the idle probe is started first and stays free).

Thread-safety: a single-threaded script.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from bisect import bisect_left, bisect_right
from itertools import pairwise
from pathlib import Path

from bench.common import parse_cpus, trace_latencies
from bench.systems import NAMES, create
from bench.timeline import MS, MachineProbe
from bench.timeline_probes import ProcSampler


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


def machine_in(
    steal: list[tuple[int, int]], idle: list[tuple[int, int]], lo: int, hi: int
) -> tuple[int, int]:
    """(steal ticks, the idle probe's worst lag in ns) within ``[lo, hi]``: ``steal`` holds
    (t_ns, cumulative ticks) samples; ``idle`` (woke_ns, lag_ns) events, each covering the
    ``lag`` before its wake-up."""
    ticks = 0
    if steal:
        times = [t for t, _ in steal]
        i = max(0, bisect_right(times, lo) - 1)
        j = min(len(steal) - 1, bisect_left(times, hi))
        ticks = steal[j][1] - steal[i][1]
    late = max((lag for woke, lag in idle if woke >= lo and woke - lag <= hi), default=0)
    return ticks, late


def steal_period_ms(steal: list[tuple[int, int]]) -> float | None:
    """The median interval between the samples at which steal grew, in ms (None: fewer than 3)."""
    at = [t for (_, prev), (t, v) in pairwise(steal) if v > prev]
    gaps = [b - a for a, b in pairwise(at) if b - a > 20 * MS]  # > 20 ms: a new event
    return statistics.median(gaps) / MS if len(gaps) >= 2 else None


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
    p.add_argument("--cpus", help="run client and server on these CPUs only, e.g. 0 or 0,1")
    args = p.parse_args(argv)
    cpus = None
    if args.cpus is not None:
        try:
            cpus = parse_cpus(args.cpus)
        except ValueError as exc:
            p.error(f"--cpus: {exc}")
    system = create(args.system)
    workdir = Path(tempfile.mkdtemp(prefix="pymetaq-stalls-"))
    idle = MachineProbe()  # before the pinning: the idle probe runs anywhere
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    sampler = ProcSampler({}).start()
    try:
        system.start(workdir)
        mode = args.mode or system.modes[0].name
        trace = trace_latencies()
        run = system.ack_latency if args.case == "ack_latency" else system.e2e_latency
        result = run(args.rate, args.size, args.batch, args.seconds, mode)
    finally:
        system.stop()
        sampler.stop()
        lags = idle.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    steal = [(t, st) for t, _, st, _ in sampler.rows]
    print(f"{args.system}[{mode}] {args.case} {args.size} B at {args.rate:,}/s: {result.metrics()}")
    if not trace:
        return 0
    first = min(s for s, _ in trace)
    found = windows(trace, int(args.over_ms * 1e6), gap_ns=20_000_000)
    slow = sum(1 for _, lat in trace if lat > args.over_ms * 1e6)
    print(f"{slow} of {len(trace)} samples over {args.over_ms:g} ms, in {len(found)} window(s):")
    machine = 0
    for n, (start, end, worst) in enumerate(found):
        ticks, late = machine_in(steal, lags, start, end + worst)
        theirs = ticks > 0 or late >= worst / 2
        machine += theirs
        if n < 30:
            print(
                f"  at {(start - first) / MS:8.1f} ms  lasting {(end - start) / MS:6.1f} ms  "
                f"worst {worst / MS:7.1f} ms  steal {ticks:2d}  idle {late / MS:5.1f} ms"
                + ("  (the machine)" if theirs else "")
            )
    recorded = [(t, v) for t, v in steal if first <= t]
    period = steal_period_ms(recorded)
    print(
        f"{machine} of {len(found)} window(s) had steal or an idle process as late; "
        f"steal in the run: {recorded[-1][1] - recorded[0][1] if recorded else 0} ticks"
        + (f", at a median interval of {period:.0f} ms" if period is not None else "")
    )
    return 0 if result.recorded else 1


if __name__ == "__main__":
    sys.exit(main())
