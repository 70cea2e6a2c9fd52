"""A ``zk://`` cluster measured: rebalance times of consumer processes, producer rediscovery
after a broker loss, and one producer + one consumer through ``zk://`` against ``meta://``.

One real ZooKeeper and three broker processes (``brokerId`` 0..2, each ``t`` with 4
partitions, ``zk.zkSessionTimeoutMs`` = ``--session-ms``), then:

* **rebalance** (``--rounds`` rounds, a fresh group each): three consumer processes
  (``tests/cluster/_consumer.py``: ``Consumer("zk://...", group)``, listener mode, the same
  session timeout, ``zk_sync_time_ms=200``) settle, then ``join`` (a fourth consumer, timed
  from just before its ``start()``), ``leave`` (SIGTERM to one) and ``sigkill`` (SIGKILL to
  one: its partitions move once its session expires).  Each time runs until ZooKeeper's
  owner nodes hold MetaQ's DEFAULT assignment and every member delivers exactly its share
  (polled every 10 ms).
* **rediscovery** (``--rounds`` rounds): a producer sends one message every millisecond;
  broker ``r % 3`` is SIGKILLed.  ``dropped`` is the time until the producer's partition list
  no longer has the broker (its first failed send marks it down; the send goes elsewhere),
  ``max_latency`` the slowest send in the 3 s after the kill, ``failed`` the sends that
  failed; ``back`` the time from the restarted broker listening to the first message it
  acknowledges.
* **throughput** (``--tp-rounds`` rounds, zk:// and meta:// alternating, a fresh topic each):
  one ``Producer`` sends ``--messages`` messages of ``--size`` bytes with ``send_async`` +
  ``flush``; then one grouped ``Consumer`` (zk: ZooKeeper group and offsets; meta: a file
  offset store) polls them all, timed from the moment it owns the three partitions (joining
  the group is the rebalance figure's business).  Medians; ``ratio`` = zk / meta.

Output: JSON lines on stdout (``--json``) and a table (stderr with ``--json``).

    .venv/bin/python bench/cluster.py --rounds 5 --session-ms 2000 --json

The machine's other load makes every figure noisy: repeat runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pymetaq.client.consumer import Consumer  # noqa: E402
from pymetaq.client.producer.sync import Producer  # noqa: E402
from pymetaq.client.protocol.zk import ZkPaths  # noqa: E402
from pymetaq.offsets import FileOffsetStore  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402
from tests._services import ZooKeeperServer  # noqa: E402
from tests.cluster._workload import ConsumerMember, group_settled, partitions  # noqa: E402
from tests.cluster.conftest import new_client  # noqa: E402

P = ZkPaths()
PARTS = 4


def wait(cond: Any, timeout: float, what: str, interval: float = 0.01) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(interval)
    return time.monotonic()


class Bench:
    def __init__(self, zk: ZooKeeperServer, work: Path, args: argparse.Namespace) -> None:
        self.zk_server, self.work, self.args = zk, work, args
        self.url = f"zk://{zk.hosts}/meta"
        self.admin = new_client(zk.hosts, session_timeout_s=10)
        keys = {
            "zk.zkEnable": "true",
            "zk.zkConnect": zk.hosts,
            "zk.zkSessionTimeoutMs": args.session_ms,
            "zk.zkSyncTimeMs": 200,
        }
        topics: dict[str, dict[str, Any]] = {"t": {"numPartitions": PARTS}}
        topics.update({f"tp{i}": {"numPartitions": 1} for i in range(2 * args.tp_rounds)})
        self.brokers = [
            BrokerProcess.start(
                work,
                name=f"broker{i}",
                system={"brokerId": i, "hostName": "127.0.0.1", "unflushThreshold": 1000},
                topics=topics,
                zookeeper=keys,
            )
            for i in range(3)
        ]
        wait(lambda: len(partitions(self.admin, P, "t")) == 3 * PARTS, 30, "registered")

    def meta_servers(self) -> str:
        return ",".join(f"meta://{b.host}:{b.port}" for b in self.brokers)

    def close(self) -> None:
        for b in self.brokers:
            b.kill()
            b.__exit__(None, None, None)
        self.admin.stop()
        self.admin.close()

    # -- rebalance -----------------------------------------------------------------------
    def rebalance_round(self, r: int) -> dict[str, float]:
        group = f"g{r}"

        def member(name: str) -> ConsumerMember:
            return ConsumerMember(
                self.url, group, f"r{r}{name}", "t", self.work, session_ms=self.args.session_ms
            ).start()

        everyone = [member(n) for n in "abc"]
        live = list(everyone)
        settled = lambda: group_settled(self.admin, P, group, "t", live)  # noqa: E731
        out: dict[str, float] = {}
        try:
            wait(settled, 60, "start")
            d = member("d")
            everyone.append(d)
            live.append(d)
            t0 = next(e["t"] for e in d.events() if e["ev"] == "join")
            out["join"] = wait(settled, 60, "join") - t0
            b = live.pop(1)
            t0 = time.monotonic()
            b.terminate()
            out["leave"] = wait(settled, 60, "leave") - t0
            c = live.pop(1)
            t0 = time.monotonic()
            c.kill()
            out["sigkill"] = wait(settled, 60, "sigkill") - t0
        finally:
            for m in everyone:
                if m.alive:
                    m.terminate()
        return out

    # -- rediscovery ---------------------------------------------------------------------
    def rediscovery_round(self, r: int) -> dict[str, float]:
        victim = r % 3
        broker = self.brokers[victim]
        lat: list[tuple[float, float, int]] = []  # (sent, seconds, broker id or -1)
        stop = threading.Event()
        with Producer(self.url, retries=1, zk_session_timeout_ms=self.args.session_ms) as p:

            def load() -> None:
                while not stop.is_set():
                    t0 = time.monotonic()
                    res = p.send("t", b"x" * 100)
                    lat.append((t0, time.monotonic() - t0, res.broker_id if res.success else -1))
                    stop.wait(0.001)

            th = threading.Thread(target=load, daemon=True)
            th.start()
            try:
                wait(lambda: len(lat) > 200, 30, "load")
                killed = time.monotonic()
                broker.kill()
                cache = p.brokers.partition_cache
                dropped = wait(
                    lambda: all(tp.broker_id != victim for tp in cache.get("t", [])),
                    30,
                    "dropped",
                    0.0005,
                )
                wait(lambda: time.monotonic() > killed + 3, 10, "window")
                window = [x for x in lat if killed <= x[0] <= killed + 3]
                wait(lambda: len(partitions(self.admin, P, "t")) == 2 * PARTS, 30, "expired")
                broker.launch()
                up = time.monotonic()
                back = wait(
                    lambda: any(b == victim and t >= up for t, _, b in lat[-500:]), 30, "back"
                )
            finally:
                stop.set()
                th.join(30)
        return {
            "dropped": dropped - killed,
            "max_latency": max(s for _, s, _ in window),
            "failed": float(sum(1 for _, _, b in window if b < 0)),
            "back": back - up,
        }

    # -- throughput ----------------------------------------------------------------------
    def throughput(self, servers: str, topic: str) -> dict[str, float]:
        n, value = self.args.messages, b"v" * self.args.size
        with Producer(servers, linger_ms=1) as p:
            p.partitions(topic)
            t0 = time.monotonic()
            for _ in range(n):
                p.send_async(topic, value)
            p.flush()
            produced = n / (time.monotonic() - t0)
        store = (
            None if servers.startswith("zk://") else FileOffsetStore(self.work / f"{topic}.json")
        )
        with Consumer(servers, f"c-{topic}", store, zk_sync_time_ms=200) as c:
            c.subscribe(topic)
            wait(lambda: len(c.assignment()) == 3, 30, "assigned")  # joined (zk://), positioned
            got = 0
            t0 = time.monotonic()
            while got < n:
                got += len(c.poll(5.0))
            consumed = n / (time.monotonic() - t0)
        if store is not None:
            store.close()
        return {"produce_msgs_s": produced, "consume_msgs_s": consumed}


def summary(name: str, values: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "case": name,
        "rounds": len(values),
        "p50": round(statistics.median(values), 4),
        "max": round(max(values), 4),
        **extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--session-ms", type=int, default=2000)
    ap.add_argument("--tp-rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--skip", default="", help="comma list: rebalance,rediscovery,throughput")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    rows: list[dict[str, Any]] = []
    with ZooKeeperServer() as zk, tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        bench = Bench(zk, Path(tmp), args)
        try:
            if "rebalance" not in skip:
                times: dict[str, list[float]] = {}
                for r in range(args.rounds):
                    for k, v in bench.rebalance_round(r).items():
                        times.setdefault(k, []).append(v)
                    print(f"rebalance round {r + 1}/{args.rounds}", file=sys.stderr)
                rows += [
                    summary(f"rebalance-{k}", v, unit="s", session_ms=args.session_ms)
                    for k, v in times.items()
                ]
            if "rediscovery" not in skip:
                red: dict[str, list[float]] = {}
                for r in range(args.rounds):
                    for k, v in bench.rediscovery_round(r).items():
                        red.setdefault(k, []).append(v)
                    print(f"rediscovery round {r + 1}/{args.rounds}", file=sys.stderr)
                rows += [
                    summary(f"producer-{k}", v, unit="count" if k == "failed" else "s",
                            session_ms=args.session_ms)
                    for k, v in red.items()
                ]  # fmt: skip
            if "throughput" not in skip:
                tp: dict[str, dict[str, list[float]]] = {"zk": {}, "meta": {}}
                for r in range(args.tp_rounds):
                    for i, kind in enumerate(("zk", "meta") if r % 2 == 0 else ("meta", "zk")):
                        servers = bench.url if kind == "zk" else bench.meta_servers()
                        res = bench.throughput(servers, f"tp{2 * r + i}")
                        for k, v in res.items():
                            tp[kind].setdefault(k, []).append(v)
                    print(f"throughput round {r + 1}/{args.tp_rounds}", file=sys.stderr)
                for k in ("produce_msgs_s", "consume_msgs_s"):
                    zk_v = statistics.median(tp["zk"][k])
                    meta_v = statistics.median(tp["meta"][k])
                    rows.append(
                        {
                            "case": f"throughput-{k[:-7]}",
                            "rounds": args.tp_rounds,
                            "messages": args.messages,
                            "size": args.size,
                            "zk_msgs_s": round(zk_v),
                            "meta_msgs_s": round(meta_v),
                            "ratio": round(zk_v / meta_v, 3),
                        }
                    )
        finally:
            bench.close()
    table = sys.stderr if args.json else sys.stdout
    print(f"{'case':<26} {'p50':>10} {'max':>10}   (session {args.session_ms} ms)", file=table)
    for row in rows:
        if "p50" in row:
            print(f"{row['case']:<26} {row['p50']:>10} {row['max']:>10}  {row['unit']}", file=table)
        else:
            print(
                f"{row['case']:<26} zk {row['zk_msgs_s']:>9,} msg/s  meta {row['meta_msgs_s']:>9,}"
                f" msg/s  ratio {row['ratio']}",
                file=table,
            )
    if args.json:
        for row in rows:
            print(json.dumps(row))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
