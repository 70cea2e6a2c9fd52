"""``python -m bench.timeline``: what happened around the longest gap without acks.

Runs the ``ack_latency`` case (open loop, ``--rate`` offered, every sample traced) of one
pymetaq mode against a broker started with probes (:mod:`bench.timeline_probes`), then the
same case of the ``null`` system (the harness floor: no broker, acks in process) in the same
run, and prints the window around pymetaq's **longest gap between two consecutive acks** in
``--bucket-ms`` buckets (default 10 ms), one row per bucket:

| column | what |
|---|---|
| ``t_ms`` | bucket start, ms from the start of the gap |
| ``sent`` / ``acks`` | messages scheduled / acknowledged in the bucket |
| ``worst_ms`` | worst publish->ack latency of the messages acked in it |
| ``c_lag`` / ``b_lag`` | largest event-loop lag (ms) of the client's loops / the broker's loop: a 1 ms ``asyncio.sleep`` that woke that much late |
| ``fsync_n`` / ``fsync_ms`` | fsync rounds that ended in the bucket / the longest (the broker's fsync histogram's observations) |
| ``c_gc`` / ``b_gc`` | ms spent in ``gc`` collections (``gc.callbacks``) in the client / the broker |
| ``c_flt`` / ``b_flt`` | minor page faults of the client / the broker (``/proc/<pid>/stat``, sampled every 5 ms); ``majflt`` in the JSON |
| ``steal`` | the machine's steal ticks (``/proc/stat``: CPU taken by the hypervisor) |
| ``m_lag`` | the largest lag (ms) of an idle process sleeping 1 ms in a loop (``MACHINE_PROBE``): the machine's share |

and a summary: the gap, what each probe saw inside it, and the null floor's own longest gap
and worst client loop lag. The JSON (``--json``: one object on stdout, the table on stderr)
holds every row and the raw events of the window.

    python -m bench.timeline --mode group --rate 100000 --size 100 --seconds 3

``--client-gc freeze`` calls ``gc.freeze()`` in the client after the broker and the probes are
up (what the broker does at start: the objects alive then are never walked again), ``off``
disables the client's cyclic GC for the case, ``threshold`` runs it with
``gc.set_threshold(50_000, 20, 20)`` (what ``docs/client.md`` suggests for an application that
sends at high rates with a callback per message): run them in a row to see what the client's
collections add to a gap.

The probes cost something (a 1 ms timer on each loop, a 5 ms ``/proc`` sampler thread in the
client): compare latencies with and without them only within one run.

Thread-safety: a single-threaded script (the samplers are its own threads).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from bisect import bisect_left, bisect_right
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import timeline_probes as probes  # noqa: E402
from bench.common import trace_latencies  # noqa: E402
from bench.systems import create, pymetaq_sys  # noqa: E402

MS = 1_000_000
#: ``--client-gc threshold``: a young generation of 50,000 objects, fewer older collections
TUNED_THRESHOLD = (50_000, 20, 20)
_AGENT = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from bench.timeline_probes import agent_main; agent_main()"
)
COLUMNS = (
    ("t_ms", 7), ("sent", 6), ("acks", 6), ("worst_ms", 9), ("c_lag", 7), ("b_lag", 7),
    ("fsync_n", 8), ("fsync_ms", 9), ("c_gc", 6), ("b_gc", 6), ("c_flt", 6), ("b_flt", 6),
    ("steal", 6), ("m_lag", 6),
)  # fmt: skip


def longest_gap(acks: list[int]) -> tuple[int, int]:
    """(start, end) of the longest interval between consecutive ack times (sorted)."""
    best = (acks[0], acks[0])
    for a, b in pairwise(acks):
        if b - a > best[1] - best[0]:
            best = (a, b)
    return best


def _overlap(events: list[tuple[int, int]], lo: int, hi: int) -> int:
    """ns of ``[lo, hi)`` covered by events ``(start, duration)``."""
    return sum(max(0, min(s + d, hi) - max(s, lo)) for s, d in events)


def _delta(samples: list[tuple[int, Any]], lo: int, hi: int, get: Any) -> int:
    """The change of a sampled counter between the last samples before ``lo`` and ``hi``."""
    times = [t for t, _ in samples]
    i, j = bisect_right(times, lo) - 1, bisect_right(times, hi) - 1
    if i < 0 or j < 0:
        return 0
    a, b = get(samples[i][1]), get(samples[j][1])
    return 0 if a is None or b is None else int(b - a)


def rows_around(
    trace: list[tuple[int, int]],
    broker: dict[str, Any],
    client_lag: list[tuple[int, int, str]],
    client_gc: list[tuple[int, int, int]],
    proc: list[tuple[int, dict[str, tuple[int, int, int]], int, int]],
    machine: list[tuple[int, int]],
    gap: tuple[int, int],
    bucket_ns: int,
    around: int,
) -> list[dict[str, Any]]:
    """One row per bucket from ``around`` buckets before the gap to ``around`` after it."""
    acks = sorted(s + lat for s, lat in trace)
    sched = sorted(s for s, _ in trace)
    by_done = sorted((s + lat, lat) for s, lat in trace)
    done_times = [d for d, _ in by_done]
    b_lag = [(t, lag) for t, lag, _ in broker["loop_lag"]]
    c_lag = [(t, lag) for t, lag, _ in client_lag]
    fsyncs = [(end - dur, dur) for end, dur, _ in broker["fsync"]]
    fsync_ends = sorted((end, dur) for end, dur, _ in broker["fsync"])
    samples = [(t, (per, steal)) for t, per, steal, _ in proc]
    rows: list[dict[str, Any]] = []
    first = gap[0] - around * bucket_ns
    last = gap[1] + around * bucket_ns
    for lo in range(first, last, bucket_ns):
        hi = lo + bucket_ns
        i, j = bisect_left(done_times, lo), bisect_left(done_times, hi)
        ends = [d for e, d in fsync_ends if lo <= e < hi]
        rows.append(
            {
                "t_ms": round((lo - gap[0]) / MS, 1),
                "sent": bisect_left(sched, hi) - bisect_left(sched, lo),
                "acks": bisect_left(acks, hi) - bisect_left(acks, lo),
                "worst_ms": round(max((lat for _, lat in by_done[i:j]), default=0) / MS, 2),
                "c_lag": round(max((g for t, g in c_lag if lo <= t < hi), default=0) / MS, 2),
                "b_lag": round(max((g for t, g in b_lag if lo <= t < hi), default=0) / MS, 2),
                "fsync_n": len(ends),
                "fsync_ms": round(max(ends, default=0) / MS, 2),
                "fsync_busy_ms": round(_overlap(fsyncs, lo, hi) / MS, 2),
                "c_gc": round(_overlap([(s, d) for s, d, _ in client_gc], lo, hi) / MS, 2),
                "b_gc": round(_overlap([(s, d) for s, d, _ in broker["gc"]], lo, hi) / MS, 2),
                "c_flt": _delta(samples, lo, hi, lambda v: _field(v, "client", 0)),
                "b_flt": _delta(samples, lo, hi, lambda v: _field(v, "broker", 0)),
                "c_majflt": _delta(samples, lo, hi, lambda v: _field(v, "client", 1)),
                "b_majflt": _delta(samples, lo, hi, lambda v: _field(v, "broker", 1)),
                "steal": _delta(samples, lo, hi, lambda v: v[1]),
                "m_lag": round(max((g for t, g in machine if lo <= t < hi), default=0) / MS, 2),
            }
        )
    return rows


def _field(v: tuple[dict[str, tuple[int, int, int]], int], name: str, k: int) -> int | None:
    got = v[0].get(name)
    return None if got is None else got[k]


def _run_pymetaq(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out = workdir / "broker-probes.json"
    agent = [sys.executable, "-c", _AGENT.format(root=str(ROOT)), str(out)]
    pymetaq_sys._server_command = lambda: agent  # the broker, started through the probes
    system = create(args.system)
    system.start(workdir)
    server = getattr(system, "_server", None)
    pids = {"client": os.getpid()}
    if server is not None:
        pids["broker"] = server.proc.pid
    sampler = probes.ProcSampler(pids).start()
    machine = MachineProbe()
    lag_from, gc_from = len(probes.LOOP_LAG), len(probes.GC_PAUSES)
    trace = trace_latencies()
    if args.client_gc == "freeze":
        gc.collect()
        gc.freeze()
    elif args.client_gc == "off":
        gc.disable()
    thresholds = gc.get_threshold()
    if args.client_gc == "threshold":
        gc.set_threshold(*TUNED_THRESHOLD)
    try:
        result = system.ack_latency(args.rate, args.size, args.batch, args.seconds, args.mode)
    finally:
        gc.enable()
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sampler.stop()
        system.stop()
        lags = machine.stop()
    broker = (
        json.loads(out.read_text()) if out.exists() else {"loop_lag": [], "gc": [], "fsync": []}
    )
    return {
        "result": result,
        "trace": list(trace),
        "broker": broker,
        "client_lag": probes.LOOP_LAG[lag_from:],
        "client_gc": probes.GC_PAUSES[gc_from:],
        "proc": sampler.rows,
        "machine": lags,
    }


class MachineProbe:
    """The idle 1 ms sleeper (``probes.MACHINE_PROBE``) in its own process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", probes.MACHINE_PROBE], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.proc.stdout.readline()  # "ready"

    def stop(self) -> list[tuple[int, int]]:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        return [(int(t), int(g)) for t, g in json.loads(out)] if out.strip() else []


