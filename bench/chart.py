"""The PNG chart of a run: throughput (top) and latency (bottom) per system and mode.

Top: msgs/s medians as grouped bars per (case, size), error bars = min..max over the repeats.
Bottom: p99 latency bars (log scale) per (case, size); the error bar spans p50..p99.9 (medians).
The ``null`` system (harness floor) stays in the table and JSON but not in the chart.
matplotlib with the Agg backend (no display needed).

Thread-safety: call from one thread (matplotlib's pyplot state is global).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from bench.report import LATENCY_CASES, THROUGHPUT_CASES, Record


def _label(a: Record) -> str:
    return f"{a['system']}[{a['mode']}]"


def _group(a: Record) -> str:
    size = a["msg_bytes"]
    return f"{a['case']}\n{size // 1024} KiB" if size % 1024 == 0 else f"{a['case']}\n{size} B"


def _bars(ax: Axes, aggs: list[Record], value: str, lower: str, upper: str, log: bool) -> None:
    groups = list(dict.fromkeys(_group(a) for a in aggs))
    series = list(dict.fromkeys(_label(a) for a in aggs))
    width = 0.8 / max(1, len(series))
    for si, name in enumerate(series):
        xs, ys, lo, hi = [], [], [], []
        for a in (a for a in aggs if _label(a) == name):
            mid = a[value]["median"]
            xs.append(groups.index(_group(a)) + (si - (len(series) - 1) / 2) * width)
            ys.append(mid)
            lo.append(max(0.0, mid - (a[lower]["median"] if lower != value else a[value]["min"])))
            hi.append(max(0.0, (a[upper]["median"] if upper != value else a[value]["max"]) - mid))
        ax.bar(xs, ys, width, label=name, yerr=[lo, hi], capsize=3)
    ax.set_xticks(range(len(groups)), groups)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")


def draw(aggregates: list[Record], path: Path, title: str) -> Path | None:
    """Writes the chart to ``path``; returns it, or None if there was nothing to draw."""
    shown = [a for a in aggregates if a["system"] != "null"]  # the floor is off any scale
    thr = [a for a in shown if a["case"] in THROUGHPUT_CASES]
    lat = [a for a in shown if a["case"] in LATENCY_CASES]
    panels = [p for p in (thr, lat) if p]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 4.5 * len(panels)), squeeze=False)
    row = 0
    if thr:
        ax = axes[row][0]
        _bars(ax, thr, "msgs_per_s", "msgs_per_s", "msgs_per_s", log=False)
        ax.set_ylabel("msgs/s (median, min-max)")
        ax.set_title("throughput")
        row += 1
    if lat:
        ax = axes[row][0]
        _bars(ax, lat, "p99_us", "p50_us", "p999_us", log=True)
        ax.set_ylabel("latency us: p99 bar, p50..p99.9 whisker")
        ax.set_title("latency (open loop)")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
