"""``python bench/poll_timeline.py``: one short real run cuts every timed poll into phases that
add up to the whole call, and reports how much of the read-ahead reply had arrived."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mode", ["len", "messages"])
def test_a_short_run_times_every_phase(mode: str) -> None:
    argv = [sys.executable, "bench/poll_timeline.py", "--messages", "120000", "--mode", mode]
    out = subprocess.run(
        [*argv, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    phases = {row["phase"]: row for row in lines if "phase" in row}
    assert list(phases) == [
        "to_loop",
        "first_data",
        "receive",
        "scan_apply",
        "to_caller",
        "poll",
        "iterate",
    ]
    assert all(
        row["median_us"] >= 0 and row["p90_us"] >= row["median_us"] for row in phases.values()
    )
    parts = sum(
        phases[p]["median_us"]
        for p in ("to_loop", "first_data", "receive", "scan_apply", "to_caller")
    )
    assert phases["poll"]["median_us"] > 0 and parts > 0
    (summary,) = [row for row in lines if "polls" in row]
    assert summary["polls"] >= 5  # 120,000 messages of 100 bytes: 13 replies of 1 MiB
    assert summary["queued_median_bytes"] >= 0  # FIONREAD was read
    assert f"mode {mode}:" in out.stderr and "queued at poll()" in out.stderr


def test_the_p90_is_never_below_the_median_however_few_polls() -> None:
    """Under load a run can time only a few polls; with an even count the median averages the
    two middle values, and the lower nearest index the script once used for its p90 fell below
    it (two polls: p90 1.0 against median 1.5). The nearest-rank percentile cannot."""
    import statistics

    from bench.common import percentile

    for n in range(1, 40):
        values = sorted(float((i * 7919) % 101) for i in range(n))
        assert percentile(values, 90) >= statistics.median(values), n
