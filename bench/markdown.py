"""``python -m bench.markdown RESULTS.jsonl``: the run's medians, ratios and promises as Markdown
(the tables in ``docs/benchmarks.md`` are pasted from this).

Thread-safety: a single-threaded script.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.report import LATENCY_CASES, THROUGHPUT_CASES


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def _rng(m: dict[str, float]) -> str:
    return f"{m['median']:,.0f} ({m['min']:,.0f}-{m['max']:,.0f})"


def render(records: list[dict[str, Any]]) -> str:
    meds = [r for r in records if r["kind"] == "median"]
    meta = next((r for r in records if r["kind"] == "meta"), {})
    out = [
        f"Run {meta.get('started', '?')}: {meta.get('seconds')} s per case, "
        f"{meta.get('repeat')} repeats (median, min-max), batch {meta.get('batch')}, "
        f"latency offered {meta.get('rate', 0):,} msgs/s, load average at start "
        f"{', '.join(f'{x:.2f}' for x in meta.get('loadavg', []))}"
        + (f"; pinned to CPU(s) {meta['pinned_cpus']}." if meta.get("pinned_cpus") else "."),
    ]
    throughput = [a for a in meds if a["case"] in THROUGHPUT_CASES]
    if throughput:  # a table only for the kinds of case the run had
        out += [
            "",
            "| case | size | system [mode] | msgs/s median (min-max) | MiB/s |",
            "|---|---|---|---|---|",
        ]
    for a in throughput:
        out.append(
            f"| {a['case']} | {_size(a['msg_bytes'])} | {a['system']} [{a['mode']}] "
            f"| {_rng(a['msgs_per_s'])} | {a['mib_per_s']['median']:,.1f} |"
        )
    latency = [a for a in meds if a["case"] in LATENCY_CASES]
    stolen = any("steal_ticks" in a for a in latency)  # runs before 29 November 2026: none
    if latency:
        out += [
            "",
            "| case | size | system [mode] | p50 µs median (min-max) | p99 µs median (min-max) | p99.9 µs | achieved msgs/s |"
            + (" steal ticks |" if stolen else ""),
            "|---|---|---|---|---|---|---|" + ("---|" if stolen else ""),
        ]
    for a in latency:
        steal = (f" {_rng(a['steal_ticks'])} |" if "steal_ticks" in a else " - |") if stolen else ""
        out.append(
            f"| {a['case']} | {_size(a['msg_bytes'])} | {a['system']} [{a['mode']}] "
            f"| {_rng(a['p50_us'])} | {_rng(a['p99_us'])} "
            f"| {a['p999_us']['median']:,.0f} | {a['achieved_rate']['median']:,.0f} |" + steal
        )
    ratios = [r for r in records if r["kind"] == "ratio"]
    if ratios:
        out += ["", "| ratio (same run) | case | size | metric | value |", "|---|---|---|---|---|"]
        for r in ratios:
            value = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}x"
            out.append(
                f"| {r['ours']} ÷ {r['peer']} | {r['case']} | {_size(r['msg_bytes'])} "
                f"| {r['metric']} | {value} |"
            )
    skips = [r for r in records if r["kind"] in ("skip", "error")]
    for s in skips:
        out.append(f"\n{s['kind']}: {s['system']} {s.get('reason') or s.get('error')}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.markdown RESULTS.jsonl", file=sys.stderr)
        return 2
    lines = Path(args[0]).read_text().splitlines()
    print(render([json.loads(line) for line in lines if line.strip()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
