"""``pymetaq produce``: send a file's (or stdin's) messages to a topic.

```
pymetaq produce --topic T [--servers URLS] [--file F]
                [--framing lines|length] [--key K | --partition P] [--attribute A]
                [--compression lz4] [--batch N] [--progress | --no-progress]
```

* ``--servers`` (``--server``): ``meta://host:port[,...]`` or ``zk://...`` (default
  ``$PYMETAQ_SERVERS``, else ``meta://127.0.0.1:8123``; :mod:`pymetaq.client.cli.common`).
* ``--framing lines`` (default): one message per line, the line ending (``\\n`` or ``\\r\\n``)
  removed; an empty line is an empty message; a last line without a newline still counts.
  ``--framing length``: each message is a 4-byte big-endian length followed by that many bytes.
* Messages go out in chunks of ``--batch`` (default 1000) with ``send_many``, in batches of at
  most 4096 (what a broker takes in one ``bput``): each chunk to one partition - the key's (``--key``), the given one (``--partition``: index or ``b-p``), or the
  next in round-robin order. Order within a partition is the input order.
* A progress line (count, rate) is redrawn on stderr twice a second when stderr is a terminal
  (``--progress`` forces it); a summary is printed on stderr at the end. Ctrl-C or SIGTERM stops
  reading, sends what was read and prints the summary. Exit code 0 when every message was
  acknowledged, 1 if any failed or the broker cannot be reached, 2 for a usage error (a bad
  argument, a missing ``--file``), 130 when interrupted.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from pymetaq.client.cli.common import (
    UsageError,
    add_servers_option,
    check_topic,
    non_negative,
    servers_in_use,
    servers_of,
    sigterm_as_interrupt,
)
from pymetaq.client.errors import UnknownTopicOrPartition
from pymetaq.client.producer.batch import BatchHandle
from pymetaq.client.producer.config import MAX_BATCH_MESSAGES
from pymetaq.client.producer.partitioner import resolve_explicit
from pymetaq.client.producer.sync import Producer

_LEN = struct.Struct(">I")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("produce", help="send a file's (or stdin's) messages to a topic")
    add_servers_option(p)
    p.add_argument("--topic", required=True)
    p.add_argument("--file", help="input file (default: stdin)")
    p.add_argument("--framing", choices=["lines", "length"], default="lines")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--key", help="partition key (all messages to the key's partition)")
    group.add_argument("--partition", help="partition index or <brokerId>-<partition>")
    p.add_argument("--attribute", help="attribute string for every message")
    p.add_argument("--compression", choices=["lz4"], default=None)
    p.add_argument(
        "--batch",
        type=non_negative(int),
        default=1000,
        help="messages per send (default %(default)s)",
    )
    p.add_argument(
        "--timeout", type=non_negative(float), default=3.0, help="request timeout, seconds"
    )
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None)
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=run)


def iter_lines(stream: IO[bytes]) -> Iterator[bytes]:
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def iter_length_prefixed(stream: IO[bytes]) -> Iterator[bytes]:
    while True:
        head = stream.read(4)
        if not head:
            return
        if len(head) < 4:
            raise ValueError("input ends inside a 4-byte length prefix")
        (n,) = _LEN.unpack(head)
        body = stream.read(n)
        if len(body) < n:
            raise ValueError(f"input ends inside a message ({len(body)} of {n} bytes)")
        yield body


def chunks(messages: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for m in messages:
        chunk.append(m)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class Progress:
    """A throttled ``count, rate`` line on stderr."""

    def __init__(self, out: IO[str], enabled: bool) -> None:
        self.out = out
        self.enabled = enabled
        self.start = time.monotonic()
        self._last = 0.0

    def update(self, count: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < 0.5):
            return
        self._last = now
        rate = count / max(now - self.start, 1e-9)
        self.out.write(f"\r{count:,} messages  {rate:,.0f} msg/s ")
        self.out.flush()


def partition_arg(spec: str | None) -> int | str | None:
    """``--partition``: an index into the topic's sorted partitions or ``<brokerId>-<n>``."""
    if spec is None:
        return None
    if spec.isdigit():
        return int(spec)
    b, sep, n = spec.partition("-")
    if sep and b.isdigit() and n.isdigit():
        return spec
    raise UsageError(
        f"bad --partition {spec!r}: a partition number or <brokerId>-<partition> (e.g. 0-1)"
    )


