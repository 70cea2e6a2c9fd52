"""``pymetaq consume``: print topics' messages to stdout.

```
pymetaq consume --topic T [--topic T2 | --topic 'log-*'] [--servers URLS] [--group G]
                [--from earliest|latest|OFFSET | --from-beginning] [--partition P]
                [--count N] [--offset-store SPEC] [--format text|json] [--idle-timeout S]
```

* ``--topic`` may be given several times; a name with ``*`` is a pattern in the
  ``[topic=...]`` syntax (``*`` = any run of name characters), matched once at start against
  the topics the brokers list (``pymetaq topics``; ``meta://`` servers).
* Without ``--group`` the consumer is ungrouped (nothing committed; starts at the end unless
  ``--from``/``--from-beginning`` says otherwise; it says so on stderr if it waits). With
  ``--group`` the group's committed offsets win over ``--from earliest|latest``; the offsets
  of the printed messages are committed at exit (default store: ``~/.pymetaq_offsets``, the
  same as ``FileOffsetStore()``; with ``zk://`` servers the group's offsets in ZooKeeper, as
  MetaQ's; ``--offset-store SPEC`` names another).
* ``--from OFFSET`` seeks one partition (``--partition`` when the topic has several) to a byte
  offset where a message starts (a message's ``offset`` or ``next_offset``); any other offset
  is refused with the reason (:mod:`pymetaq.client.cli.positions`).
* ``--partition`` is ``<brokerId>-<partition>`` or a broker-local number.
* ``--format text`` prints each value (UTF-8, ``\\n``/``\\r`` escaped) on its own line; ``json``
  one object per line: topic, partition, offset, next_offset, id, timestamp (ms), key,
  attribute, value (``key_b64``/``value_b64`` when not UTF-8).
* Stops after ``--count`` messages, after ``--idle-timeout`` seconds without one, on Ctrl-C or
  on SIGTERM (systemd, ``docker stop``, ``timeout``): exit code 0 in all four cases, after
  committing exactly the printed messages. A signal is noticed between two messages (or after
  the current poll, within half a second); a second one stops at once (a message being printed
  then is delivered again next time).

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from typing import Any, TextIO

from pymetaq.client.cli.common import (
    StopRequest,
    UsageError,
    add_servers_option,
    check_group_arg,
    check_topic,
    graceful_stop,
    non_negative,
    open_store,
    servers_in_use,
    servers_of,
)
from pymetaq.client.consumer.config import ConsumerConfig
from pymetaq.client.consumer.sync import Consumer
from pymetaq.client.consumer.transport import BrokerTransport
from pymetaq.client.types import Message, TopicPartition


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("consume", help="print topics' messages")
    add_servers_option(p)
    p.add_argument(
        "--topic",
        action="append",
        required=True,
        help="a topic, or a pattern with '*' (repeat for several)",
    )
    p.add_argument("--group", help="consumer group (default: ungrouped, nothing committed)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from", dest="start", default="auto", help="earliest | latest | OFFSET")
    start.add_argument(
        "--from-beginning",
        dest="start",
        action="store_const",
        const="earliest",
        help="the same as --from earliest",
    )
    p.add_argument("--partition", help="<brokerId>-<partition> or a partition number")
    p.add_argument("--count", type=non_negative(int), default=0, help="stop after N messages")
    p.add_argument(
        "--offset-store",
        "--store",
        dest="offset_store",
        help="file:PATH | sqlite:PATH | URL | zk://",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--idle-timeout",
        type=non_negative(float),
        default=0.0,
        help="stop after this many seconds without a message (0 = never)",
    )
    p.set_defaults(func=run)


def _text(raw: bytes | None, name: str, doc: dict[str, Any]) -> None:
    if raw is None:
        doc[name] = None
        return
    try:
        doc[name] = raw.decode("utf-8")
    except UnicodeDecodeError:
        doc[f"{name}_b64"] = base64.b64encode(raw).decode("ascii")


def format_message(m: Message, fmt: str) -> str:
    if fmt == "json":
        doc: dict[str, Any] = {
            "topic": m.topic,
            "partition": m.partition_key,
            "offset": m.offset,
            "next_offset": m.next_offset,
            "id": m.id,
            "timestamp": m.timestamp,
        }
        _text(m.key, "key", doc)
        doc["attribute"] = m.attribute
        _text(m.value, "value", doc)
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    text: str = m.value.decode("utf-8", "backslashreplace")
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _select(parts: list[TopicPartition], spec: str) -> list[TopicPartition]:
    b, sep, n = spec.partition("-")
    if sep and b.isdigit() and n.isdigit():
        chosen = [tp for tp in parts if (tp.broker_id, tp.partition) == (int(b), int(n))]
    elif spec.isdigit():
        chosen = [tp for tp in parts if tp.partition == int(spec)]
    else:
        raise UsageError(f"bad --partition {spec!r}: <brokerId>-<partition> or a number")
    if len(chosen) != 1:
        raise UsageError(
            f"--partition {spec!r} matches {len(chosen)} of {parts[0].topic}'s partitions "
            f"({', '.join(tp.key for tp in parts)})"
        )
    return chosen


def _topics(args: argparse.Namespace) -> list[str]:
    """The ``--topic`` values, patterns expanded against the brokers' topic list."""
    topics: list[str] = []
    for spec in args.topic:
        if "*" not in spec:
            topics.append(check_topic(spec))
            continue
        from pymetaq.client.cli.topics import all_topics
        from pymetaq.client.protocol.names import InvalidTopicName, topic_pattern

        try:
            pattern = topic_pattern(spec)
        except InvalidTopicName as e:
            raise UsageError(f"invalid topic pattern: {e}") from None
        found = sorted({r["topic"] for r in all_topics(args) if not r["pattern"]})
        matched = [t for t in found if pattern.fullmatch(t)]
        if not matched:
            raise UsageError(
                f"no topic matches {spec!r} (topics: {', '.join(found) or 'none'})",
                "a topic of a [topic=...*...] pattern exists once its first message is put",
            )
        topics.extend(t for t in matched if t not in topics)
    return topics


