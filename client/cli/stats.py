"""``pymetaq stats [item] [--server host:port]``: print a broker's stats.

Sends ``stats <item> <opaque>`` over a plain socket and prints the reply body (the lines between
``STATS`` and ``END``, or the raw server.ini for ``config``).  Exit code 0 on a 200 reply, 1
otherwise.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pymetaq.client.cli.wire import round_trip
from pymetaq.client.protocol import ResultReply, StatsCommand


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("stats", help="print a broker's stats")
    p.add_argument("item", nargs="?", default="", help="topics, offsets, realtime, <topic>, ...")
    p.add_argument("--server", default="127.0.0.1:8123", help="host:port (default %(default)s)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds (default %(default)s)")
    p.set_defaults(func=run)


def fetch_stats(host: str, port: int, item: str = "", timeout: float = 10.0) -> ResultReply:
    """One ``stats`` round trip."""
    return round_trip(host, port, StatsCommand(item, 1), timeout)


def run(args: argparse.Namespace) -> int:
    host, _, port = args.server.rpartition(":")
    try:
        reply = fetch_stats(host or "127.0.0.1", int(port), args.item, args.timeout)
    except (OSError, ValueError) as exc:
        print(f"pymetaq stats: {args.server}: {exc}", file=sys.stderr)
        return 1
    text = reply.body.decode("utf-8", "replace")
    if reply.code != 200:
        print(f"pymetaq stats: result {reply.code}: {text}", file=sys.stderr)
        return 1
    lines = text.splitlines()
    if args.item != "config" and lines[:1] == ["STATS"] and lines[-1:] == ["END"]:
        lines = lines[1:-1]
    print("\n".join(lines))
    return 0
