"""``pymetaq verify --master HOST:PORT --slave HOST:PORT``: compare two replicas of a broker.

For every partition either broker has (``stats offsets``; ``--topic`` narrows it), it prints
both replicas' first and last offsets and compares the **common range** - from the larger
first offset to the smaller last one - by a CRC32 of its bytes on each side, read with plain
``get`` requests (group ``pymetaq-verify``, 1 MiB at a time; the data a consumer would get).
Status per partition: ``same`` (the common bytes are identical; ``behind N`` adds how far the
slave's end is behind the master's), ``DIFFERS`` (the checksums differ), ``missing on slave`` /
``missing on master``, ``no common range``.  ``--json`` prints one object per partition.

Exit code 0 when no common range differs (a slave may be behind: an asynchronous slave
usually is, a little), 1 when one differs or a broker cannot be read; with ``--strict`` also 1
unless both replicas hold exactly the same offsets.  Usage errors exit 2.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from dataclasses import asdict, dataclass
from typing import Any

from pymetaq.client.cli.common import (
    NO_BROKER_HINT,
    CommandError,
    UsageError,
    check_topic,
    non_negative,
    print_json,
    table,
)
from pymetaq.client.cli.stats import stats_lines
from pymetaq.client.protocol import NEED_DATA, GetCommand, Parser, ResultReply, Role, ValueReply
from pymetaq.client.protocol import encode as encode_command
from pymetaq.client.transport.servers import parse_servers

GROUP = "pymetaq-verify"
CHUNK = 1 << 20
Key = tuple[str, int]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "verify",
        help="compare two replicas of a broker (offsets and a checksum per partition)",
        description="Compare a master and its slave partition by partition: their offsets and "
        "a CRC32 of the range both hold.",
    )
    p.add_argument("--master", required=True, metavar="HOST:PORT", help="the master broker")
    p.add_argument("--slave", required=True, metavar="HOST:PORT", help="the slave broker")
    p.add_argument(
        "--topic", action="append", default=[], help="only this topic (repeatable; default: all)"
    )
    p.add_argument("--strict", action="store_true", help="fail unless the offsets are equal too")
    p.add_argument(
        "--timeout", type=non_negative(float), default=30.0, help="seconds (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


@dataclass
class PartitionCheck:
    topic: str
    partition: int
    master: tuple[int, int] | None
    slave: tuple[int, int] | None
    common: tuple[int, int] | None = None
    master_crc: int | None = None
    slave_crc: int | None = None
    status: str = ""

    @property
    def differs(self) -> bool:
        return self.master_crc != self.slave_crc

    @property
    def identical(self) -> bool:
        return self.master == self.slave and not self.differs


def offsets_of(host: str, port: int, timeout: float) -> dict[Key, tuple[int, int]]:
    out: dict[Key, tuple[int, int]] = {}
    for line in stats_lines(host, port, "offsets", timeout):
        f = line.split()
        if len(f) == 7 and f[1] == "part" and f[2].isdigit():
            out[(f[0], int(f[2]))] = (int(f[4]), int(f[6]))
    return out


class Reader:
    """Sequential ``get`` round trips on one connection."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        import socket

        self.url = f"meta://{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise CommandError(f"cannot connect to {self.url}: {e}", NO_BROKER_HINT) from None
        self.parser = Parser(Role.CLIENT)

    def get(self, topic: str, partition: int, offset: int) -> bytes:
        self.sock.sendall(encode_command(GetCommand(topic, GROUP, partition, offset, CHUNK, 1)))
        while (event := self.parser.next_event()) is NEED_DATA:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise CommandError(f"{self.url} closed the connection")
            self.parser.feed(chunk)
        if isinstance(event, ValueReply):
            return event.data
        body = event.body.decode("utf-8", "replace") if isinstance(event, ResultReply) else ""
        code = event.code if isinstance(event, ResultReply) else "?"
        raise CommandError(f"{self.url}: get {topic}-{partition} at {offset}: {code} {body}")

    def crc(self, topic: str, partition: int, start: int, end: int) -> int:
        crc, offset = 0, start
        while offset < end:
            data = self.get(topic, partition, offset)[: end - offset]
            if not data:
                raise CommandError(f"{self.url}: no data in {topic}-{partition} at {offset}")
            crc = zlib.crc32(data, crc)
            offset += len(data)
        return crc

    def close(self) -> None:
        self.sock.close()


def check(
    key: Key, m: tuple[int, int] | None, s: tuple[int, int] | None, readers: tuple[Reader, Reader]
) -> PartitionCheck:
    pc = PartitionCheck(key[0], key[1], m, s)
    if m is None or s is None:
        pc.status = "missing on master" if m is None else "missing on slave"
        return pc
    lo, hi = max(m[0], s[0]), min(m[1], s[1])
    if lo >= hi:
        pc.status = "no common range"
        return pc
    pc.common = (lo, hi)
    pc.master_crc = readers[0].crc(key[0], key[1], lo, hi)
    pc.slave_crc = readers[1].crc(key[0], key[1], lo, hi)
    if pc.differs:
        pc.status = "DIFFERS"
    else:
        behind = m[1] - s[1]
        pc.status = "same" + (f", behind {behind}" if behind > 0 else "")
    return pc


def parse_server(text: str) -> tuple[str, int]:
    """One broker's ``host:port`` (``meta://`` allowed); ValueError otherwise."""
    found = parse_servers(text)
    if len(found) != 1:
        raise ValueError(f"{text!r} names {len(found)} brokers, not one")
    return found[0]


def run(args: argparse.Namespace) -> int:
    try:
        master, slave = parse_server(args.master), parse_server(args.slave)
    except ValueError as e:
        raise UsageError(f"bad address: {e}", "--master and --slave take host:port") from None
    for t in args.topic:
        check_topic(t)
    mo = offsets_of(*master, args.timeout)
    so = offsets_of(*slave, args.timeout)
    keys = sorted(k for k in set(mo) | set(so) if not args.topic or k[0] in args.topic)
    readers = (Reader(*master, args.timeout), Reader(*slave, args.timeout))
    try:
        checks = [check(k, mo.get(k), so.get(k), readers) for k in keys]
    finally:
        for r in readers:
            r.close()
    if args.json:
        print_json([{**asdict(c), "identical": c.identical} for c in checks], sys.stdout)
    else:
        rows = [["topic", "part", "master", "slave", "common", "crc32", "status"]]
        for c in checks:
            rows.append(
                [
                    c.topic,
                    str(c.partition),
                    _span(c.master),
                    _span(c.slave),
                    _span(c.common),
                    "-" if c.master_crc is None else f"{c.master_crc:08x}",
                    c.status if not c.differs else f"DIFFERS ({c.slave_crc:08x} on the slave)",
                ]
            )
        table(rows, sys.stdout)
        if not checks:
            print("no partitions on either broker")
    bad = any(c.differs and c.common is not None for c in checks)
    if args.strict:
        bad = bad or not all(c.identical for c in checks)
    return 1 if bad else 0


def _span(span: tuple[int, int] | None) -> str:
    return "-" if span is None else f"{span[0]}..{span[1]}"
