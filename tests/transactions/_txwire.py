"""Raw-socket helpers for the transaction tests: exact request bytes, parsed or exact replies.

Built on tests/server's ``Wire`` and the suite's one ``wait_for``.
"""

from __future__ import annotations

from typing import Self

from pymetaq.client.protocol import ResultReply
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import Record, iter_records
from tests._helpers import wait_for
from tests.server._helpers import Wire as ServerWire

__all__ = ["Wire", "wait_for"]


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


class Wire(ServerWire):
    """tests/server's blocking connection, with ``call`` narrowed to a ``result`` reply and
    exact-bytes exchanges (the Java client replays)."""

    def call(self, data: bytes) -> ResultReply:  # type: ignore[override]
        r = super().call(data)
        assert isinstance(r, ResultReply), r
        return r

    def __enter__(self) -> Self:
        return self

    def exact(self, data: bytes, expected: bytes) -> None:
        """Send ``data``; the next bytes on the wire are exactly ``expected``."""
        self.send(data)
        assert self.read_exact(len(expected)) == expected


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
