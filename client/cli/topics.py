"""``pymetaq topics [--servers URLS] [--json]``: the topics the brokers serve.

For each broker of ``--servers`` (``meta://`` addresses): ``stats topics`` (topics with data:
partitions, message count and bytes, whether puts and gets are accepted), ``stats <topic>``
for configured topics that hold nothing yet, and the ``[topic=...*...]`` pattern sections of
``stats config`` (a topic matching one is created by its first put). One row per topic and
broker; ``--json`` prints the same rows as a list of objects.

```
$ pymetaq topics
topic      partitions  messages  bytes  publish  subscribe  broker
meta-test  1           0         0      yes      yes        meta://127.0.0.1:8123 (id 0)
test       4           6         160    yes      yes        meta://127.0.0.1:8123 (id 0)
log-*      2           -         -      yes      yes        meta://127.0.0.1:8123 (id 0): a pattern
```

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pymetaq.client.cli.common import (
    add_servers_option,
    meta_addresses,
    non_negative,
    print_json,
    security_of,
    table,
)
from pymetaq.client.cli.stats import stats_lines as broker_stats
from pymetaq.client.transport.servers import parse_stats


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("topics", help="list the topics the brokers serve")
    add_servers_option(p)
    p.add_argument(
        "--timeout", type=non_negative(float), default=10.0, help="seconds (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _sections(config_text: str) -> dict[str, dict[str, str]]:
    """``{section: {key: value}}`` of a server.ini (enough of it to read topic sections)."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for raw in config_text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1].strip(), {})
        elif "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    return sections


def _flag(section: dict[str, str], system: dict[str, str], key: str) -> bool:
    return section.get(key, system.get(key, "true")).lower() != "false"


def broker_topics(
    host: str, port: int, timeout: float, security: Any = None
) -> list[dict[str, Any]]:
    """The rows for one broker (see the module docstring)."""

    def stats_lines(host: str, port: int, item: str, timeout: float) -> list[str]:
        return broker_stats(host, port, item, timeout, security)

    general = parse_stats("\n".join(stats_lines(host, port, "", timeout)))
    broker = {"broker": f"meta://{host}:{port}", "broker_id": int(general.get("broker_id", -1))}
    sections = _sections("\n".join(stats_lines(host, port, "config", timeout)))
    system = sections.get("system", {})
    rows: list[dict[str, Any]] = []
    for line in stats_lines(host, port, "topics", timeout):
        name, _, rest = line.partition(" ")
        if rest.strip() == "*Empty*":  # configured, nothing stored yet
            info = parse_stats("\n".join(stats_lines(host, port, name, timeout)))
            section = sections.get(f"topic={name}", {})
            fields = {
                "partitions": info.get("partitions", "0"),
                "accept_publish": str(_flag(section, system, "acceptPublish")).lower(),
                "accept_subscribe": str(_flag(section, system, "acceptSubscribe")).lower(),
            }
        else:
            tokens = rest.split()
            fields = dict(zip(tokens[::2], tokens[1::2]))
        rows.append(
            {
                "topic": name,
                "pattern": False,
                "partitions": int(fields.get("partitions", 0)),
                "message_count": int(fields.get("message_count", 0)),
                "message_bytes": int(fields.get("message_bytes", 0)),
                "accept_publish": fields.get("accept_publish", "true") == "true",
                "accept_subscribe": fields.get("accept_subscribe", "true") == "true",
                **broker,
            }
        )
    for name, section in sections.items():
        topic = name[len("topic=") :] if name.startswith("topic=") else ""
        if "*" not in topic:
            continue
        parts = section.get("numPartitions", system.get("numPartitions", "1"))
        rows.append(
            {
                "topic": topic,
                "pattern": True,
                "partitions": int(parts) if parts.isdigit() else None,
                "message_count": None,
                "message_bytes": None,
                "accept_publish": _flag(section, system, "acceptPublish"),
                "accept_subscribe": _flag(section, system, "acceptSubscribe"),
                **broker,
            }
        )
    return rows


def all_topics(args: argparse.Namespace, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every broker's rows (``--servers`` of ``args``), topics before patterns."""
    rows: list[dict[str, Any]] = []
    security = security_of(args)
    for host, port in meta_addresses(args, "topics"):
        rows.extend(broker_topics(host, port, timeout, security))
    rows.sort(key=lambda r: (r["pattern"], r["topic"], r["broker_id"]))
    return rows


def run(args: argparse.Namespace) -> int:
    rows = all_topics(args, args.timeout)
    if args.json:
        print_json(rows, sys.stdout)
        return 0
    if not rows:
        print("no topics")
        return 0

    def num(v: int | None) -> str:
        return "-" if v is None else str(v)

    def yes(v: bool) -> str:
        return "yes" if v else "no"

    lines = [["topic", "partitions", "messages", "bytes", "publish", "subscribe", "broker"]]
    for r in rows:
        where = f"{r['broker']} (id {r['broker_id']})" + (": a pattern" if r["pattern"] else "")
        lines.append(
            [
                r["topic"],
                num(r["partitions"]),
                num(r["message_count"]),
                num(r["message_bytes"]),
                yes(r["accept_publish"]),
                yes(r["accept_subscribe"]),
                where,
            ]
        )
    table(lines, sys.stdout)
    return 0
