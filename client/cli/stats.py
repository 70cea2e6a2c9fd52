"""``pymetaq stats [item] [--servers URLS] [--json]``: print brokers' stats.

Sends ``stats <item> <opaque>`` to each broker of ``--servers`` (``meta://host:port[,...]``;
``host:port`` works too; default ``$PYMETAQ_SERVERS``, else ``meta://127.0.0.1:8123``) over a
plain socket and prints the reply body (the lines between ``STATS`` and ``END``, or the raw
server.ini for ``config``); with several brokers each one's lines follow a ``== <url> ==``
line. ``--json``: a list of ``{"server": url, "stats": {key: value}}`` (numbers as numbers).
Exit code 0 when every broker answered 200, 1 otherwise.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pymetaq.client.cli.common import (
    NO_BROKER_HINT,
    CommandError,
    add_servers_option,
    meta_addresses,
    non_negative,
    print_json,
    security_of,
)
from pymetaq.client.cli.wire import round_trip
from pymetaq.client.protocol import ResultReply, StatsCommand
from pymetaq.client.transport.servers import parse_stats


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("stats", help="print brokers' stats")
    p.add_argument("item", nargs="?", default="", help="topics, offsets, realtime, <topic>, ...")
    add_servers_option(p)
    p.add_argument(
        "--timeout", type=non_negative(float), default=10.0, help="seconds (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def fetch_stats(
    host: str, port: int, item: str = "", timeout: float = 10.0, security: Any = None
) -> ResultReply:
    """One ``stats`` round trip (``security``: TLS / ``auth``, see ``common.security_of``)."""
    return round_trip(host, port, StatsCommand(item, 1), timeout, security)


def stats_lines(host: str, port: int, item: str, timeout: float, security: Any = None) -> list[str]:
    """The reply's lines (without ``STATS``/``END``); :class:`CommandError` if the broker
    cannot be reached or does not answer 200."""
    url = f"meta://{host}:{port}"
    try:
        reply = fetch_stats(host, port, item, timeout, security)
    except (OSError, ValueError) as exc:
        raise CommandError(f"cannot get stats from {url}: {exc}", NO_BROKER_HINT) from None
    text = reply.body.decode("utf-8", "replace")
    if reply.code != 200:
        raise CommandError(f"{url} answered {reply.code}: {text}")
    lines = text.splitlines()
    if item != "config" and lines[:1] == ["STATS"] and lines[-1:] == ["END"]:
        lines = lines[1:-1]
    return lines


def _value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return {"true": True, "false": False}.get(text, text)


def run(args: argparse.Namespace) -> int:
    brokers = meta_addresses(args, "stats")
    security = security_of(args)
    docs = []
    for host, port in brokers:
        lines = stats_lines(host, port, args.item, args.timeout, security)
        if args.json:
            doc: dict[str, Any] = {"server": f"meta://{host}:{port}"}
            if args.item == "config":
                doc["config"] = "\n".join(lines) + "\n"
            else:
                doc["stats"] = {k: _value(v) for k, v in parse_stats("\n".join(lines)).items()}
            docs.append(doc)
            continue
        if len(brokers) > 1:
            print(f"== meta://{host}:{port} ==")
        print("\n".join(lines))
    if args.json:
        print_json(docs, sys.stdout)
    return 0
