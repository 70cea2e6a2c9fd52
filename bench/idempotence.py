"""The idempotent producer against the plain one, same broker, same run:
``python bench/idempotence.py --seconds S [--rounds N] [--json]``.

One broker (``tests/_broker.py``, group commit, the default config), topic ``bench`` with 4
partitions.  Cases, each with ``idempotence`` on and off, alternating round by round (so a
neighbour's load hits both alike):

| case  | what                                                                          |
|-------|-------------------------------------------------------------------------------|
| bulk  | ``send_many`` of 1000 messages of ``--size`` bytes into one partition (round   |
|       | robin over the 4): big batches, the broker's per-batch cost is amortised      |
| small | 100 ``send_async`` of single messages, ``batch_messages=10``, then wait for   |
|       | the last: many small batches, the per-batch cost (the ``producers.idem``     |
|       | entry and its fsync) shows                                                    |

Output: one JSON line per row with ``--json`` (``case, idempotence, msgs_per_s, messages,
seconds``: the best of the rounds) and a table with the on/off ratio per case.  Timings on a
shared machine are noisy: run it more than once.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pymetaq.client import Producer  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402

TOPIC = "bench"
PARTITIONS = 4


def bulk(url: str, idem: bool, seconds: float, size: int) -> tuple[int, float]:
    values = [b"x" * size] * 1000
    sent = 0
    with Producer(url, idempotence=idem, batch_messages=1000, linger_ms=0) as p:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            p.send_many(TOPIC, values, partition=(sent // 1000) % PARTITIONS)
            sent += len(values)
        p.flush()
        return sent, time.perf_counter() - start


def small(url: str, idem: bool, seconds: float, size: int) -> tuple[int, float]:
    value = b"x" * size
    sent = 0
    with Producer(url, idempotence=idem, batch_messages=10, linger_ms=0) as p:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            handles = [p.send_async(TOPIC, value) for _ in range(100)]
            sent += 100
            handles[-1].result()
        return sent, time.perf_counter() - start


CASES = {"bulk": bulk, "small": small}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="per case, per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=100, help="message bytes")
    ap.add_argument("--json", action="store_true", help="JSON lines only")
    args = ap.parse_args(argv)
    best: dict[tuple[str, bool], tuple[float, int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        topics = {TOPIC: {"numPartitions": PARTITIONS}}
        with BrokerProcess.start(Path(tmp), topics=topics, system={"idleTimeoutMs": 0}) as b:
            url = f"meta://127.0.0.1:{b.port}"
            for _ in range(args.rounds):
                for case, fn in CASES.items():
                    for idem in (True, False):
                        n, secs = fn(url, idem, args.seconds, args.size)
                        rate = n / secs
                        if rate > best.get((case, idem), (0.0, 0, 0.0))[0]:
                            best[case, idem] = (rate, n, secs)
    rows = [
        {
            "case": case,
            "idempotence": idem,
            "msgs_per_s": round(rate),
            "messages": n,
            "seconds": round(secs, 2),
        }
        for (case, idem), (rate, n, secs) in sorted(best.items())
    ]
    for row in rows:
        print(json.dumps(row))
    if not args.json:
        print(f"\n{'case':<8}{'on msgs/s':>12}{'off msgs/s':>12}{'on/off':>8}")
        for case in CASES:
            on, off = best[case, True][0], best[case, False][0]
            print(f"{case:<8}{on:>12,.0f}{off:>12,.0f}{on / off:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
