"""``pymetaq offsets show|reset``: inspect and move a consumer group's committed offsets.

```
pymetaq offsets show  --group G [--store SPEC] [--topic T] [--servers URLS] [--json]
pymetaq offsets reset --group G [--store SPEC] [--topic T] [--partition P]
                      --to earliest|latest|N [--servers URLS] [--execute] [--json]
```

``SPEC`` is ``file:PATH`` | ``sqlite:PATH`` | a SQLAlchemy URL | ``zk://...``; the default is
``file:~/.pymetaq_offsets``, the store ``pymetaq consume --group`` and ``FileOffsetStore()``
use.

* ``show`` prints a table: topic, partition, offset, msg_id; with ``--servers`` also the
  partition's first and end offsets and the lag (end - offset) from the broker.
* ``reset`` follows ``kafka-consumer-groups --reset-offsets``: it prints the plan
  (``topic partition old new``) and changes nothing unless ``--execute`` is given
  (``--dry-run``, the default, is accepted). It asks the brokers (``--servers``) for each
  partition's range: ``earliest``/``latest`` are its bounds, and ``N`` must be a message
  boundary (where a message starts, or the end); an ``N`` below the first offset or above the
  end is clamped to that bound (the plan says ``(clamped)``). The partitions are the group's
  committed ones (filtered by ``--topic``/``--partition``); with ``--topic``, every partition
  of the topic. Offsets are set exactly (backwards too: ``OffsetStore.reset``). Stop the
  group's consumers first (a running consumer commits its own position on close).

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TextIO

from pymetaq.client.cli.common import (
    STORE_HELP,
    UsageError,
    add_servers_option,
    check_group_arg,
    check_topic,
    open_store,
    print_json,
    servers_in_use,
    servers_of,
    table,
)
from pymetaq.client.cli.positions import bounds, check_record_start
from pymetaq.client.consumer.config import ConsumerConfig
from pymetaq.client.consumer.transport import BrokerTransport
from pymetaq.client.errors import MetaClientError
from pymetaq.client.types import TopicPartition
from pymetaq.offsets import OffsetEntry, OffsetStore

Bounds = dict[TopicPartition, tuple[int, int]]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("offsets", help="show or reset a consumer group's offsets")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name in ("show", "reset"):
        q = sub.add_parser(name, help=f"{name} committed offsets")
        q.add_argument("--store", help=STORE_HELP)
        q.add_argument("--group", required=True)
        q.add_argument("--topic")
        add_servers_option(q)
        q.add_argument("--json", action="store_true", help="print JSON")
        if name == "reset":
            q.add_argument("--to", required=True, help="earliest | latest | N")
            q.add_argument("--partition", help="<brokerId>-<partition>")
            how = q.add_mutually_exclusive_group()
            how.add_argument("--execute", action="store_true", help="write the new offsets")
            how.add_argument(
                "--dry-run", action="store_true", help="only print the plan (the default)"
            )
        q.set_defaults(func=run)


async def _broker_info(
    servers: str, topics: list[str], entries: list[OffsetEntry]
) -> tuple[list[TopicPartition], Bounds]:
    """The topics' partitions plus those of ``entries``, and each one's (first, end)."""
    with servers_in_use(servers):
        tr = BrokerTransport(servers, ConsumerConfig())
    try:
        await tr.start()
        parts: list[TopicPartition] = []
        for t in topics:
            parts.extend(await tr.partitions(t))
        known = set(parts)
        for e in entries:
            tp = TopicPartition.from_key(e.topic, e.partition)
            if tp not in known:
                parts.append(tp)
                known.add(tp)
        found: Bounds = {}
        for tp in parts:
            try:
                found[tp] = await bounds(tr, tp)
            except MetaClientError as e:  # e.g. a partition the broker does not have
                print(f"pymetaq offsets: no bounds for {tp}: {e}", file=sys.stderr)
        return parts, found
    finally:
        tr.close()


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    check_group_arg(args.group)
    if args.topic is not None:
        check_topic(args.topic)
    store = open_store(args.store)
    try:
        if args.action == "show":
            return _show(store, args, out)
        return _reset(store, args, out)
    finally:
        store.close()


def _entries(store: OffsetStore, args: argparse.Namespace) -> list[OffsetEntry]:
    entries = [e for e in store.load_all(args.group) if args.topic in (None, e.topic)]
    return sorted(entries, key=lambda e: (e.topic, e.partition))


def _show(store: OffsetStore, args: argparse.Namespace, out: TextIO) -> int:
    entries = _entries(store, args)
    docs: list[dict[str, Any]] = []
    if args.servers is None:
        docs = [
            {"topic": e.topic, "partition": e.partition, "offset": e.offset, "msg_id": e.msg_id}
            for e in entries
        ]
        columns = ["topic", "partition", "offset", "msg_id"]
    else:
        topics = [args.topic] if args.topic else []
        parts, found = asyncio.run(_broker_info(servers_of(args), topics, entries))
        have = {(e.topic, e.partition): e for e in entries}
        for tp in sorted(parts):
            e = have.get((tp.topic, tp.key))
            first, end = found.get(tp, (None, None))
            docs.append(
                {
                    "topic": tp.topic,
                    "partition": tp.key,
                    "offset": e.offset if e else None,
                    "msg_id": e.msg_id if e else None,
                    "first": first,
                    "end": end,
                    "lag": end - e.offset if e and end is not None else None,
                }
            )
        columns = ["topic", "partition", "offset", "msg_id", "first", "end", "lag"]
    if args.json:
        print_json(docs, out)
    elif not docs:
        out.write(f"group {args.group!r} has no committed offsets\n")
    else:
        rows = [columns] + [["-" if d[c] is None else str(d[c]) for c in columns] for d in docs]
        table(rows, out)
    return 0


def _target(to: str) -> int | None:
    """``--to``: None for earliest/latest, else a byte offset."""
    if to in ("earliest", "latest"):
        return None
    if to.isdigit():
        return int(to)
    raise UsageError(f"--to must be earliest, latest or an offset N >= 0, not {to!r}")


def _plan(args: argparse.Namespace, entries: list[OffsetEntry]) -> list[dict[str, Any]]:
    """One row per partition to reset: topic, partition, old, new, clamped."""
    target = _target(args.to)
    servers = servers_of(args)
    topics = [args.topic] if args.topic else []
    parts, found = asyncio.run(_broker_info(servers, topics, entries))
    if args.partition is not None:
        parts = [tp for tp in parts if tp.key == args.partition]
        if not parts:
            raise UsageError(f"--partition {args.partition!r}: no such partition here")
    current = {(e.topic, e.partition): e for e in entries}
    rows: list[dict[str, Any]] = []
    boundary_checks: list[tuple[TopicPartition, int]] = []
    for tp in sorted(parts):
        if tp not in found:
            continue  # reported by _broker_info
        first, end = found[tp]
        new = first if args.to == "earliest" else end if target is None else target
        clamped = not first <= new <= end
        new = min(max(new, first), end)
        if target is not None and not clamped:
            boundary_checks.append((tp, new))
        old = current.get((tp.topic, tp.key))
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.key,
                "old": old.offset if old else None,
                "new": new,
                "clamped": clamped,
                "msg_id": old.msg_id if old and old.offset == new else -1,
            }
        )
    _check_boundaries(servers, boundary_checks)
    return rows


def _check_boundaries(servers: str, checks: list[tuple[TopicPartition, int]]) -> None:
    async def check() -> list[str]:
        with servers_in_use(servers):
            tr = BrokerTransport(servers, ConsumerConfig())
        try:
            await tr.start()
            found = [await check_record_start(tr, tp, offset) for tp, offset in checks]
            return [why for why in found if why is not None]
        finally:
            tr.close()

    problems = asyncio.run(check()) if checks else []
    if problems:
        raise UsageError(f"--to {problems[0]}", "nothing was changed")


def _reset(store: OffsetStore, args: argparse.Namespace, out: TextIO) -> int:
    rows = _plan(args, _entries(store, args))
    if args.execute and rows:
        store.reset(
            args.group,
            [OffsetEntry(r["topic"], r["partition"], r["new"], r["msg_id"]) for r in rows],
        )
    if args.json:
        print_json({"group": args.group, "executed": bool(args.execute), "changes": rows}, out)
        return 0
    if not rows:
        out.write("nothing to reset\n")
        return 0
    table(
        [["topic", "partition", "old", "new"]]
        + [
            [
                r["topic"],
                r["partition"],
                "-" if r["old"] is None else str(r["old"]),
                f"{r['new']}{' (clamped)' if r['clamped'] else ''}",
            ]
            for r in rows
        ],
        out,
    )
    if args.execute:
        out.write(f"reset {len(rows)} offset(s) of group {args.group!r}\n")
    else:
        out.write(
            f"dry run: {len(rows)} offset(s) of group {args.group!r} would change; nothing "
            "written (add --execute to write them)\n"
        )
    return 0
