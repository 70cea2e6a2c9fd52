"""``pymetaq consume``: print a topic's messages to stdout.

```
pymetaq consume --server meta://localhost:8123 --topic T [--group G]
                [--from earliest|latest|OFFSET] [--partition P] [--count N]
                [--offset-store file:PATH|sqlite:PATH|URL] [--format text|json]
                [--idle-timeout SECONDS]
```

* Without ``--group`` the consumer is ungrouped (nothing committed; starts at the end unless
  ``--from`` says otherwise). With ``--group`` the group's committed offsets win over
  ``--from earliest|latest``; offsets of printed messages are committed at exit (default store:
  ``~/.pymetaq_offsets``).
* ``--from OFFSET`` seeks to that byte offset (with ``--partition`` when the topic has several).
* ``--partition`` is ``<brokerId>-<partition>`` or a broker-local number.
* ``--format text`` prints each value (UTF-8, ``\\n``/``\\r`` escaped) on its own line; ``json``
  prints one object per line: topic, partition, offset, next_offset, id, attribute, value (or
  ``value_b64`` when the value is not UTF-8).
* Stops after ``--count`` messages, after ``--idle-timeout`` seconds without one, or on Ctrl-C
  (exit code 0 in all three cases).

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from typing import Any, TextIO

from pymetaq.client.consumer.sync import Consumer
from pymetaq.client.types import Message, TopicPartition
from pymetaq.offsets import OffsetStore, open_offset_store


def open_store(spec: str) -> OffsetStore:
    """``file:PATH`` | ``sqlite:PATH`` (or a sqlite URL) | a SQLAlchemy URL | ``zk://...``."""
    if spec.startswith("sqlite:") and not spec.startswith("sqlite://"):
        spec = "sqlite:///" + spec[len("sqlite:") :]
    store: OffsetStore = open_offset_store(spec)
    return store


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("consume", help="print a topic's messages")
    p.add_argument("--server", required=True, help="meta://host:port[,meta://host:port]")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", help="consumer group (default: ungrouped, nothing committed)")
    p.add_argument("--from", dest="start", default="auto", help="earliest | latest | OFFSET")
    p.add_argument("--partition", help="<brokerId>-<partition> or a partition number")
    p.add_argument("--count", type=int, default=0, help="stop after N messages")
    p.add_argument("--offset-store", help="file:PATH | sqlite:PATH | SQLAlchemy URL | zk://")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=0.0,
        help="stop after this many seconds without a message (0 = never)",
    )
    p.set_defaults(func=run)


def format_message(m: Message, fmt: str) -> str:
    if fmt == "json":
        doc: dict[str, Any] = {
            "topic": m.topic,
            "partition": m.partition_key,
            "offset": m.offset,
            "next_offset": m.next_offset,
            "id": m.id,
            "attribute": m.attribute,
        }
        try:
            doc["value"] = m.value.decode("utf-8")
        except UnicodeDecodeError:
            doc["value_b64"] = base64.b64encode(m.value).decode("ascii")
        return json.dumps(doc, separators=(",", ":"))
    text: str = m.value.decode("utf-8", "backslashreplace")
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _select(parts: list[TopicPartition], spec: str) -> list[TopicPartition]:
    if "-" in spec:
        b, _, p = spec.partition("-")
        chosen = [tp for tp in parts if (tp.broker_id, tp.partition) == (int(b), int(p))]
    else:
        chosen = [tp for tp in parts if tp.partition == int(spec)]
    if len(chosen) != 1:
        raise SystemExit(
            f"consume: partition {spec!r} matches {len(chosen)} of {[tp.key for tp in parts]}"
        )
    return chosen


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    offset: int | None = None
    start = args.start
    if start not in ("earliest", "latest", "auto"):
        try:
            offset = int(start)
        except ValueError:
            raise SystemExit(
                f"consume: --from must be earliest, latest or an offset, not {start!r}"
            ) from None
        start = "auto"
    store = open_store(args.offset_store) if args.offset_store else None
    consumer = Consumer(args.server, args.group, store, initial_position=start)
    try:
        consumer.subscribe(args.topic)
        parts = consumer.assignment()
        if args.partition is not None:
            parts = _select(parts, args.partition)
            consumer.assign(parts)
        if offset is not None:
            if len(parts) != 1:
                raise SystemExit("consume: --from OFFSET needs --partition (the topic has several)")
            consumer.seek(parts[0], offset)
        return _loop(consumer, args, out)
    except KeyboardInterrupt:
        return 0
    finally:
        consumer.close()
        if store is not None:
            store.close()


def _loop(consumer: Consumer, args: argparse.Namespace, out: TextIO) -> int:
    printed = 0
    last = time.monotonic()
    while True:
        batch = consumer.poll(0.5, args.count - printed if args.count else 0)
        if batch:
            last = time.monotonic()
        elif args.idle_timeout and time.monotonic() - last >= args.idle_timeout:
            return 0
        for m in batch:
            out.write(format_message(m, args.format) + "\n")
            printed += 1
            if args.count and printed >= args.count:
                out.flush()
                return 0
        out.flush()
