"""Consumer-group rebalance time on a real ZooKeeper, with member *processes*.

Each round starts three members (``tests/cluster/_member.py``) of one group over one topic
(3 brokers x 4 partitions in ``topics-sub``), then measures, one after the other:

- ``join``: a fourth member registers (its ``ids`` node; process start-up excluded);
- ``leave``: one member gets SIGTERM (clean leave: revoke, release, unregister);
- ``sigkill``: one member is SIGKILLed (its partitions move once its session expires);
- ``expiry``: a live member's session is expired (kazoo's same-session-id trick).

Each time is from the event to the moment ZooKeeper's owner nodes and every live member's
own record of what it delivers agree on the complete expected assignment (polled every 10 ms, so
figures are +-10 ms).  Output: one JSON line per event kind (``--json``) with p50/max over the
rounds, the session timeout and the retry delay; a table on stderr.

    .venv/bin/python bench/rebalance.py --rounds 5 --session-ms 2000 --strategy DEFAULT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pymetaq.client.cluster.assignors import get_assignor  # noqa: E402
from pymetaq.client.protocol.zk import TopicBroker, ZkPaths  # noqa: E402
from tests._services import ZooKeeperServer, expire_session_id  # noqa: E402
from tests.cluster._procs import MemberProcess, overlaps, settled  # noqa: E402
from tests.cluster.conftest import new_client  # noqa: E402

LAYOUT = {0: 4, 1: 4, 2: 4}
PARTS = [f"{b}-{p}" for b, n in LAYOUT.items() for p in range(n)]


def wait_settled(zk: object, live: list[MemberProcess], strategy: str, t0: float) -> float:
    assignor = get_assignor(strategy)
    expect = None if assignor.uses_owners else assignor.assign([m.cid for m in live], PARTS, {})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if settled(zk, "g", "t", live, PARTS, expect):
            return time.monotonic() - t0
        time.sleep(0.01)
    raise RuntimeError("group did not settle within 60 s")


def one_round(hosts: str, zk: object, work: Path, args: argparse.Namespace, r: int) -> dict:
    mk = lambda name: MemberProcess(  # noqa: E731
        hosts, "g", f"r{r}{name}", "t", work, strategy=args.strategy,
        session_timeout_s=args.session_ms / 1000, retry_ms=args.retry_ms,
    )  # fmt: skip
    everyone = [mk(n).start() for n in "abc"]
    live = list(everyone)
    out: dict[str, float] = {}
    try:
        wait_settled(zk, live, args.strategy, time.monotonic())
        d = mk("d").start()
        everyone.append(d)
        live.append(d)
        ready = next(e["t"] for e in d.events() if e["ev"] == "ready")
        out["join"] = wait_settled(zk, live, args.strategy, ready)
        b = live.pop(1)
        t0 = time.monotonic()
        b.terminate()
        out["leave"] = wait_settled(zk, live, args.strategy, t0)
        c = live.pop(1)
        t0 = time.monotonic()
        c.kill()
        out["sigkill"] = wait_settled(zk, live, args.strategy, t0)
        sid, pwd = live[0].session()
        t0 = time.monotonic()
        expire_session_id(hosts, sid, pwd)
        while live[0].session()[0] == sid:
            time.sleep(0.005)
        out["expiry"] = wait_settled(zk, live, args.strategy, t0)
        bad = overlaps(everyone)
        if bad:
            raise RuntimeError(f"two members delivered one partition: {bad}")
    finally:
        for m in everyone:
            if m.alive:
                m.terminate()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--session-ms", type=int, default=2000)
    ap.add_argument("--retry-ms", type=int, default=200)
    ap.add_argument("--strategy", default="DEFAULT")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    times: dict[str, list[float]] = {}
    with ZooKeeperServer() as server, tempfile.TemporaryDirectory() as tmp:
        zk = new_client(server.hosts, session_timeout_s=10)
        P = ZkPaths()
        for b, n in LAYOUT.items():
            zk.create(P.topic_sub("t", f"{b}-m"), TopicBroker(n, f"{b}-m").encode(), makepath=True)
        for r in range(args.rounds):
            for k, v in one_round(server.hosts, zk, Path(tmp), args, r).items():
                times.setdefault(k, []).append(v)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        zk.stop()
        zk.close()
    rows = []
    for kind, vals in times.items():
        rows.append(
            {
                "case": f"rebalance-{kind}",
                "strategy": args.strategy,
                "rounds": len(vals),
                "session_ms": args.session_ms,
                "retry_ms": args.retry_ms,
                "p50_s": round(statistics.median(vals), 3),
                "max_s": round(max(vals), 3),
            }
        )
    table = sys.stderr if args.json else sys.stdout
    print(f"{'event':<10} {'p50 s':>7} {'max s':>7}   (session {args.session_ms} ms)", file=table)
    for row in rows:
        print(f"{row['case'][10:]:<10} {row['p50_s']:>7.3f} {row['max_s']:>7.3f}", file=table)
    if args.json:
        for row in rows:
            print(json.dumps(row))


if __name__ == "__main__":
    main()
