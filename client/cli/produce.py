"""``pymetaq produce``: send a file's (or stdin's) messages to a topic.

```
pymetaq produce --server meta://127.0.0.1:8123 --topic T [--file F]
                [--framing lines|length] [--key K | --partition P] [--attribute A]
                [--compression lz4] [--batch N] [--progress | --no-progress]
```

* ``--framing lines`` (default): one message per line, the line ending (``\\n`` or ``\\r\\n``)
  removed; an empty line is an empty message; a last line without a newline still counts.
  ``--framing length``: each message is a 4-byte big-endian length followed by that many bytes.
* Messages go out in chunks of ``--batch`` (default 1000) with ``send_many``: each chunk to one
  partition - the key's (``--key``), the given one (``--partition``: index or ``b-p``), or the
  next in round-robin order. Order within a partition is the input order.
* A progress line (count, rate) is redrawn on stderr twice a second when stderr is a terminal
  (``--progress`` forces it); a summary is printed on stderr at the end. Exit code 0 when every
  message was acknowledged, 1 if any failed, 2 for a usage/connection error.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from pymetaq.client.errors import MetaClientError
from pymetaq.client.producer.batch import BatchHandle
from pymetaq.client.producer.sync import Producer

_LEN = struct.Struct(">I")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("produce", help="send a file's (or stdin's) messages to a topic")
    p.add_argument("--server", default="meta://127.0.0.1:8123", help="meta://host:port[,...]")
    p.add_argument("--topic", required=True)
    p.add_argument("--file", help="input file (default: stdin)")
    p.add_argument("--framing", choices=["lines", "length"], default="lines")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--key", help="partition key (all messages to the key's partition)")
    group.add_argument("--partition", help="partition index or <brokerId>-<partition>")
    p.add_argument("--attribute", help="attribute string for every message")
    p.add_argument("--compression", choices=["lz4"], default=None)
    p.add_argument(
        "--batch", type=int, default=1000, help="messages per send (default %(default)s)"
    )
    p.add_argument("--timeout", type=float, default=3.0, help="request timeout, seconds")
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


def run(
    args: argparse.Namespace, stdin: IO[bytes] | None = None, err: IO[str] | None = None
) -> int:
    err = err or sys.stderr
    partition: int | str | None = None
    if args.partition is not None:
        partition = int(args.partition) if args.partition.lstrip("-").isdigit() else args.partition
    try:
        producer = Producer(
            args.server,
            compression=args.compression,
            batch_messages=max(1, args.batch),
            request_timeout_ms=args.timeout * 1000,
        )
    except (MetaClientError, ValueError) as e:
        err.write(f"pymetaq produce: {e}\n")
        return 2
    show = err.isatty() if args.progress is None else args.progress
    progress = Progress(err, show)
    handles: list[BatchHandle] = []
    count = nbytes = 0
    stream: IO[bytes] = open(args.file, "rb") if args.file else (stdin or sys.stdin.buffer)  # noqa: SIM115
    try:
        messages = iter_lines(stream) if args.framing == "lines" else iter_length_prefixed(stream)
        for chunk in chunks(messages, max(1, args.batch)):
            handles.append(
                producer.send_many(
                    args.topic, chunk, key=args.key, partition=partition, attribute=args.attribute
                )
            )
            count += len(chunk)
            nbytes += sum(map(len, chunk))
            progress.update(count)
        producer.flush()
    except (MetaClientError, ValueError) as e:
        err.write(f"\npymetaq produce: {e}\n")
        return 2
    finally:
        if args.file:
            stream.close()
        producer.close()
    failed = 0
    errors: set[str] = set()
    for h in handles:
        if not h.wait(0):
            bad = sum(1 for r in h.result(0) if not r.success)
            failed += bad
            errors.update(str(e) for e in h.errors)
    elapsed = time.monotonic() - progress.start
    progress.update(count, force=True)
    if show:
        err.write("\n")
    err.write(
        f"produced {count - failed:,} of {count:,} messages ({nbytes:,} bytes) to {args.topic} "
        f"in {elapsed:.2f}s ({count / max(elapsed, 1e-9):,.0f} msg/s)"
        + (f"; {failed:,} failed: {'; '.join(sorted(errors))}" if failed else "")
        + "\n"
    )
    return 1 if failed else 0