def _run_null(args: argparse.Namespace) -> dict[str, Any]:
    system = create("null")
    lag_from = len(probes.LOOP_LAG)
    sampler = probes.ProcSampler({"client": os.getpid()}).start()
    trace = trace_latencies()
    try:
        result = system.ack_latency(args.rate, args.size, args.batch, args.seconds, "none")
    finally:
        sampler.stop()
    acks = sorted(s + lat for s, lat in trace)
    gap = longest_gap(acks) if acks else (0, 0)
    sampler_lag = [b[0] - a[0] - 5 * MS for a, b in pairwise(sampler.rows)]
    return {
        "metrics": result.metrics(),
        "longest_gap_ms": round((gap[1] - gap[0]) / MS, 2),
        "worst_proc_sampler_lag_ms": round(max(sampler_lag, default=0) / MS, 2),
        "client_loop_lag_max_ms": round(
            max((g for _, g, _ in probes.LOOP_LAG[lag_from:]), default=0) / MS, 2
        ),
    }


def summarize(run: dict[str, Any], gap: tuple[int, int]) -> dict[str, Any]:
    """What each probe saw inside the gap (plus one bucket either side)."""
    lo, hi = gap[0] - 10 * MS, gap[1] + 10 * MS
    broker = run["broker"]
    inside = [d for e, d, _ in broker["fsync"] if lo <= e <= hi + max(0, d)]
    return {
        "gap_ms": round((gap[1] - gap[0]) / MS, 2),
        "gap_at_ms": round((gap[0] - min(s for s, _ in run["trace"])) / MS, 1),
        "broker_loop_lag_max_ms": round(
            max((g for t, g, _ in broker["loop_lag"] if lo <= t <= hi), default=0) / MS, 2
        ),
        "client_loop_lag_max_ms": round(
            max((g for t, g, _ in run["client_lag"] if lo <= t <= hi), default=0) / MS, 2
        ),
        "client_loops": sorted({n for _, _, n in run["client_lag"]}),
        "fsync_max_ms": round(max(inside, default=0) / MS, 2),
        "fsyncs": len(inside),
        "broker_gc_ms": round(_overlap([(s, d) for s, d, _ in broker["gc"]], lo, hi) / MS, 2),
        "client_gc_ms": round(_overlap([(s, d) for s, d, _ in run["client_gc"]], lo, hi) / MS, 2),
        "machine_lag_max_ms": round(
            max((g for t, g in run["machine"] if lo <= t <= hi), default=0) / MS, 2
        ),
        "machine_lag_over_20ms_whole_run": sum(1 for _, g in run["machine"] if g > 20 * MS),
    }


