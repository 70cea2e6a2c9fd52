"""Defect 5: the broker refuses a record a consumer could not decode (flags, attribute framing,
lz4 batches) with ``result 400``, stores nothing of that put or batch, and keeps the connection.

Before the fix any flag with a valid CRC was stored (256 on data that is not lz4, 1 with a bad
attribute length, -1), and every consumer of the partition stalled on it.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator

import lz4.frame
import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import encode_record, iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, put_line, result

pytestmark = pytest.mark.integration

LZ4 = 0x100


def attr(attribute: bytes, payload: bytes, length: int | None = None) -> bytes:
    return struct.pack(">i", len(attribute) if length is None else length) + attribute + payload


def lz4_batch(records: bytes, **kw: bool) -> bytes:
    return bytes(lz4.frame.compress(records, **kw))


GOOD_INNER = encode_record(b"one") + encode_record(attr(b"k=v", b"two"), 1)
BAD: list[tuple[str, bytes, int, str]] = [
    ("unknown bit", b"data", 2, "unknown flag bits 0x2 in flag 2"),
    ("high bit", b"data", 1 << 20, "unknown flag bits 0x100000 in flag 1048576"),
    ("negative", b"data", -1, "unknown flag bits 0xfffffefe in flag -1"),
    ("attr short", b"abc", 1, "attribute flag set but data shorter than 4 bytes"),
    ("attr too long", attr(b"k", b"payload", 99), 1, "attribute length 99 exceeds data length 12"),
    ("attr negative", attr(b"k", b"payload", -2), 1, "attribute length -2 exceeds data length 12"),
    ("attr not utf8", attr(b"\xff\xfe", b"x"), 1, "attribute is not UTF-8"),
    ("lz4 not lz4", b"hello, not lz4", LZ4, "lz4 batch is not an lz4 frame"),
    ("lz4 and attr", lz4_batch(GOOD_INNER), LZ4 | 1, "an lz4 batch has no attribute (flag 257)"),
    ("lz4 truncated", lz4_batch(GOOD_INNER)[:-6], LZ4, "lz4 batch is not an lz4 frame"),
    ("lz4 empty", lz4_batch(b""), LZ4, "lz4 batch holds no record"),
    ("lz4 partial inner", lz4_batch(GOOD_INNER[:-1]), LZ4, "lz4 batch holds a truncated record"),
    (
        "lz4 nested",
        lz4_batch(encode_record(lz4_batch(GOOD_INNER), LZ4)),
        LZ4,
        "lz4 batch: inner record: nested lz4 batch",
    ),
    (
        "lz4 inner attr",
        lz4_batch(encode_record(b"ab", 1)),
        LZ4,
        "lz4 batch: inner record: attribute flag set but data shorter than 4 bytes",
    ),
]
GOOD: list[tuple[str, bytes, int]] = [
    ("plain", b"plain", 0),
    # inner CRCs are the consumer's to check (storage/flags.py: the outer CRC covers them)
    ("lz4 inner crc", lz4_batch(GOOD_INNER[:4] + b"\0\0\0\0" + GOOD_INNER[8:]), LZ4),
    ("attribute", attr(b"k=v", b"payload"), 1),
    ("empty attribute", attr(b"", b""), 1),
    ("lz4", lz4_batch(GOOD_INNER, store_size=True), LZ4),
    ("lz4 no size", lz4_batch(GOOD_INNER, store_size=False), LZ4),
    ("lz4 checksums", lz4_batch(GOOD_INNER, content_checksum=True, block_checksum=True), LZ4),
]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    topics = {"flags": {"numPartitions": 4}}
    with BrokerProcess.start(tmp_path_factory.mktemp("flags"), topics=topics) as b:
        yield b


@pytest.fixture
def wire(broker: BrokerProcess) -> Iterator[Wire]:
    with Wire(broker.address) as w:
        yield w


def end_offset(w: Wire, partition: int, opaque: int) -> int:
    reply = w.call(b"offset flags g %d 9223372036854775807 %d\r\n" % (partition, opaque))
    if isinstance(reply, ResultReply) and reply.code == 404:
        return 0
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    return int(reply.body)


def bput(partition: int, records: list[bytes], opaque: int) -> bytes:
    body = b"".join(records)
    head = b"bput flags %d %d %d %d %d\r\n" % (
        partition,
        len(body),
        len(records),
        checksum(body),
        opaque,
    )
    return head + body


@pytest.mark.parametrize(("name", "data", "flag", "reason"), BAD, ids=[b[0] for b in BAD])
def test_a_put_with_an_undecodable_record_is_400_and_stores_nothing(
    wire: Wire, name: str, data: bytes, flag: int, reason: str
) -> None:
    before = end_offset(wire, 0, 1)
    wire.send(put_line("flags", 0, data, 2, checksum(data), flag=flag) + b"version 3\r\n")
    expected = result(400, b"invalid records: " + reason.encode(), 2)
    assert wire.read_exact(len(expected)) == expected
    assert isinstance(wire.reply(), ResultReply)  # the connection stays usable
    assert end_offset(wire, 0, 4) == before


@pytest.mark.parametrize(("name", "data", "flag", "reason"), BAD, ids=[b[0] for b in BAD])
def test_a_bput_holding_an_undecodable_record_is_400_and_stores_nothing(
    wire: Wire, name: str, data: bytes, flag: int, reason: str
) -> None:
    bad = encode_record(data, flag)
    for partition, records in (
        (1, [encode_record(b"a" * 10), bad, encode_record(b"b")]),  # mixed lengths
        (2, [bad] * 5),  # a uniform batch: the fast path
        (3, [bad]),
    ):
        before = end_offset(wire, partition, 10)
        wire.send(bput(partition, records, 11))
        expected = result(400, b"invalid records: " + reason.encode(), 11)
        assert wire.read_exact(len(expected)) == expected
        assert end_offset(wire, partition, 12) == before


@pytest.mark.parametrize(("name", "data", "flag"), GOOD, ids=[g[0] for g in GOOD])
def test_decodable_flagged_records_are_stored_verbatim(
    wire: Wire, name: str, data: bytes, flag: int
) -> None:
    reply = wire.call(put_line("flags", 0, data, 20, checksum(data), flag=flag))
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    offset = int(reply.body.split()[2])
    reply = wire.call(bput(1, [encode_record(data, flag)] * 3, 21))
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    got = wire.call(b"get flags g 0 %d 1048576 22\r\n" % offset)
    assert isinstance(got, ValueReply)
    first = next(iter_records(got.data, offset))
    assert (first.flag, first.data) == (flag, data)


def test_a_good_record_after_a_refused_one_is_delivered(wire: Wire, seed: int) -> None:
    """The original symptom: a consumer stalled on the bad record; now it never gets in."""
    rng = random.Random(seed)
    partition = 3
    start = end_offset(wire, partition, 30)
    sent: list[bytes] = []
    for i in range(40):
        name, data, flag, _reason = rng.choice(BAD)
        wire.send(bput(partition, [encode_record(data, flag)], 100 + i))
        reply = wire.reply()
        assert isinstance(reply, ResultReply) and reply.code == 400, (name, reply)
        good = b"good-%d" % i
        reply = wire.call(put_line("flags", partition, good, 200 + i, checksum(good)))
        assert isinstance(reply, ResultReply) and reply.code == 200, reply
        sent.append(good)
    got = wire.call(b"get flags g %d %d 1048576 31\r\n" % (partition, start))
    assert isinstance(got, ValueReply)
    assert [r.data for r in iter_records(got.data, start)] == sent
