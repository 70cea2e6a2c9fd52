"""Raw-socket helpers for the transaction tests: exact request bytes, parsed or exact replies.

Kept here (not in tests/server) so the transaction tests depend only on the codec and
``tests._broker``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

from pymetaq.client.protocol import NEED_DATA, Limits, Parser, ResultReply, Role, ValueReply
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import Record, iter_records

T = TypeVar("T")


def result(code: int, body: bytes, opaque: int) -> bytes:
    return b"result %d %d %d\r\n" % (code, len(body), opaque) + body


def tx_line(key: str, session: str, kind: str, *rest: str | int) -> bytes:
    """``transaction <key> <session> <kind> [<timeout>] [<qualifier>] <opaque>\\r\\n``: the
    last of ``rest`` is the opaque."""
    tokens = ["transaction", key, session, kind, *(str(e) for e in rest)]
    return " ".join(tokens).encode() + b"\r\n"


def tx_put(topic: str, partition: int, data: bytes, key: str, opaque: int, flag: int = 0) -> bytes:
    """The 8-token put MetaQ's Java client sends inside a transaction (checksum included)."""
    head = b"put %s %d %d %d %d %s %d\r\n" % (
        topic.encode(),
        partition,
        len(data),
        flag,
        checksum(data),
        key.encode(),
        opaque,
    )
    return head + data


class Wire:
    """One blocking connection; replies through the codec's client parser or as raw bytes."""

    def __init__(self, address: tuple[str, int], timeout: float = 20.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = Parser(Role.CLIENT, Limits(max_body=64 << 20))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> ResultReply | ValueReply:
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, ResultReply | ValueReply)
                return event
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.parser.feed(chunk)

    def call(self, data: bytes) -> ResultReply:
        self.send(data)
        r = self.reply()
        assert isinstance(r, ResultReply), r
        return r

    def exact(self, data: bytes, expected: bytes) -> None:
        """Send ``data``; the next bytes on the wire are exactly ``expected``."""
        self.send(data)
        assert self.read_exact(len(expected)) == expected

    def read_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes: {bytes(out)!r}")
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def put_ok(w: Wire, topic: str, partition: int, data: bytes, key: str, opaque: int) -> int:
    """A transactional put that must succeed; returns the msg id."""
    r = w.call(tx_put(topic, partition, data, key, opaque))
    assert (r.code, r.opaque) == (200, opaque), r
    msg_id, part, offset = r.body.split(b" ")
    assert (int(part), offset) == (partition, b"-1"), r
    return int(msg_id)


def ok(w: Wire, data: bytes, opaque: int, body: bytes = b"") -> None:
    r = w.call(data)
    assert r == ResultReply(200, body, opaque), r


def read_log(address: tuple[str, int], topic: str, partition: int) -> list[Record]:
    """Every record of a partition, from offset 0, over ``get``."""
    out: list[Record] = []
    with Wire(address) as w:
        offset, opaque = 0, 1
        while True:
            w.send(
                b"get %s g %d %d %d %d\r\n" % (topic.encode(), partition, offset, 1 << 20, opaque)
            )
            r = w.reply()
            opaque += 1
            if isinstance(r, ResultReply):
                assert r.code in (404, 301) or r.code == 200, r
                return out
            recs = list(iter_records(r.data, offset))
            if not recs:
                return out
            out += recs
            offset = recs[-1].offset + recs[-1].size


def log_when(address: tuple[str, int], topic: str, partition: int, count: int) -> list[Record]:
    """The partition's records once it holds at least ``count``: committed messages become
    readable after the partition's fsync, which may complete just after the COMMIT's ack."""
    box: list[list[Record]] = []

    def enough() -> bool:
        box[:] = [read_log(address, topic, partition)]
        return len(box[0]) >= count

    wait_for(enough, what=f"{count} records in {topic}-{partition}")
    return box[0]


def wait_for(predicate: Callable[[], T], timeout: float = 20.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError(f"{what} not reached within {timeout} s")