def print_table(rows: list[dict[str, Any]], out: Any) -> None:
    print("".join(f"{name:>{w}}" for name, w in COLUMNS), file=out)
    for r in rows:
        print("".join(f"{r[name]:>{w}}" for name, w in COLUMNS), file=out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__.split("\n")[0])
    p.add_argument("--system", choices=("pymetaq", "pymetaq-nometrics"), default="pymetaq")
    p.add_argument("--mode", default="group", help="group, threshold, group-asyncio, ...")
    p.add_argument("--rate", type=int, default=100_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--bucket-ms", type=float, default=10.0)
    p.add_argument("--around", type=int, default=8, help="buckets shown either side of the gap")
    p.add_argument(
        "--client-gc",
        choices=("on", "freeze", "off", "threshold"),
        default="on",
        help="the client's cyclic GC during the case: as is, gc.freeze() first, disabled, "
        "or with gc.set_threshold(50_000, 20, 20)",
    )
    p.add_argument("--no-null", action="store_true", help="skip the null floor")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args(argv)
    probes.install_loop_lag()
    probes.install_gc()
    workdir = Path(tempfile.mkdtemp(prefix="pymetaq-timeline-"))
    try:
        run = _run_pymetaq(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if not run["trace"]:
        print("no sample was recorded", file=sys.stderr)
        return 1
    acks = sorted(s + lat for s, lat in run["trace"])
    gap = longest_gap(acks)
    rows = rows_around(
        run["trace"], run["broker"], run["client_lag"], run["client_gc"], run["proc"],
        run["machine"], gap, int(args.bucket_ms * MS), args.around,
    )  # fmt: skip
    report = {
        "system": f"{args.system}[{args.mode}]",
        "args": vars(args),
        "loadavg": os.getloadavg(),
        "latency": run["result"].metrics(),
        "gap": summarize(run, gap),
        "probes": {
            "broker_fsyncs": len(run["broker"]["fsync"]),
            "broker_lag_samples": len(run["broker"]["loop_lag"]),
            "broker_gcs": len(run["broker"]["gc"]),
            "client_lag_samples": len(run["client_lag"]),
            "client_gcs": len(run["client_gc"]),
        },
        "null": None if args.no_null else _run_null(args),
        "rows": rows,
    }
    out = sys.stderr if args.json else sys.stdout
    print(
        f"{report['system']} ack_latency {args.size} B at {args.rate:,}/s: {report['latency']}",
        file=out,
    )
    print(f"load average {report['loadavg']}; longest gap: {report['gap']}", file=out)
    if report["null"] is not None:
        print(f"null floor (same run): {report['null']}", file=out)
    print_table(rows, out)
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
