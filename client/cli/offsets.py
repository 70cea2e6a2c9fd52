"""``pymetaq offsets show|reset``: inspect and move a consumer group's committed offsets.

```
pymetaq offsets show  --store SPEC --group G [--topic T] [--server S]
pymetaq offsets reset --store SPEC --group G [--topic T] [--partition P]
                      --to earliest|latest|N [--server S] [--dry-run]
```

``SPEC`` is ``file:PATH`` | ``sqlite:PATH`` | a SQLAlchemy URL | ``zk://...``.

* ``show`` prints a table: topic, partition, offset, msg_id; with ``--server`` also the
  partition's first and end offsets and the lag (end - offset) from the broker.
* ``reset`` sets offsets exactly (backwards too: ``OffsetStore.reset``). The partitions are the
  group's committed ones (filtered by ``--topic``/``--partition``); with ``--server`` and
  ``--topic``, every partition of the topic. ``earliest``/``latest`` ask the broker (so they
  need ``--server``); ``N`` is a byte offset. It prints ``topic partition old -> new`` for each
  partition; ``--dry-run`` prints the same table and changes nothing. Stop the group's
  consumers first (a running consumer commits its own position on close).

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TextIO

from pymetaq.client.cli.consume import open_store
from pymetaq.client.consumer.config import ConsumerConfig
from pymetaq.client.consumer.transport import END_OFFSET, BrokerTransport
from pymetaq.client.errors import MetaClientError
from pymetaq.client.types import TopicPartition
from pymetaq.offsets import OffsetEntry, OffsetStore


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("offsets", help="show or reset a consumer group's offsets")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name in ("show", "reset"):
        q = sub.add_parser(name, help=f"{name} committed offsets")
        q.add_argument("--store", required=True, help="file:PATH | sqlite:PATH | URL | zk://")
        q.add_argument("--group", required=True)
        q.add_argument("--topic")
        q.add_argument("--server", help="meta://host:port (bounds, lag, earliest/latest)")
        if name == "reset":
            q.add_argument("--to", required=True, help="earliest | latest | N")
            q.add_argument("--partition", help="<brokerId>-<partition>")
            q.add_argument("--dry-run", action="store_true")
        q.set_defaults(func=run)


def table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


async def _broker_info(
    server: str, topics: list[str], entries: list[OffsetEntry]
) -> tuple[list[TopicPartition], dict[TopicPartition, tuple[int, int]]]:
    tr = BrokerTransport(server, ConsumerConfig())
    try:
        await tr.start()
        parts: list[TopicPartition] = []
        for t in topics:
            parts.extend(await tr.partitions(t))
        known = set(parts)
        for e in entries:
            b, _, p = e.partition.partition("-")
            tp = TopicPartition(e.topic, int(b), int(p))
            if tp not in known:
                parts.append(tp)
                known.add(tp)
        bounds: dict[TopicPartition, tuple[int, int]] = {}
        for tp in parts:
            try:
                lo = await tr.nearest_offset(tp, "pymetaq-offsets", 0)
                hi = await tr.nearest_offset(tp, "pymetaq-offsets", END_OFFSET)
            except MetaClientError as e:  # e.g. a partition the broker does not have
                print(f"pymetaq offsets: no bounds for {tp}: {e}", file=sys.stderr)
                continue
            bounds[tp] = (lo, hi)
        return parts, bounds
    finally:
        tr.close()


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
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
    if args.server is None:
        rows = [["topic", "partition", "offset", "msg_id"]]
        rows += [[e.topic, e.partition, str(e.offset), str(e.msg_id)] for e in entries]
    else:
        topics = [args.topic] if args.topic else []
        parts, bounds = asyncio.run(_broker_info(args.server, topics, entries))
        have = {(e.topic, e.partition): e for e in entries}
        rows = [["topic", "partition", "offset", "msg_id", "first", "end", "lag"]]
        for tp in sorted(parts):
            e = have.get((tp.topic, tp.key))
            lo, hi = bounds.get(tp, (-1, -1))
            off = e.offset if e else -1
            lag = str(hi - off) if e and hi >= 0 else "-"
            rows.append(
                [
                    tp.topic,
                    tp.key,
                    str(off) if e else "-",
                    str(e.msg_id) if e else "-",
                    str(lo) if lo >= 0 else "-",
                    str(hi) if hi >= 0 else "-",
                    lag,
                ]
            )
    if len(rows) == 1:
        out.write(f"group {args.group!r} has no committed offsets\n")
        return 0
    table(rows, out)
    return 0


def _reset(store: OffsetStore, args: argparse.Namespace, out: TextIO) -> int:
    entries = _entries(store, args)
    current = {(e.topic, e.partition): e for e in entries}
    to = args.to
    if to not in ("earliest", "latest"):
        try:
            target = int(to)
        except ValueError:
            raise SystemExit(f"offsets: --to must be earliest, latest or N, not {to!r}") from None
        if target < 0:
            raise SystemExit("offsets: --to N must be >= 0")
    elif args.server is None:
        raise SystemExit(f"offsets: --to {to} needs --server")
    if args.server is not None:
        topics = [args.topic] if args.topic else []
        parts, bounds = asyncio.run(_broker_info(args.server, topics, entries))
        keys = [(tp.topic, tp.key) for tp in sorted(parts)]
    else:
        bounds, keys = {}, sorted(current)
    if args.partition is not None:
        keys = [k for k in keys if k[1] == args.partition]
    changes: list[OffsetEntry] = []
    rows = [["topic", "partition", "old", "new"]]
    for topic, key in keys:
        if to in ("earliest", "latest"):
            b, _, p = key.partition("-")
            bound = bounds.get(TopicPartition(topic, int(b), int(p)))
            if bound is None:
                continue
            new = bound[0] if to == "earliest" else bound[1]
        else:
            new = target
        old = current.get((topic, key))
        rows.append([topic, key, str(old.offset) if old else "-", str(new)])
        changes.append(
            OffsetEntry(topic, key, new, old.msg_id if old and old.offset == new else -1)
        )
    if not changes:
        out.write("nothing to reset\n")
        return 0
    table(rows, out)
    if args.dry_run:
        out.write(
            f"dry run: {len(changes)} offset(s) of group {args.group!r} would change; nothing written\n"
        )
        return 0
    store.reset(args.group, changes)
    out.write(f"reset {len(changes)} offset(s) of group {args.group!r}\n")
    return 0
