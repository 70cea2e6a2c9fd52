"""``python -m bench.timeline``: the bucket arithmetic on a synthetic run, and one short real
run whose broker was started through the probes (its fsyncs and loop lag come back)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.timeline import MS, longest_gap, rows_around

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def test_longest_gap_is_between_consecutive_acks() -> None:
    assert longest_gap([5, 10, 11, 90, 95]) == (11, 90)
    assert longest_gap([7]) == (7, 7)


def test_rows_put_each_event_in_its_bucket() -> None:
    # acks every ms from 0 to 49 ms, none from 50 to 129, then every ms again
    trace = [(t * MS - 2 * MS, 2 * MS) for t in [*range(50), *range(130, 170)]]
    broker = {
        "loop_lag": [(95 * MS, 40 * MS, "MainThread")],
        "fsync": [(100 * MS, 45 * MS, 1000)],  # ended at 100 ms, started at 55 ms
        "gc": [(60 * MS, 3 * MS, 2)],
    }
    client_lag = [(52 * MS, 7 * MS, "pymetaq-producer")]
    proc = [
        (t * MS, {"client": (10 * t, 0, 0), "broker": (t, 1 if t >= 100 else 0, 0)}, 0, 0)
        for t in range(0, 200, 5)
    ]
    gap = longest_gap(sorted(s + lat for s, lat in trace))
    assert gap == (49 * MS, 130 * MS)
    rows = rows_around(trace, broker, client_lag, [], proc, [(101 * MS, 30 * MS)], gap, 10 * MS, 2)
    by_t = {r["t_ms"]: r for r in rows}
    assert [r["t_ms"] for r in rows] == [-20.0 + 10 * k for k in range(13)]
    assert by_t[-10.0]["acks"] == 10 and by_t[0.0]["acks"] == 1 and by_t[10.0]["acks"] == 0
    assert by_t[0.0]["c_lag"] == 7.0  # t = 52 ms is in the bucket [49, 59)
    assert by_t[40.0]["b_lag"] == 40.0  # t = 95 ms in [89, 99)
    assert by_t[50.0]["fsync_n"] == 1 and by_t[50.0]["fsync_ms"] == 45.0  # ended at 100 ms
    assert by_t[10.0]["fsync_busy_ms"] == 10.0  # [59, 69) inside the fsync [55, 100)
    assert by_t[0.0]["fsync_busy_ms"] == 4.0  # [55, 59)
    assert by_t[10.0]["b_gc"] == 3.0  # gc [60, 63) inside [59, 69)
    assert by_t[50.0]["m_lag"] == 30.0
    assert by_t[-20.0]["c_flt"] == 100  # 10 faults/ms sampled every 5 ms: 10 ms = 100
    assert sum(r["b_majflt"] for r in rows) == 1


def test_a_short_real_run_reports_the_brokers_probes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.timeline", "--rate", "2000", "--seconds", "1",
         "--no-null", "--json", "--around", "2", "--client-gc", "threshold"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["latency"]["recorded"] > 0
    assert report["args"]["client_gc"] == "threshold"
    assert report["gap"]["gap_ms"] > 0
    assert len(report["rows"]) >= 5
    # group commit: the broker fsynced (its probe saw it) and its loop ran the lag probe
    assert report["probes"]["broker_fsyncs"] > 0
    assert report["probes"]["broker_lag_samples"] > 100  # a 1 ms probe over > 1 s
    assert report["gap"]["client_loops"] == ["pymetaq-producer"]
    assert "t_ms" in out.stderr and "fsync_ms" in out.stderr  # the table
