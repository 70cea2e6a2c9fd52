"""Resource attacks on a broker, measured: ``python bench/attacks.py [--json] [--legacy]``.

Runs every attack of ``tests/server/_attacks.py`` against a fresh broker subprocess each (so one
attack's leftovers do not colour the next), with a well-behaved client (another source IP,
127.0.0.2) putting and reading back messages throughout, and prints one JSON line per attack
(``--json``) and a table: inputs, the attack's outcome, the good client's acknowledged / lost /
corrupt messages, hangs and errors, its round-trip latency (p50/p99/max ms), the broker's RSS
(MB) and descriptors before / peak / after, and whether it crashed.

The broker starts with RLIMIT_NOFILE soft 1024 / hard 4096 (a common default: the broker raises
the soft limit to the hard one at start) and the limits ``tests/server/_attacks.LIMITS`` (those
``tests/server/test_resources.py`` asserts under).  ``--legacy`` leaves them out (for measuring
a tree from before they existed).

Thread-safety: a single-threaded script (the attack helpers start their own threads).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import text_table  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402
from tests.server._attacks import (  # noqa: E402
    LIMITS,
    NOFILE,
    TOPICS,
    AttackReport,
    drip,
    half_bodies,
    pattern_topics,
    pipelined_gets,
    run_attack,
    unknown_stat_topics,
)

ATTACKS = {
    "pattern_topics": pattern_topics(3000),
    "pipelined_gets": pipelined_gets(),
    "unknown_stat_topics": unknown_stat_topics(),
    "half_bodies": half_bodies(),
    "drip": drip(),
}


def run_one(name: str, legacy: bool, tmp: Path) -> AttackReport:
    system: dict[str, Any] = {"idleTimeoutMs": 600_000}
    if not legacy:
        system.update(LIMITS)
    with BrokerProcess.start(tmp, topics=TOPICS, system=system, name=name, nofile=NOFILE) as b:
        report = run_attack(b, name, ATTACKS[name], settle_s=4.0)
        if report.crashed:
            print(b.log_text()[-3000:], file=sys.stderr)
        return report


COLUMNS = (
    ("attack", lambda r: r.name),
    ("acked", lambda r: r.acked),
    ("lost", lambda r: r.lost),
    ("corrupt", lambda r: r.corrupt),
    ("crashed", lambda r: r.crashed),
    ("hangs", lambda r: r.hangs),
    ("good errors", lambda r: sum(r.good_errors.values())),
    ("p50/p99/max ms", lambda r: f"{r.p50_ms}/{r.p99_ms}/{r.max_ms}"),
    ("RSS MB base/peak/after", lambda r: f"{r.rss_base_mb}/{r.rss_peak_mb}/{r.rss_after_mb}"),
    ("fds base/peak/p90/after", lambda r: f"{r.fds_base}/{r.fds_peak}/{r.fds_p90}/{r.fds_after}"),
)


def table(reports: list[AttackReport]) -> str:
    lines = [text_table([h for h, _ in COLUMNS], [[f(r) for _, f in COLUMNS] for r in reports])]
    lines.append("")
    lines += [
        f"{r.name}: {r.inputs}; outcome {r.outcome}; good errors {r.good_errors}" for r in reports
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/attacks.py", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="JSON lines on stdout, table on stderr")
    p.add_argument("--legacy", action="store_true", help="omit the new [system] keys")
    p.add_argument("--only", default="", help="comma list of attacks (default: all)")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(ATTACKS)
    reports = []
    with tempfile.TemporaryDirectory(prefix="pymetaq-attacks-") as tmp:
        for name in names:
            print(f"attack {name} ...", file=sys.stderr, flush=True)
            report = run_one(name, args.legacy, Path(tmp))
            reports.append(report)
            if args.json:
                print(json.dumps(report.row()), flush=True)
    print(table(reports), file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
