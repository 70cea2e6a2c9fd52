"""Broker memory at scale: ``python bench/memory.py [--json] [--topics N] [--consumers N]``.

Two measurements, each on a fresh broker subprocess (``pymetaq server``), reading its RSS
(``VmRSS``) and descriptor count from ``/proc``:

- **idle topics**: ``--topics`` configured topics (default 1,000) of ``--partitions`` each
  (default 4): RSS and descriptors after start (nothing written; a partition's store is created
  by its first put), then after one 100-byte put to every partition (every store open: a mapped,
  preallocated segment each), and per partition;
- **long-poll consumers**: ``--consumers`` connections (default 10,000) from this process, each
  with one long-poll ``get`` waiting on an empty partition (``maxWaitMs`` 300,000): RSS and
  descriptors with the broker idle, every 2,500 connections, and per connection; then one put
  wakes them all and the time until every connection has its reply (the fan-out) is measured.

The broker runs with RLIMIT_NOFILE raised to the hard limit and ``maxConnections`` /
``maxConnectionsPerIp`` above the number of connections; this process raises its own soft limit
too (it holds every consumer socket). Prints one JSON object (``--json``) and a table. The
figures are memory, not time: a loaded machine barely moves them (the fan-out time excepted).

Thread-safety: a single-threaded script (one selector for the consumer sockets).
"""

from __future__ import annotations

import argparse
import json
import resource
import selectors
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import progress, text_table  # noqa: E402
from pymetaq.client.protocol import ResultReply  # noqa: E402
from pymetaq.storage.record import encode_record  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402
from tests.server._attacks import fd_count, rss_kb  # noqa: E402
from tests.server._helpers import Wire  # noqa: E402

MB = 1024.0


def _raise_nofile(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        raise SystemExit(f"bench/memory.py: needs {want} descriptors, the hard limit is {hard}")


def _sample(b: BrokerProcess) -> tuple[float, int]:
    assert b.proc is not None
    return rss_kb(b.proc.pid) / MB, fd_count(b.proc.pid)


def _put(w: Wire, topic: str, partition: int, record: bytes, opaque: int) -> None:
    reply = w.call(f"put {topic} {partition} {len(record)} 0 {opaque}\r\n".encode() + record)
    if not (isinstance(reply, ResultReply) and reply.code == 200):
        raise SystemExit(f"put to {topic}-{partition} failed: {reply}")


def idle_topics(tmp: Path, topics: int, partitions: int) -> dict[str, Any]:
    names = [f"t{i:05d}" for i in range(topics)]
    system = {"maxConnections": 2048, "maxAutoCreatedPartitions": 1}
    spec = {n: {"numPartitions": partitions} for n in names}
    progress(f"idle topics: starting a broker with {topics} topics x {partitions} partitions")
    started = time.perf_counter()
    with BrokerProcess.start(tmp, name="topics", system=system, topics=spec) as b:
        start_s = time.perf_counter() - started
        rss0, fds0 = _sample(b)
        record = encode_record(b"x" * 100)
        with Wire(b.address) as w:
            for i, name in enumerate(names):
                for p in range(partitions):
                    _put(w, name, p, record, i)
        rss1, fds1 = _sample(b)
    n = topics * partitions
    return {
        "case": "idle_topics",
        "partitions": n,
        "start_s": round(start_s, 2),
        "rss_mb_started": round(rss0, 1),
        "fds_started": fds0,
        "rss_mb_all_open": round(rss1, 1),
        "fds_all_open": fds1,
        "kb_per_open_partition": round((rss1 - rss0) * MB / n, 1),
        "fds_per_open_partition": round((fds1 - fds0) / n, 2),
    }


def long_poll_consumers(tmp: Path, consumers: int) -> dict[str, Any]:
    _raise_nofile(consumers + 256)
    limit = consumers + 100
    system = {"maxConnections": limit, "maxConnectionsPerIp": limit}
    progress(f"long-poll consumers: {consumers} connections, one waiting get each")
    out: dict[str, Any] = {"case": "long_poll_consumers", "consumers": consumers}
    sel = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    with BrokerProcess.start(tmp, name="poll", system=system, topics={"lp": {}}) as b:
        out["rss_mb_idle"], out["fds_idle"] = (round(v, 1) for v in _sample(b))
        with Wire(b.address) as w:  # create the partition's store
            _put(w, "lp", 0, encode_record(b"first"), 1)
        end = len(encode_record(b"first"))
        steps: list[list[Any]] = []
        try:
            for i in range(consumers):
                sock = socket.create_connection(b.address)
                sock.sendall(f"get lp g 0 {end} 1024 300000 {i}\r\n".encode())
                sock.setblocking(False)
                sel.register(sock, selectors.EVENT_READ)
                socks.append(sock)
                if (i + 1) % 2500 == 0 or i + 1 == consumers:
                    time.sleep(1.0)  # let the broker accept and park the gets before sampling
                    rss, fds = _sample(b)
                    steps.append([i + 1, round(rss, 1), fds])
                    progress(f"  {i + 1} connections: RSS {rss:.1f} MB, {fds} descriptors")
            out["steps"] = steps
            rss_all = steps[-1][1]
            out["kb_per_connection"] = round((rss_all - out["rss_mb_idle"]) * MB / consumers, 2)
            out["fan_out_s"] = _fan_out(b, sel, consumers, end)
            out["rss_mb_after_fan_out"] = round(_sample(b)[0], 1)
        finally:
            for sock in socks:
                sock.close()
            sel.close()
    return out


def _fan_out(b: BrokerProcess, sel: selectors.BaseSelector, consumers: int, end: int) -> float:
    """Put one message; seconds until every waiting get has its reply (bounded: 120 s)."""
    record = encode_record(b"wake up")
    started = time.perf_counter()
    with Wire(b.address) as w:
        _put(w, "lp", 0, record, 1)
    answered = 0
    deadline = started + 120
    while answered < consumers and time.perf_counter() < deadline:
        for key, _ in sel.select(timeout=1.0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            data = sock.recv(65536)
            if data:
                sel.unregister(sock)
                answered += 1
    if answered < consumers:
        raise SystemExit(f"only {answered} of {consumers} gets were answered within 120 s")
    return round(time.perf_counter() - started, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=10_000)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pymetaq-memory-") as tmp:
        results = [
            idle_topics(Path(tmp), args.topics, args.partitions),
            long_poll_consumers(Path(tmp), args.consumers),
        ]
    if args.json:
        print(json.dumps(results))
    t, c = results
    rows = [
        ["broker started, nothing written", f"{t['partitions']} partitions", t["rss_mb_started"],
         t["fds_started"], ""],
        ["every partition written once", f"{t['partitions']} partitions", t["rss_mb_all_open"],
         t["fds_all_open"], f"{t['kb_per_open_partition']} KB/partition"],
        ["no consumer", "", c["rss_mb_idle"], c["fds_idle"], ""],
        *[["long-poll gets waiting", f"{n} connections", rss, fds, ""] for n, rss, fds in c["steps"]],
        ["after one put woke them all", f"{c['consumers']} connections", c["rss_mb_after_fan_out"],
         "", f"fan-out {c['fan_out_s']} s; {c['kb_per_connection']} KB/connection"],
    ]  # fmt: skip
    table = text_table(["case", "scale", "RSS MB", "fds", "per unit"], rows)
    print(table, file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
