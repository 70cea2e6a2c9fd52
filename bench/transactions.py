"""Transactions benchmark: local transactions of 1, 10 and 100 messages against plain puts,
in the same run, against one broker subprocess — over raw sockets (the broker alone), then
through pymetaq's client (local transactions, and XA with PostgreSQL through the two-phase
coordinator; see ``bench/txclient.py``).

Every client is one connection that behaves as MetaQ's Java producer does: each ``put`` waits
for its reply before the next is sent; a transaction is ``BEGIN``, *k* transactional ``put``s,
``COMMIT_ONE_PHASE``.  ``--clients`` connections run at once (MetaQ's published figure used 10
producers: 6,750 msgs/s for 4 KiB local-transaction sends, tx log flushed by the OS, i.e.
``flushTxLogAtCommit=0``; the default here is MetaQ's default, 1 = fsync at commit).

Measured per case: messages/s (messages acknowledged: each plain put's ack, each committed
transaction's messages at its COMMIT ack, over the case's wall time), COMMIT latency p50/p99
(COMMIT sent -> 200; for plain puts the put's own latency) and the whole transaction's latency.
The broker uses group commit (``unflushThreshold=0``: a put is acknowledged after its fsync).

Output: one JSON line per case on stdout with ``--json``; a table on stderr (stdout without).

    .venv/bin/python -m bench.transactions --seconds 5 --json
    .venv/bin/python -m bench.transactions --flush-tx-log 0 --clients 10
    .venv/bin/python -m bench.transactions --only client --pg-url postgresql+psycopg://...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ServerProcess, filler, free_port, progress
from pymetaq.client.protocol import NEED_DATA, Parser, ResultReply, Role
from pymetaq.storage.checksum import checksum

CASES = [("plain put", 0), ("tx x1", 1), ("tx x10", 10), ("tx x100", 100)]


class Conn:
    """One request/reply connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.parser = Parser(Role.CLIENT)
        self.opaque = 0

    async def call(self, line: bytes, body: bytes = b"") -> ResultReply:
        self.writer.write(line + body)
        while (event := self.parser.next_event()) is NEED_DATA:
            chunk = await self.reader.read(65536)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.parser.feed(chunk)
        assert isinstance(event, ResultReply)
        if event.code != 200:
            raise RuntimeError(f"broker answered {event.code}: {event.body!r}")
        return event

    def op(self) -> int:
        self.opaque += 1
        return self.opaque


