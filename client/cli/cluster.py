"""``pymetaq cluster --servers zk://...``: what a MetaQ ZooKeeper registry says, and the lag.

```
pymetaq cluster --servers zk://host:port[,host:port][/root] [--group G] [--format text|json | --json]
                [--timeout SECONDS]
```

Reads the registry once (:func:`pymetaq.client.cluster.snapshot.read_cluster`) and prints

* **brokers**: each broker id with its roles (``master``, ``slave<n>``), their ``meta://``
  addresses and the master's config checksum;
* **topics**: partitions per broker, for publishing (``topics-pub``) and subscribing
  (``topics-sub``);
* **groups** (or just ``--group``): the members and their topics, then one row per partition
  of the topics the group reads: its owner, the committed offset, the partition's end (the
  broker's ``max_offset`` from ``stats offsets``, one request per broker) and the lag
  (end - committed).  ``-`` where there is nothing (no owner, nothing committed); ``?`` where
  the broker did not answer.

``--format json`` prints the same as one JSON object.  Exit code 0; 1 if ZooKeeper cannot be
reached (the message says which servers); 2 for a bad ``--servers``.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, TextIO

from pymetaq.client.cli.stats import fetch_stats
from pymetaq.client.cluster.errors import ClusterError
from pymetaq.client.cluster.session import connect
from pymetaq.client.cluster.snapshot import ClusterSnapshot, GroupInfo, read_cluster
from pymetaq.client.protocol.zk import parse_meta_url, parse_zk_url

#: partition end offsets: (topic, "<brokerId>-<partition>") -> max_offset; None = no answer
Ends = dict[tuple[str, str], int | None]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "cluster", help="brokers, topics, consumer groups and lag from ZooKeeper"
    )
    p.add_argument(
        "--servers",
        required=True,
        help="zk://host:port[,host:port][/root] (the registry root, default /meta)",
    )
    p.add_argument("--group", help="show only this consumer group")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--json", dest="format", action="store_const", const="json", help="= --format json"
    )
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds per server (default %(default)s)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # our own message says it once
    try:
        url = parse_zk_url(args.servers)
    except ValueError as e:
        print(f"pymetaq cluster: --servers: {e}", file=sys.stderr)
        return 2
    try:
        zk = connect(url, session_timeout_s=max(args.timeout, 2.0), connect_timeout_s=args.timeout)
    except ClusterError as e:
        print(f"pymetaq cluster: {e}", file=sys.stderr)
        return 1
    try:
        snap = read_cluster(zk, url.root)
    except Exception as e:  # a connection lost midway: say so, no traceback
        print(f"pymetaq cluster: reading {url} failed: {e!r}", file=sys.stderr)
        return 1
    finally:
        zk.stop()
        zk.close()
    groups = [g for g in snap.groups if args.group in (None, g.group)]
    ends = broker_ends(snap, args.timeout)
    doc = to_document(snap, groups, ends)
    if args.format == "json":
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        write_text(doc, out, args.group)
    return 0


def broker_ends(snap: ClusterSnapshot, timeout: float) -> Ends:
    """Every partition's end offset from its master's ``stats offsets`` (None: no answer)."""
    ends: Ends = {}
    for b in snap.brokers:
        if b.master is None:
            continue
        lines: list[str] | None
        try:
            host, port = parse_meta_url(b.master)
            reply = fetch_stats(host, port, "offsets", timeout)
            lines = (
                reply.body.decode("utf-8", "replace").splitlines() if reply.code == 200 else None
            )
        except (OSError, ValueError):
            lines = None
        for t in snap.topics:
            for p in range(t.subscribe.get(b.broker_id, t.publish.get(b.broker_id, 0))):
                ends[(t.topic, f"{b.broker_id}-{p}")] = None if lines is None else 0
        for line in lines or ():
            f = line.split()  # <topic> part <p> min_offset <n> max_offset <n>
            if len(f) == 7 and f[1] == "part" and f[5] == "max_offset" and f[6].isdigit():
                ends[(f[0], f"{b.broker_id}-{f[2]}")] = int(f[6])
    return ends


def _group_rows(snap: ClusterSnapshot, g: GroupInfo, ends: Ends) -> list[dict[str, Any]]:
    topics = {t for ts in g.members.values() for t in ts} | {p.topic for p in g.partitions}
    state = {(p.topic, p.partition): p for p in g.partitions}
    keys = set(state)
    for t in snap.topics:
        if t.topic in topics:
            keys |= {(t.topic, f"{b}-{p}") for b, n in t.subscribe.items() for p in range(n)}
    rows = []
    for topic, part in sorted(keys, key=lambda k: (k[0], *_pkey(k[1]))):
        ps = state.get((topic, part))
        committed = ps.committed if ps is not None else None
        end = ends.get((topic, part))
        lag = end - committed if end is not None and committed is not None else None
        rows.append(
            {
                "topic": topic,
                "partition": part,
                "owner": ps.owner if ps is not None else None,
                "committed": committed,
                "msg_id": ps.msg_id if ps is not None else None,
                "end": end,
                "lag": lag,
            }
        )
    return rows


def _pkey(part: str) -> tuple[int, int]:
    b, _, p = part.partition("-")
    return (int(b) if b.isdigit() else -1, int(p) if p.isdigit() else -1)


def to_document(snap: ClusterSnapshot, groups: list[GroupInfo], ends: Ends) -> dict[str, Any]:
    """The JSON document (the text form prints the same)."""
    return {
        "root": snap.root,
        "brokers": [
            {
                "broker_id": b.broker_id,
                "master": b.master,
                "slaves": {str(k): v for k, v in sorted(b.slaves.items())},
                "config_checksum": b.config_checksum,
            }
            for b in snap.brokers
        ],
        "topics": [
            {
                "topic": t.topic,
                "publish": {str(k): v for k, v in t.publish.items()},
                "subscribe": {str(k): v for k, v in t.subscribe.items()},
            }
            for t in snap.topics
        ],
        "groups": [
            {
                "group": g.group,
                "members": {m: list(ts) for m, ts in g.members.items()},
                "partitions": _group_rows(snap, g, ends),
            }
            for g in groups
        ],
    }


def table(rows: list[list[str]], out: TextIO, indent: str = "  ") -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def _v(value: Any, unknown: str = "-") -> str:
    return unknown if value is None else str(value)


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{b}:{n}" for b, n in counts.items()) or "-"


def write_text(doc: dict[str, Any], out: TextIO, only_group: str | None) -> None:
    out.write(f"ZooKeeper root {doc['root']}\n\nbrokers\n")
    rows = [["id", "role", "address", "config_checksum"]]
    for b in doc["brokers"]:
        if b["master"] is not None:
            rows.append([str(b["broker_id"]), "master", b["master"], _v(b["config_checksum"])])
        for sid, addr in b["slaves"].items():
            rows.append([str(b["broker_id"]), f"slave{sid}", addr, ""])
    if len(rows) > 1:
        table(rows, out)
    else:
        out.write("  (no broker registered)\n")
    out.write("\ntopics (partitions per broker id)\n")
    rows = [["topic", "partitions", "publish", "subscribe"]]
    for t in doc["topics"]:
        total = sum(t["subscribe"].values()) or sum(t["publish"].values())
        rows.append([t["topic"], str(total), _counts(t["publish"]), _counts(t["subscribe"])])
    if len(rows) > 1:
        table(rows, out)
    else:
        out.write("  (no topic registered)\n")
    if not doc["groups"]:
        which = f"group {only_group!r} is" if only_group else "no consumer group is"
        out.write(f"\n{which} registered\n")
    for g in doc["groups"]:
        n = len(g["members"])
        out.write(f"\ngroup {g['group']}: {n} member{'s' if n != 1 else ''}\n")
        if g["members"]:
            table(
                [["member", "topics"]] + [[m, ",".join(ts)] for m, ts in g["members"].items()], out
            )
        rows = [["topic", "partition", "owner", "committed", "end", "lag"]]
        for r in g["partitions"]:
            lag = "-" if r["committed"] is None else _v(r["lag"], "?")
            rows.append(
                [
                    r["topic"],
                    r["partition"],
                    _v(r["owner"]),
                    _v(r["committed"]),
                    _v(r["end"], "?"),
                    lag,
                ]
            )
        if len(rows) > 1:
            out.write("\n")
            table(rows, out)
