"""pymetaq's batched ``bsync`` between a samsa master and a pymetaq gregor slave, and MetaQ's
``sync`` next to it, with real broker processes.

The master asks the slave's ``version`` and sends a pymetaq slave each stored batch as one
``bsync`` (``stats replication`` says ``form bsync``); the slave still answers MetaQ's ``sync``
exactly as MetaQ's gregor does, and keeps one connection's ``sync`` and ``bsync`` in order.
Hostile ``bsync`` frames are refused with nothing stored.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pymetaq.client import Producer
from pymetaq.client.protocol import ResultReply
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import encode_record
from tests._helpers import wait_for
from tests._services import free_port
from tests.ha._helpers import offsets, records, start_gregor, start_samsa, stats
from tests.server._helpers import Wire

pytestmark = pytest.mark.integration


def bsync(
    topic: str, partition: int, body: bytes, count: int, opaque: int, crc: int | None
) -> bytes:
    token = -1 if crc is None else crc
    return (
        b"bsync %s %d %d %d %d %d\r\n"
        % (topic.encode(), partition, len(body), count, token, opaque)
        + body
    )


def sync(msg_id: int, data: bytes, opaque: int) -> bytes:
    return b"sync orders 0 %d 0 %d %d %d\r\n" % (len(data), msg_id, checksum(data), opaque) + data


def test_master_sends_bsync_to_a_pymetaq_slave(tmp_path: Path) -> None:
    port = free_port()
    with start_gregor(tmp_path, port) as slave, start_samsa(tmp_path, port) as master:
        wait_for(
            lambda: "form bsync" in stats(master, "replication")[0], 30, "the master asks version"
        )
        with Producer(f"meta://127.0.0.1:{master.port}") as p:
            handles = [p.send_async("orders", b"v%d" % i, partition=i % 2) for i in range(300)]
            assert all(h.result(30).success for h in handles)
        line = stats(master, "replication")[0].split()
        assert line[:7] == [
            "gregor",
            f"127.0.0.1:{port}",
            "state",
            "connected",
            "form",
            "bsync",
            "batches",
        ]
        assert 2 <= int(line[7]) <= 300 and line[8:] == ["failures", "0"]
        for part in (0, 1):
            ours = records(master, part)
            assert ours == records(slave, part) and len(ours) == 150
        assert slave.terminate() == 0 and master.terminate() == 0
    for part in (0, 1):
        name = f"orders-{part}/{0:020d}.meta"
        assert (slave.data_path / name).read_bytes() == (master.data_path / name).read_bytes()


def test_slave_takes_metaqs_sync_and_bsync_in_order(tmp_path: Path) -> None:
    with start_gregor(tmp_path, free_port()) as slave:
        with Wire(slave.address) as w:
            reply = w.call(sync(777, b"metaq", 21))  # MetaQ's form: one message
            assert reply == ResultReply(200, b"777 0 0", 21)
            batch = encode_record(b"b1", 0, 779) + encode_record(b"b2", 0, 780)
            # a sync then a bsync in one write: stored and answered in that order
            w.send(sync(778, b"s2", 22) + bsync("orders", 0, batch, 2, 23, checksum(batch)))
            first, second = w.reply(), w.reply()
        assert first == ResultReply(200, b"778 0 25", 22)
        assert second == ResultReply(200, b"779 0 47 2", 23)
        got = [(off, mid, data) for off, mid, data in records(slave, 0)]
        assert got == [(0, 777, b"metaq"), (25, 778, b"s2"), (47, 779, b"b1"), (69, 780, b"b2")]


BAD = [
    (
        "wrong checksum",
        bsync("orders", 0, encode_record(b"x", 0, 5), 1, 40, 12345),
        500,
        b"Checksum failed: batch body checksum mismatch",
    ),
    (
        "a count the body cannot hold",
        bsync("orders", 0, encode_record(b"x", 0, 5), 2, 40, None),
        400,
        b"invalid batch: 2 records",
    ),
    ("msgId 0", bsync("orders", 0, encode_record(b"x"), 1, 40, None), 400, b"invalid records:"),
    (
        "a record's CRC",
        bsync("orders", 0, encode_record(b"x", 0, 5)[:-1] + b"y", 1, 40, None),
        400,
        b"invalid records:",
    ),
    (
        "a torn record",
        bsync("orders", 0, encode_record(b"xyz", 0, 5)[:-1], 1, 40, None),
        400,
        b"invalid records:",
    ),
    (
        "an unknown topic",
        bsync("nope", 0, encode_record(b"x", 0, 5), 1, 40, None),
        500,
        b"The topic `nope`",
    ),
    (
        "a bad partition",
        bsync("orders", 9, encode_record(b"x", 0, 5), 1, 40, None),
        500,
        b"Wrong partition 9",
    ),
    (
        "a bad topic name",
        bsync("../x", 0, encode_record(b"x", 0, 5), 1, 40, None),
        400,
        b"invalid topic name '../x'",
    ),
]


def test_hostile_bsync_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    with start_gregor(tmp_path, free_port()) as slave, Wire(slave.address) as w:
        for what, frame, code, text in BAD:
            reply = w.call(frame)
            assert isinstance(reply, ResultReply), what
            assert (reply.code, reply.opaque) == (code, 40), (what, reply)
            assert reply.body.startswith(text), (what, reply.body)
        assert w.call(b"version 41\r\n").code == 200  # type: ignore[union-attr]
        assert records(slave, 0) == [] and offsets(slave) == {("orders", 0): (0, 0)}


def test_a_broker_that_is_no_slave_refuses_bsync(tmp_path: Path) -> None:
    port = free_port()
    with start_gregor(tmp_path, port), start_samsa(tmp_path, port) as master:
        with Wire(master.address) as w:
            reply = w.call(bsync("orders", 0, encode_record(b"x", 0, 5), 1, 50, None))
        assert isinstance(reply, ResultReply) and (reply.code, reply.opaque) == (500, 50)
        assert reply.body.startswith(b"sync is only accepted by a slave broker")


def test_an_8_token_bsync_is_stored_only_where_the_slaves_log_ends(tmp_path: Path) -> None:
    """The offset form (a rejoined replica, kept offset for offset): stored when the slave's
    log ends at that offset, else 409 and nothing written."""
    one, two = encode_record(b"o1", 0, 901), encode_record(b"o2", 0, 902)

    def at(body: bytes, offset: int, opaque: int) -> bytes:
        head = b"bsync orders 1 %d 1 %d %d %d\r\n" % (len(body), checksum(body), offset, opaque)
        return head + body

    with start_gregor(tmp_path, free_port()) as slave, Wire(slave.address) as w:
        assert w.call(at(one, 0, 31)) == ResultReply(200, b"901 1 0 1", 31)
        mismatch = b"offset mismatch: this log ends at %d, not at 0" % len(one)
        assert w.call(at(two, 0, 32)) == ResultReply(409, mismatch, 32)  # a resend: refused
        gap = b"offset mismatch: this log ends at %d, not at %d" % (len(one), len(one) + 5)
        assert w.call(at(two, len(one) + 5, 33)) == ResultReply(409, gap, 33)  # a gap: refused
        assert w.call(at(two, len(one), 34)) == ResultReply(200, b"902 1 %d 1" % len(one), 34)
        assert [m for _, m, _ in records(slave, 1)] == [901, 902]