def _start_offset(args: argparse.Namespace) -> tuple[str, int | None]:
    """(initial position, explicit offset or None) from ``--from``."""
    start: str = args.start
    if start in ("earliest", "latest", "auto"):
        return start, None
    if start.isdigit():
        return "auto", int(start)
    raise UsageError(f"--from must be earliest, latest or an offset (>= 0), not {start!r}")


def _check_offset(servers: str, tp: TopicPartition, offset: int) -> None:
    from pymetaq.client.cli.positions import check_record_start

    async def check() -> str | None:
        with servers_in_use(servers):
            tr = BrokerTransport(servers, ConsumerConfig())
        try:
            await tr.start()
            return await check_record_start(tr, tp, offset)
        finally:
            tr.close()

    why = asyncio.run(check())
    if why is not None:
        raise UsageError(f"--from {offset}: {why}")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    servers = servers_of(args)
    group = check_group_arg(args.group)
    start, offset = _start_offset(args)
    topics = _topics(args)
    if (args.partition is not None or offset is not None) and len(topics) != 1:
        raise UsageError("--partition and --from OFFSET take one topic")
    # no --offset-store: the consumer's own default (the file store; ZooKeeper for zk:// servers)
    store = open_store(args.offset_store) if group is not None and args.offset_store else None
    try:
        with servers_in_use(servers):
            consumer = Consumer(servers, group, store, initial_position=start)
    except BaseException:
        if store is not None:
            store.close()
        raise
    try:
        with graceful_stop() as stop:
            for topic in topics:
                consumer.subscribe(topic)
            parts = consumer.assignment()
            if args.partition is not None:
                parts = _select(parts, args.partition)
                consumer.assign(parts)
            if offset is not None:
                if len(parts) != 1:
                    raise UsageError(
                        f"--from {offset} needs --partition: {topics[0]} has {len(parts)} "
                        f"partitions ({', '.join(tp.key for tp in parts)})"
                    )
                _check_offset(servers, parts[0], offset)
                consumer.seek(parts[0], offset)
            waits_at_end = group is None and start in ("auto", "latest") and offset is None
            return _loop(consumer, args, out, stop, topics if waits_at_end else None)
    except KeyboardInterrupt:  # a second Ctrl-C or SIGTERM: stop now; close() commits
        return 0
    finally:
        try:
            consumer.close()
        finally:
            if store is not None:
                store.close()


def _loop(
    consumer: Consumer,
    args: argparse.Namespace,
    out: TextIO,
    stop: StopRequest,
    hint_topics: list[str] | None,
) -> int:
    """Print messages until ``--count``/``--idle-timeout``/a stop request (Ctrl-C, SIGTERM:
    checked between two messages, so exactly the printed ones count as consumed);
    ``hint_topics``: an ungrouped consumer that started at the end says once on stderr that it
    waits for new messages."""
    printed = 0
    last = time.monotonic()
    while not stop.requested:
        batch = consumer.poll(0.5, args.count - printed if args.count else 0)
        if batch:
            last = time.monotonic()
        elif args.idle_timeout and time.monotonic() - last >= args.idle_timeout:
            return 0
        elif hint_topics is not None and printed == 0:
            sys.stderr.write(
                f"pymetaq consume: waiting for new messages on {', '.join(hint_topics)} "
                "(without --group it starts at the end; --from-beginning prints what is "
                "already there)\n"
            )
            sys.stderr.flush()
            hint_topics = None
        cursor = consumer._cursor  # exactly the printed messages count as consumed
        cursor.load(batch)
        for m in batch:
            out.write(format_message(m, args.format) + "\n")
            cursor.done += 1
            printed += 1
            if (args.count and printed >= args.count) or stop.requested:
                break
        out.flush()
        if args.count and printed >= args.count:
            return 0
    return 0
