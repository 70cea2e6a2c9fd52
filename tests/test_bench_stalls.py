"""``python -m bench.stalls``: the window and machine arithmetic on synthetic samples, the
``--cpus`` check, and one short real run pinned to one CPU that prints the machine line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import parse_cpus
from bench.stalls import machine_in, steal_period_ms, windows
from bench.timeline import MS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def test_windows_merge_slow_samples_closer_than_the_gap() -> None:
    trace = [(0, 1 * MS), (10 * MS, 9 * MS), (12 * MS, 7 * MS), (50 * MS, 8 * MS), (51 * MS, MS)]
    assert windows(trace, 5 * MS, gap_ns=20 * MS) == [
        (10 * MS, 12 * MS, 9 * MS),
        (50 * MS, 50 * MS, 8 * MS),
    ]
    assert windows(trace, 5 * MS, gap_ns=50 * MS) == [(10 * MS, 50 * MS, 9 * MS)]


def test_machine_in_counts_steal_between_the_samples_around_a_window() -> None:
    # cumulative steal ticks sampled every 5 ms: one tick at 102 ms, two at 203 ms
    steal = [(t * MS, (1 if t > 100 else 0) + (2 if t > 200 else 0)) for t in range(0, 300, 5)]
    idle = [(108 * MS, 7 * MS), (250 * MS, 2 * MS)]  # woke at 108 ms, 7 ms late: from 101 ms
    assert machine_in(steal, idle, 100 * MS, 110 * MS) == (1, 7 * MS)
    assert machine_in(steal, idle, 200 * MS, 204 * MS) == (2, 0)
    assert machine_in(steal, idle, 120 * MS, 190 * MS) == (0, 0)  # quiet in between
    assert machine_in(steal, idle, 90 * MS, 101 * MS)[1] == 7 * MS  # the lag began at 101 ms
    assert machine_in([], [], 0, MS) == (0, 0)


def test_steal_period_is_the_median_interval_between_steal_events() -> None:
    steal, ticks = [], 0
    for t in range(0, 1000, 5):
        if t % 100 == 0 and t:
            ticks += 1
        steal.append((t * MS, ticks))
    assert steal_period_ms(steal) == 100.0
    assert steal_period_ms([(t * MS, 0) for t in range(100)]) is None


def test_parse_cpus_accepts_only_cpus_this_process_may_use() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    assert parse_cpus(str(allowed[0])) == {allowed[0]}
    with pytest.raises(ValueError, match="comma-separated"):
        parse_cpus("zero")
    with pytest.raises(ValueError, match="may run on CPUs"):
        parse_cpus(str(max(allowed) + 1000))


def test_a_short_pinned_run_reports_the_machine() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.stalls", "--system", "pymetaq", "--mode", "group",
         "--size", "100", "--rate", "2000", "--seconds", "1", "--over-ms", "1", "--cpus", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("pymetaq[group] ack_latency 100 B at 2,000/s:")
    assert "had steal or an idle process as late; steal in the run:" in lines[-1]
    bad = subprocess.run(
        [sys.executable, "-m", "bench.stalls", "--cpus", "x"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--cpus: a comma-separated list" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_suite_takes_cpus_and_its_markdown_says_so() -> None:
    from bench.markdown import render
    from bench.run import meta_record, parse_args

    args = parse_args(["--cases", "ack_latency", "--cpus", str(min(os.sched_getaffinity(0)))])
    assert args.cpus == [min(os.sched_getaffinity(0))]
    assert parse_args(["--cases", "ack_latency"]).cpus is None
    meta = meta_record(args)
    latency = {"median": 1.0, "min": 1.0, "max": 1.0}
    row = {
        "kind": "median", "case": "ack_latency", "msg_bytes": 100, "system": "pymetaq",
        "mode": "group", "p50_us": latency, "p99_us": latency, "p999_us": latency,
        "achieved_rate": latency,
    }  # fmt: skip
    text = render([meta, row])
    assert f"pinned to CPU(s) {args.cpus}." in text.splitlines()[0]
    assert "msgs/s median" not in text  # no throughput case, no throughput table
    assert "| ack_latency | 100 B | pymetaq [group] | 1 (1-1) | 1 (1-1) | 1 | 1 |" in text
    assert "pinned" not in render([meta_record(parse_args([])), row]).splitlines()[0]


def test_each_latency_sample_carries_the_vms_steal_into_the_tables() -> None:
    from bench.markdown import render
    from bench.report import aggregate, table

    def sample(repeat: int, **extra: float) -> dict:
        return {
            "kind": "sample", "system": "pymetaq", "mode": "group", "case": "ack_latency",
            "msg_bytes": 100, "repeat": repeat, "p50_us": 700.0, "p99_us": 8000.0,
            "p999_us": 9000.0, "max_us": 9500.0, "achieved_rate": 9999.0, **extra,
        }  # fmt: skip

    both = aggregate(
        [sample(0, steal_ticks=19), sample(1, steal_ticks=26), sample(2, steal_ticks=23)]
    )
    assert both[0]["steal_ticks"] == {"median": 23.0, "min": 19.0, "max": 26.0}
    assert "steal_ticks" not in aggregate([sample(0, steal_ticks=3), sample(1)])[0]  # not in all
    assert table(both).splitlines()[-1].endswith("23 (19-26)")
    assert table(aggregate([sample(0)])).splitlines()[-1].endswith(" -")
    text = render([{"kind": "meta"}, *both])
    assert "| achieved msgs/s | steal ticks |" in text
    assert "| 9,999 | 23 (19-26) |" in text
    assert "steal ticks" not in render([{"kind": "meta"}, *aggregate([sample(0)])])