async def client(
    port: int, n: int, k: int, payload: bytes, stop_at: float, out: dict[str, list[float]]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    c = Conn(reader, writer)
    crc = checksum(payload)
    head = b"put bench %d %d 0 %d" % (n % 2, len(payload), crc)
    session = f"127.0.0.1-{int(time.time() * 1000)}-{n}"
    seq = 0
    while time.perf_counter() < stop_at:
        if k == 0:
            t0 = time.perf_counter()
            await c.call(head + b" %d\r\n" % c.op(), payload)
            out["commit"].append(time.perf_counter() - t0)
            out["msgs"].append(1)
            continue
        seq += 1
        key = f"TX:{session}:{seq}".encode()
        t0 = time.perf_counter()
        await c.call(b"transaction %s %s BEGIN %d\r\n" % (key, session.encode(), c.op()))
        for _ in range(k):
            await c.call(head + b" %s %d\r\n" % (key, c.op()), payload)
        t1 = time.perf_counter()
        await c.call(b"transaction %s %s COMMIT_ONE_PHASE %d\r\n" % (key, session.encode(), c.op()))
        t2 = time.perf_counter()
        out["commit"].append(t2 - t1)
        out["tx"].append(t2 - t0)
        out["msgs"].append(k)
    writer.close()
    await writer.wait_closed()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


async def run_case(
    port: int, k: int, clients: int, seconds: float, payload: bytes
) -> dict[str, float]:
    out: dict[str, list[float]] = {"commit": [], "tx": [], "msgs": []}
    start = time.perf_counter()
    await asyncio.gather(
        *(client(port, n, k, payload, start + seconds, out) for n in range(clients))
    )
    wall = time.perf_counter() - start
    return {
        "msgs_per_s": sum(out["msgs"]) / wall,
        "commit_p50_ms": pct(out["commit"], 0.50),
        "commit_p99_ms": pct(out["commit"], 0.99),
        "tx_p50_ms": pct(out["tx"], 0.50),
        "tx_p99_ms": pct(out["tx"], 0.99),
        "requests": float(len(out["commit"])),
    }


def start_broker(workdir: Path, flush_tx_log: int) -> tuple[ServerProcess, int]:
    port = free_port()
    ini = workdir / "server.ini"
    ini.write_text(
        "\n".join(
            [
                "[system]",
                f"serverPort={port}",
                f"dataPath={workdir / 'data'}",
                "numPartitions=2",
                "unflushThreshold=0",
                f"flushTxLogAtCommit={flush_tx_log}",
                "maxTxHeldBytes=1073741824",
                "[zookeeper]",
                "zk.zkEnable=false",
                "[topic=bench]",
                "",
            ]
        )
    )
    argv = [sys.executable, "-m", "pymetaq.server.cli", "server", "-f", str(ini)]
    server = ServerProcess(argv, workdir / "broker.log", port)
    server.wait_ready()
    return server, port


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per case (default %(default)s)")
    ap.add_argument("--clients", type=int, default=10, help="connections (default %(default)s)")
    ap.add_argument(
        "--msg-bytes", type=int, default=4096, help="payload size (default %(default)s)"
    )
    ap.add_argument(
        "--flush-tx-log", type=int, choices=(0, 1, 2), default=1, help="flushTxLogAtCommit"
    )
    ap.add_argument("--json", action="store_true", help="JSON lines on stdout, table on stderr")
    ap.add_argument(
        "--only", choices=("raw", "client"), help="run only the raw-socket or the client cases"
    )
    ap.add_argument("--pg-url", help="PostgreSQL for the XA cases (default: a throw-away server)")
    args = ap.parse_args(argv)
    payload = filler(args.msg_bytes)
    rows = []

    def emit(name: str, k: int, res: dict[str, float]) -> None:
        row = {
            "case": name,
            "msgs_per_tx": k,
            "msg_bytes": args.msg_bytes,
            "clients": args.clients,
            "flush_tx_log": args.flush_tx_log,
            **{key: round(v, 3) for key, v in res.items()},
            "cpus": os.cpu_count(),
        }
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory(prefix="pymetaq-bench-tx-") as tmp:
        server, port = start_broker(Path(tmp), args.flush_tx_log)
        try:
            for name, k in CASES if args.only != "client" else []:
                progress(f"{name}: {args.clients} clients, {args.seconds}s")
                emit(name, k, asyncio.run(run_case(port, k, args.clients, args.seconds, payload)))
            if args.only != "raw":
                from bench.txclient import run_client_cases

                progress(f"client cases: {args.clients} threads, {args.seconds}s each")
                for name, k, res in run_client_cases(
                    port, Path(tmp), args.clients, args.seconds, payload, args.pg_url
                ):
                    emit(name, k, res)
        finally:
            server.stop()
    table = sys.stderr if args.json else sys.stdout
    print(
        f"{'case':<24} {'msgs/s':>9} {'commit p50':>11} {'commit p99':>11} {'tx p50':>8} {'tx p99':>8}",
        file=table,
    )
    for r in rows:
        print(
            f"{r['case']:<24} {r['msgs_per_s']:>9.0f} {r['commit_p50_ms']:>9.2f}ms "
            f"{r['commit_p99_ms']:>9.2f}ms {r['tx_p50_ms']:>6.1f}ms {r['tx_p99_ms']:>6.1f}ms",
            file=table,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
