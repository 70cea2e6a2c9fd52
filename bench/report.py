"""Aggregation and presentation of benchmark samples: medians with ranges, ratios, the text table.

A *sample* is one JSON-able dict per (system, mode, case, msg_bytes, repeat) as written by
``bench/run.py``: ``kind="sample"`` plus the metrics of ``Throughput.metrics()`` or
``Latency.metrics()``. An *aggregate* (``kind="median"``) holds, per metric, the median and the
min/max over the repeats. Ratios (``kind="ratio"``) compare pymetaq with each peer in the same run:
throughput as pymetaq msgs/s ÷ peer msgs/s (>1: pymetaq faster), latency as pymetaq p50 (and p99)
÷ peer p50 (p99) (<1: pymetaq lower).

Thread-safety: pure functions over plain data.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

THROUGHPUT_CASES = ("produce", "produce_each", "consume")
LATENCY_CASES = ("ack_latency", "e2e_latency")
THROUGHPUT_METRICS = ("msgs_per_s", "mib_per_s")
LATENCY_METRICS = ("p50_us", "p99_us", "p999_us", "max_us", "achieved_rate")
#: aggregated when every sample of a group has it: the VM's steal during the case (bench/run.py)
OPTIONAL_METRICS = ("steal_ticks",)
KEY = ("system", "mode", "case", "msg_bytes")

Record = dict[str, Any]


def metrics_of(case: str) -> tuple[str, ...]:
    return THROUGHPUT_METRICS if case in THROUGHPUT_CASES else LATENCY_METRICS


def aggregate(samples: Iterable[Record]) -> list[Record]:
    """One ``kind="median"`` record per (system, mode, case, msg_bytes), in first-seen order."""
    groups: dict[tuple[Any, ...], list[Record]] = defaultdict(list)
    for s in samples:
        groups[tuple(s[k] for k in KEY)].append(s)
    out = []
    for key, group in groups.items():
        rec: Record = {"kind": "median", **dict(zip(KEY, key)), "repeats": len(group)}
        optional = [m for m in OPTIONAL_METRICS if all(m in s for s in group)]
        for metric in (*metrics_of(str(key[2])), *optional):
            values = [float(s[metric]) for s in group]
            rec[metric] = {
                "median": round(statistics.median(values), 2),
                "min": round(min(values), 2),
                "max": round(max(values), 2),
            }
        notes = sorted({s["note"] for s in group if s.get("note")})
        if notes:
            rec["notes"] = notes
        out.append(rec)
    return out


def ratios(aggregates: Iterable[Record], ours: str = "pymetaq") -> list[Record]:
    """pymetaq ÷ peer for every (case, size) both ran, for each of pymetaq's modes; throughput
    compares msgs/s, latency p50 and p99. The ``null`` floor is no peer."""
    aggs = list(aggregates)
    out = []
    for mine in (a for a in aggs if a["system"] == ours):
        for peer in aggs:
            if peer["system"] in (ours, "null") or (peer["case"], peer["msg_bytes"]) != (
                mine["case"],
                mine["msg_bytes"],
            ):
                continue
            if peer["system"].startswith(ours) and peer["mode"] != mine["mode"]:
                continue  # a pymetaq variant (pymetaq-nometrics): mode against the same mode
            metrics = ("msgs_per_s",) if mine["case"] in THROUGHPUT_CASES else ("p50_us", "p99_us")
            for metric in metrics:
                denominator = peer[metric]["median"]
                ratio = round(mine[metric]["median"] / denominator, 3) if denominator else None
                out.append(
                    {
                        "kind": "ratio",
                        "case": mine["case"],
                        "msg_bytes": mine["msg_bytes"],
                        "metric": metric,
                        "ours": f"{ours}[{mine['mode']}]",
                        "peer": f"{peer['system']}[{peer['mode']}]",
                        "ratio": ratio,
                    }
                )
    return out


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def _range(m: dict[str, float], fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(m['median'])} ({fmt.format(m['min'])}-{fmt.format(m['max'])})"


def table(aggregates: list[Record]) -> str:
    """The human table: throughput rows, then latency rows (medians, ranges over repeats)."""
    lines = []
    thr = [a for a in aggregates if a["case"] in THROUGHPUT_CASES]
    if thr:
        lines.append(f"{'case':<12} {'size':>7}  {'system[mode]':<20} {'msgs/s median (min-max)':>32} "
                     f"{'MiB/s':>8}")  # fmt: skip
        for a in thr:
            lines.append(
                f"{a['case']:<12} {_size(a['msg_bytes']):>7}  {a['system'] + '[' + a['mode'] + ']':<20} "
                f"{_range(a['msgs_per_s']):>32} {a['mib_per_s']['median']:>8.1f}"
            )
    lat = [a for a in aggregates if a["case"] in LATENCY_CASES]
    if lat:
        lines.append("")
        lines.append(f"{'case':<12} {'size':>7}  {'system[mode]':<20} {'p50 us (min-max)':>22} "
                     f"{'p99 us (min-max)':>28} {'p99.9 us':>10} {'achieved/s':>11} "
                     f"{'steal':>13}")  # fmt: skip
        for a in lat:
            steal = _range(a["steal_ticks"]) if "steal_ticks" in a else "-"
            lines.append(
                f"{a['case']:<12} {_size(a['msg_bytes']):>7}  {a['system'] + '[' + a['mode'] + ']':<20} "
                f"{_range(a['p50_us']):>22} {_range(a['p99_us']):>28} "
                f"{a['p999_us']['median']:>10,.0f} {a['achieved_rate']['median']:>11,.0f} {steal:>13}"
            )
    for a in aggregates:
        for note in a.get("notes", []):
            lines.append(
                f"note: {a['system']}[{a['mode']}] {a['case']} {_size(a['msg_bytes'])}: {note}"
            )
    return "\n".join(lines)


def ratio_lines(rows: list[Record]) -> str:
    out = []
    for r in rows:
        better = "higher is better" if r["metric"] == "msgs_per_s" else "lower is better"
        value = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        out.append(
            f"{r['ours']} / {r['peer']}: {r['case']} {_size(r['msg_bytes'])} "
            f"{r['metric']} {value} ({better})"
        )
    return "\n".join(out)