def _check_target(producer: Producer, topic: str, partition: int | str | None) -> None:
    """Learn the topic's partitions before reading any input: an unknown topic or partition
    fails at once (not after the input was read)."""
    parts = producer.partitions(topic)
    try:
        if partition is not None:
            resolve_explicit(topic, parts, partition)
    except UnknownTopicOrPartition:
        keys = ", ".join(tp.key for tp in parts)
        raise UsageError(
            f"bad --partition {partition!r}: {topic} has {len(parts)} partition(s): {keys} "
            f"(or an index 0..{len(parts) - 1})"
        ) from None


def open_input(args: argparse.Namespace, stdin: IO[bytes] | None) -> IO[bytes]:
    if not args.file:
        return stdin or sys.stdin.buffer
    try:
        return open(args.file, "rb")
    except OSError as e:
        raise UsageError(f"cannot read --file {args.file!r}: {e.strerror}") from None


def run(
    args: argparse.Namespace, stdin: IO[bytes] | None = None, err: IO[str] | None = None
) -> int:
    err = err or sys.stderr
    check_topic(args.topic)
    partition = partition_arg(args.partition)
    servers = servers_of(args)
    stream = open_input(args, stdin)
    try:
        with servers_in_use(servers):
            producer = Producer(
                servers,
                compression=args.compression,
                batch_messages=min(max(1, args.batch), MAX_BATCH_MESSAGES),
                request_timeout_ms=args.timeout * 1000,
            )
        _check_target(producer, args.topic, partition)
    except BaseException:
        if args.file:
            stream.close()
        if "producer" in locals():
            producer.close()
        raise
    show = err.isatty() if args.progress is None else args.progress
    progress = Progress(err, show)
    handles: list[BatchHandle] = []
    count = nbytes = 0
    interrupted: KeyboardInterrupt | None = None
    try:
        with sigterm_as_interrupt():
            messages = (
                iter_lines(stream) if args.framing == "lines" else iter_length_prefixed(stream)
            )
            for chunk in chunks(messages, max(1, args.batch)):
                handles.append(
                    producer.send_many(
                        args.topic,
                        chunk,
                        key=args.key,
                        partition=partition,
                        attribute=args.attribute,
                    )
                )
                count += len(chunk)
                nbytes += sum(map(len, chunk))
                progress.update(count)
    except KeyboardInterrupt as e:  # Ctrl-C / SIGTERM: send what was read, then report
        interrupted = e
    except ValueError as e:  # the input ends inside a length-prefixed message
        raise UsageError(f"{args.file or 'stdin'}: {e}") from None
    finally:
        if args.file:
            stream.close()
        try:
            producer.flush()
        finally:
            producer.close()
    failed = _report(handles, count, nbytes, args.topic, progress, err, interrupted)
    if interrupted is not None:
        return 130
    return 1 if failed else 0


def _report(
    handles: list[BatchHandle],
    count: int,
    nbytes: int,
    topic: str,
    progress: Progress,
    err: IO[str],
    interrupted: BaseException | None,
) -> int:
    """Print the summary line; the number of messages that failed."""
    failed = 0
    errors: set[str] = set()
    for h in handles:
        if not h.wait(0):
            bad = sum(1 for r in h.result(0) if not r.success)
            failed += bad
            errors.update(str(e) for e in h.errors)
    elapsed = time.monotonic() - progress.start
    progress.update(count, force=True)
    if progress.enabled:
        err.write("\n")
    err.write(
        f"produced {count - failed:,} of {count:,} messages ({nbytes:,} bytes) to {topic} "
        f"in {elapsed:.2f}s ({count / max(elapsed, 1e-9):,.0f} msg/s)"
        + (f"; {failed:,} failed: {'; '.join(sorted(errors))}" if failed else "")
        + ("; interrupted: the rest of the input was not read" if interrupted else "")
        + "\n"
    )
    return failed
