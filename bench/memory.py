"""Broker memory: ``python bench/memory.py [--topics 1000] [--partitions 4] [--consumers 10000] [--json]``.

Two cases against one real broker process (``tests/_broker.py``, group commit), its resident
set (``VmRSS`` of ``/proc/<pid>/status``) read before and after:

| case | what |
|---|---|
| ``idle_topics`` | ``--topics`` topics x ``--partitions`` partitions, each partition created by one 100-byte message (``Producer.send_many(..., partition=i)``), then idle (2 s) |
| ``longpoll`` | ``--consumers`` TCP connections, each with one long-poll ``get`` waiting at the end of a partition (``maxWaitMs`` 60 s), held while the RSS is read |

The broker runs with ``maxConnections``/``maxConnectionsPerIp`` above ``--consumers`` (all
connections come from 127.0.0.1). Output: one JSON line per case with ``--json`` (``case,
rss_before_mib, rss_after_mib, per_item_kib, items``) and a table (stderr with ``--json``).

Thread-safety: a single-threaded script.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pymetaq.client import Producer  # noqa: E402
from pymetaq.client.protocol import GetCommand, encode  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _row(case: str, before: float, after: float, items: int) -> dict[str, object]:
    per = (after - before) * 1024 / items if items else 0.0
    return {
        "case": case,
        "rss_before_mib": round(before, 1),
        "rss_after_mib": round(after, 1),
        "per_item_kib": round(per, 2),
        "items": items,
    }


def idle_topics(tmp: Path, topics: int, partitions: int) -> dict[str, object]:
    with BrokerProcess.start(tmp, topics={"mem-*": {"numPartitions": partitions}}) as b:
        assert b.proc is not None
        time.sleep(1.0)
        before = rss_mib(b.proc.pid)
        with Producer(f"meta://127.0.0.1:{b.port}") as p:
            for t in range(topics):
                for i in range(partitions):
                    p.send_many(f"mem-{t}", [b"x" * 100], partition=i)
            assert p.flush(300)
        time.sleep(2.0)
        return _row("idle_topics", before, rss_mib(b.proc.pid), topics * partitions)


def longpoll(tmp: Path, consumers: int) -> dict[str, object]:
    system = {"maxConnections": consumers + 100, "maxConnectionsPerIp": consumers + 100}
    limit = (consumers + 1000, consumers + 1000)
    with BrokerProcess.start(
        tmp, topics={"lp": {"numPartitions": 1}}, system=system, nofile=limit
    ) as b:
        assert b.proc is not None
        with Producer(f"meta://127.0.0.1:{b.port}") as p:
            end = p.send("lp", b"x" * 100).offset + 120
        time.sleep(1.0)
        before = rss_mib(b.proc.pid)
        socks: list[socket.socket] = []
        try:
            for k in range(consumers):
                s = socket.create_connection(b.address, timeout=30)
                s.sendall(encode(GetCommand("lp", f"g{k}", 0, end, 1 << 20, k + 1, 60_000)))
                socks.append(s)
            time.sleep(2.0)
            after = rss_mib(b.proc.pid)
        finally:
            for s in socks:
                s.close()
        return _row("longpoll", before, after, consumers)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=10_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pymetaq-memory-") as tmp:
        for name, run in (
            ("idle_topics", lambda d: idle_topics(d, args.topics, args.partitions)),
            ("longpoll", lambda d: longpoll(d, args.consumers)),
        ):
            d = Path(tmp) / name
            d.mkdir()
            row = run(d)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    out = sys.stderr if args.json else sys.stdout
    print(
        f"{'case':<12}{'items':>8}{'RSS before MiB':>16}{'RSS after MiB':>15}{'KiB/item':>10}",
        file=out,
    )
    for r in rows:
        print(
            f"{r['case']:<12}{r['items']:>8}{r['rss_before_mib']:>16}{r['rss_after_mib']:>15}"
            f"{r['per_item_kib']:>10}",
            file=out,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
