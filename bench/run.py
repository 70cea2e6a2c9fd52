"""``python -m bench``: runs every case for every system, prints a table, writes JSON lines + a PNG.

Order of a run: start every requested system (a missing binary or client becomes a skip note),
then for each repeat, case and payload size run each system in turn (so machine noise spreads
over all systems instead of landing on one), stop everything, aggregate medians with min-max
ranges, print the table, the durability promises and the pymetaq ÷ peer ratios.

Outputs in ``--out`` (default ``bench/out/``): ``results-<stamp>.jsonl`` — a ``meta`` line, one
``sample`` line per (system, mode, case, size, repeat), ``skip``/``error`` lines, one ``median``
line per (system, mode, case, size), ``ratio`` lines — and ``chart-<stamp>.png``. Progress goes to
stderr, the table to stdout.

Thread-safety: a single-threaded script.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench import report
from bench.common import BenchError, Latency, Throughput, machine_ticks, parse_cpus, progress
from bench.systems import DEFAULT, NAMES, System, create

CASES = ("produce", "produce_each", "consume", "ack_latency", "e2e_latency")
DEFAULT_OUT = Path(__file__).resolve().parent / "out"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="duration of each case (default 3)")
    p.add_argument(
        "--systems",
        default=",".join(DEFAULT),
        help=f"comma list of {', '.join(NAMES)} (default: {','.join(DEFAULT)}; null = harness floor, fsync = disk floor for acks)",
    )
    p.add_argument("--cases", default=",".join(CASES), help="comma list (default: all)")
    p.add_argument("--sizes", default="100,1024", help="payload bytes, comma list")
    p.add_argument("--repeat", type=int, default=1, help="repeats; medians with min-max ranges")
    p.add_argument("--rate", type=int, default=10_000, help="offered msgs/s for latency cases")
    p.add_argument("--batch", type=int, default=1000, help="messages per batch/pipeline/fetch")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument(
        "--cpus",
        help="run the clients and every server on these CPUs only, e.g. 0 (see docs/benchmarks.md)",
    )
    args = p.parse_args(argv)
    if args.cpus is not None:
        try:
            args.cpus = sorted(parse_cpus(args.cpus))
        except ValueError as exc:
            p.error(f"--cpus: {exc}")
    args.systems = _choices(args.systems, NAMES, p)
    args.cases = _choices(args.cases, CASES, p)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.seconds <= 0 or args.repeat < 1 or args.rate < 1 or args.batch < 1:
        p.error("--seconds, --repeat, --rate and --batch must be positive")
    if any(s < 8 for s in args.sizes):
        p.error("payloads must be at least 8 bytes (the e2e timestamp)")
    return args


def _choices(text: str, allowed: tuple[str, ...], p: argparse.ArgumentParser) -> list[str]:
    chosen = [c for c in text.split(",") if c]
    bad = [c for c in chosen if c not in allowed]
    if bad:
        p.error(f"unknown {bad}; choose from {', '.join(allowed)}")
    return chosen


def start_systems(names: list[str], workdir: Path) -> tuple[list[System], list[dict[str, Any]]]:
    """Starts each system; one that cannot start is stopped again and becomes a skip record."""
    started: list[System] = []
    skips: list[dict[str, Any]] = []
    for name in names:
        system: System | None = None
        try:
            system = create(name)
            progress(f"starting {name}")
            system.start(workdir / name)
            started.append(system)
        except Exception as exc:  # a missing or broken system must not take the others down
            reason = str(exc) if isinstance(exc, BenchError) else f"failed to start: {exc!r}"
            progress(f"SKIP {name}: {reason}")
            skips.append({"kind": "skip", "system": name, "reason": reason})
            if system is not None:
                with contextlib.suppress(Exception):
                    system.stop()
    return started, skips


def run_case(system: System, case: str, size: int, mode: str, args: argparse.Namespace) -> Any:
    if case == "produce":
        return system.produce(size, args.batch, args.seconds, mode)
    if case == "produce_each":
        return system.produce_each(size, args.batch, args.seconds, mode)
    if case == "consume":
        return system.consume(size, args.batch, args.seconds, mode)
    if case == "ack_latency":
        return system.ack_latency(args.rate, size, args.batch, args.seconds, mode)
    return system.e2e_latency(args.rate, size, args.batch, args.seconds, mode)


def _modes(system: System, case: str) -> list[str]:
    """Every durability mode, except for consume (reading does not depend on it): the default."""
    names = [m.name for m in system.modes]
    return names[:1] if case == "consume" else names


def run_matrix(
    systems: list[System], args: argparse.Namespace, out: Any
) -> tuple[list[dict[str, Any]], int]:
    """Runs repeat x case x size x system x mode; writes each sample line as it lands."""
    samples: list[dict[str, Any]] = []
    errors = 0
    for repeat in range(args.repeat):
        for case in args.cases:
            for size in args.sizes:
                for system in systems:
                    if case not in system.cases:
                        continue  # e.g. nats has no per-message pipelined publish
                    for mode in _modes(system, case):
                        label = f"{system.name}[{mode}] {case} {size}B repeat {repeat + 1}"
                        progress(label)
                        row: dict[str, Any] = {
                            "system": system.name, "mode": mode, "case": case,
                            "msg_bytes": size, "repeat": repeat,
                        }  # fmt: skip
                        ticks_before = machine_ticks()
                        try:
                            result = run_case(system, case, size, mode, args)
                        except Exception as exc:  # one failing case must not stop the run
                            errors += 1
                            progress(f"ERROR {label}: {exc!r}")
                            row |= {"kind": "error", "error": repr(exc),
                                    "traceback": traceback.format_exc(limit=5)}  # fmt: skip
                            _write(out, row)
                            continue
                        assert isinstance(result, Throughput | Latency)
                        row = {"kind": "sample", **row, **result.metrics()}
                        ticks_after = machine_ticks()
                        if ticks_before is not None and ticks_after is not None:
                            row["steal_ticks"] = ticks_after[0] - ticks_before[0]
                        progress(f"  -> {_brief(row)}")
                        samples.append(row)
                        _write(out, row)
    return samples, errors


def _brief(row: dict[str, Any]) -> str:
    if "msgs_per_s" in row:
        return f"{row['msgs_per_s']:,.0f} msgs/s {row['mib_per_s']:.1f} MiB/s"
    return f"p50 {row['p50_us']:,.0f} us p99 {row['p99_us']:,.0f} us p99.9 {row['p999_us']:,.0f} us"


def _write(out: Any, record: dict[str, Any]) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()


def meta_record(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "kind": "meta",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "seconds": args.seconds,
        "repeat": args.repeat,
        "rate": args.rate,
        "batch": args.batch,
        "sizes": args.sizes,
        "cases": args.cases,
        "systems": args.systems,
        "pinned_cpus": args.cpus,
    }


def durability_lines(systems: list[System]) -> list[dict[str, Any]]:
    return [
        {"kind": "durability", "system": s.name, "mode": m.name, "promise": m.durability}
        for s in systems
        for m in s.modes
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    jsonl = args.out / f"results-{stamp}.jsonl"
    workdir = Path(tempfile.mkdtemp(prefix="pymetaq-bench-"))
    if args.cpus is not None:  # before any server starts: each inherits it
        os.sched_setaffinity(0, args.cpus)
    with jsonl.open("w") as out:
        _write(out, meta_record(args))
        systems, skips = start_systems(args.systems, workdir)
        try:
            for rec in [*skips, *durability_lines(systems)]:
                _write(out, rec)
            samples, errors = run_matrix(systems, args, out)
        finally:
            for system in systems:
                progress(f"stopping {system.name}")
                try:
                    system.stop()
                except Exception as exc:
                    progress(f"stopping {system.name} failed: {exc!r}")
            shutil.rmtree(workdir, ignore_errors=True)
        aggregates = report.aggregate(samples)
        ratio_rows = report.ratios(aggregates)
        for rec in [*aggregates, *ratio_rows]:
            _write(out, rec)
    print(_summary(args, systems, skips, aggregates, ratio_rows))
    print(f"\nJSON lines: {jsonl}")
    if not args.no_chart and aggregates:
        from bench.chart import draw  # matplotlib only when a chart is wanted

        title = (f"{args.seconds:g} s/case, {args.repeat} repeat(s), latency offered "
                 f"{args.rate:,} msgs/s, batch {args.batch}, {os.cpu_count()} CPUs")  # fmt: skip
        png = draw(aggregates, args.out / f"chart-{stamp}.png", title)
        if png is not None:
            print(f"chart: {png}")
    return 1 if errors else 0


def _summary(
    args: argparse.Namespace,
    systems: list[System],
    skips: list[dict[str, Any]],
    aggregates: list[dict[str, Any]],
    ratio_rows: list[dict[str, Any]],
) -> str:
    parts = [
        f"\n{args.seconds:g} s per case, {args.repeat} repeat(s) (median, min-max), batch "
        f"{args.batch}; latency cases open-loop at {args.rate:,} msgs/s offered, measured from "
        "each message's scheduled send time (no coordinated omission)\n",
        report.table(aggregates),
        "\nwhat each system promises when it acks:",
        *(f"  {s.name}[{m.name}]: {m.durability}" for s in systems for m in s.modes),
    ]
    if skips:
        parts += ["\nskipped:", *(f"  {s['system']}: {s['reason']}" for s in skips)]
    if ratio_rows:
        parts += ["\nratios in this run (pymetaq / peer):", report.ratio_lines(ratio_rows)]
    return "\n".join(parts)
