"""Record building, lz4 batches, decode_messages, server lists and the error mapping (pure)."""

from __future__ import annotations

import random
import struct
import zlib

import lz4.frame
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymetaq.client.errors import (
    BadRequest,
    BrokerInternalError,
    CorruptMessage,
    NotFound,
    OffsetOutOfRange,
    PartitionClosed,
    ServiceBusy,
    UnknownTopicOrPartition,
    error_for_reply,
)
from pymetaq.client.transport.records import (
    build_record,
    build_records,
    compress_batch,
    decode_messages,
)
from pymetaq.client.transport.servers import parse_servers, parse_stats
from pymetaq.client.types import Message, TopicPartition
from pymetaq.storage.record import FLAG_LZ4_BATCH, encode_data, encode_record, iter_records


def test_build_record_is_byte_identical_to_storage_encoding() -> None:
    for value, attr in [
        (b"hello", None),
        (b"", None),
        (b"payload", "tag"),
        (b"x" * 1000, "\u00e9t\u00e9"),
    ]:
        data, flag = encode_data(value, attr)
        assert build_record(value, attr) == encode_record(data, flag)


def test_build_record_exact_bytes() -> None:
    rec = build_record(b"abc")
    crc = zlib.crc32(b"abc") & 0x7FFFFFFF
    assert rec == struct.pack(">iiqi", 3, crc, 0, 0) + b"abc"
    rec = build_record(b"v", "at")
    data = b"\x00\x00\x00\x02at" + b"v"
    assert rec == struct.pack(">iiqi", len(data), zlib.crc32(data) & 0x7FFFFFFF, 0, 1) + data


def test_build_records_concatenates() -> None:
    values = [b"a", b"bb", b"", b"cccc"]
    assert build_records(values) == b"".join(build_record(v) for v in values)
    assert len(list(iter_records(build_records(values)))) == 4


def _stamp(buf: bytes, first_id: int) -> bytes:
    """Stamp consecutive ids into records, as the broker does."""
    out = bytearray(buf)
    pos, i = 0, 0
    while pos < len(out):
        (length,) = struct.unpack_from(">i", out, pos)
        struct.pack_into(">q", out, pos + 8, first_id + i)
        pos += 20 + length
        i += 1
    return bytes(out)


def test_decode_plain_and_attribute_records() -> None:
    buf = _stamp(build_record(b"one") + build_record(b"two", "a") + build_record(b"three"), 100)
    msgs, nxt = decode_messages(buf, "t", 2, 1000, broker_id=7)
    assert [m.value for m in msgs] == [b"one", b"two", b"three"]
    assert [m.attribute for m in msgs] == [None, "a", None]
    assert [m.id for m in msgs] == [100, 101, 102]
    sizes = [23, 20 + 4 + 1 + 3, 25]
    assert [m.offset for m in msgs] == [1000, 1000 + sizes[0], 1000 + sizes[0] + sizes[1]]
    assert [m.next_offset for m in msgs] == [msgs[1].offset, msgs[2].offset, 1000 + len(buf)]
    assert nxt == 1000 + len(buf)
    assert msgs[0] == Message("t", 2, 1000, 100, b"one", None, 1023, 7)
    assert msgs[0].partition_key == "7-2"


def test_decode_stops_at_partial_record_at_every_cut(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.randbytes(rng.randrange(0, 50)) for _ in range(20)]
    buf = build_records(values)
    bounds = [0]
    for v in values:
        bounds.append(bounds[-1] + 20 + len(v))
    for cut in range(len(buf) + 1):
        msgs, nxt = decode_messages(buf[:cut], "t", 0, 50)
        complete = max(i for i, b in enumerate(bounds) if b <= cut)
        assert [m.value for m in msgs] == values[:complete]
        assert nxt == 50 + bounds[complete]


def test_decode_rejects_bad_crc_and_negative_length() -> None:
    buf = bytearray(build_record(b"hello") + build_record(b"world"))
    buf[25 + 20] ^= 0xFF  # flip a byte of the second record's data
    with pytest.raises(CorruptMessage) as e:
        decode_messages(bytes(buf), "t", 0, 10)
    assert e.value.offset == 35
    msgs, _ = decode_messages(bytes(buf), "t", 0, 10, verify=False)
    assert len(msgs) == 2
    bad = struct.pack(">iiqi", -5, 0, 0, 0)
    with pytest.raises(CorruptMessage):
        decode_messages(bad, "t", 0, 0)


def test_lz4_batch_round_trip() -> None:
    values = [f"message-{i}".encode() * 3 for i in range(100)]
    inner = (
        build_records(values[:50]) + build_record(values[50], "attr") + build_records(values[51:])
    )
    outer = compress_batch(inner)
    length, crc, _, flag = struct.unpack_from(">iiqi", outer)
    assert flag == FLAG_LZ4_BATCH
    assert length == len(outer) - 20
    assert lz4.frame.decompress(outer[20:]) == inner
    assert crc == zlib.crc32(outer[20:]) & 0x7FFFFFFF
    assert len(outer) < len(inner)
    # the storage layer accepts it as one ordinary record
    assert len(list(iter_records(outer))) == 1
    tail = build_record(b"after")
    buf = _stamp(outer + tail, 9)
    msgs, nxt = decode_messages(buf, "t", 0, 4096)
    assert [m.value for m in msgs] == [*values, b"after"]
    assert msgs[50].attribute == "attr"
    assert {m.offset for m in msgs[:100]} == {4096}
    assert {m.next_offset for m in msgs[:100]} == {4096 + len(outer)}
    assert {m.id for m in msgs[:100]} == {9}
    assert msgs[100].id == 10 and msgs[100].offset == 4096 + len(outer)
    assert nxt == 4096 + len(buf)


def test_lz4_batch_with_corrupt_frame() -> None:
    frame = b"not an lz4 frame"
    rec = (
        struct.pack(">iiqi", len(frame), zlib.crc32(frame) & 0x7FFFFFFF, 0, FLAG_LZ4_BATCH) + frame
    )
    with pytest.raises(CorruptMessage):
        decode_messages(rec, "t", 0, 0)


def test_parse_servers() -> None:
    assert parse_servers("meta://127.0.0.1:8123") == [("127.0.0.1", 8123)]
    assert parse_servers("meta://a:1, meta://b:2,meta://a:1") == [("a", 1), ("b", 2)]
    assert parse_servers("host:9") == [("host", 9)]
    assert parse_servers("meta://[::1]:8123") == [("::1", 8123)]
    assert parse_servers(["meta://x:5"]) == [("x", 5)]
    for bad in [
        "",
        "meta://host",
        "meta://host:0",
        "meta://host:70000",
        "http://h:1",
        "meta://h:p",
    ]:
        with pytest.raises(ValueError):
            parse_servers(bad)


def test_parse_stats() -> None:
    body = b"STATS\r\npid 12\r\nbroker_id 3\r\nversion 1.4.6\r\ntopic t partitions 4\r\nEND\r\n"
    assert parse_stats(body) == {
        "pid": "12",
        "broker_id": "3",
        "version": "1.4.6",
        "topic": "t partitions 4",
    }


def test_partition_order_and_key() -> None:
    tp = TopicPartition
    parts = [tp("t", 2, 0), tp("t", 1, 1), tp("t", 1, 0), tp("t", 10, 0)]
    assert sorted(parts) == [tp("t", 1, 0), tp("t", 1, 1), tp("t", 2, 0), tp("t", 10, 0)]
    assert TopicPartition.from_key("t", "10-3") == tp("t", 10, 3)
    assert (tp("t", 10, 3).key, str(tp("t", 10, 3))) == ("10-3", "t/10-3")
    with pytest.raises(ValueError):
        TopicPartition.from_key("t", "103")


@pytest.mark.parametrize(
    ("code", "body", "cls", "retriable"),
    [
        (400, b"bad", BadRequest, False),
        (403, b"closed", PartitionClosed, True),
        (404, b"", NotFound, True),
        (500, b"io error", BrokerInternalError, False),
        (500, b"Unknown topic foo", UnknownTopicOrPartition, False),
        (503, b"busy", ServiceBusy, True),
    ],
)
def test_error_for_reply(code: int, body: bytes, cls: type, retriable: bool) -> None:
    err = error_for_reply(code, body)
    assert type(err) is cls
    assert err.retriable is retriable


def test_301_carries_new_offset() -> None:
    err = error_for_reply(301, b"4096")
    assert isinstance(err, OffsetOutOfRange)
    assert err.new_offset == 4096


@given(
    st.lists(st.tuples(st.binary(max_size=64), st.none() | st.text(max_size=8)), max_size=30),
    st.integers(0, 30),
    st.booleans(),
    st.integers(0, 1 << 40),
)
@settings(max_examples=200, deadline=None)
def test_decode_inverts_build(
    items: list[tuple[bytes, str | None]], split: int, compress: bool, base: int
) -> None:
    """Plain records then (optionally) an lz4 batch of the rest: decode gives them back."""
    head, tail = items[:split], items[split:]
    buf = b"".join(build_record(v, a) for v, a in head)
    if compress and tail:
        buf += compress_batch(b"".join(build_record(v, a) for v, a in tail))
    else:
        buf += b"".join(build_record(v, a) for v, a in tail)
    msgs, nxt = decode_messages(buf, "t", 0, base)
    assert [(m.value, m.attribute) for m in msgs] == items
    assert nxt == base + len(buf)
    assert all(base <= m.offset < m.next_offset <= nxt for m in msgs)


def test_error_trees_have_one_root_each() -> None:
    """Every client error is a MetaClientError; storage corruption is a StorageError."""
    import pymetaq.client.errors as errors
    from pymetaq.storage.errors import StorageError
    from pymetaq.storage.record import CorruptRecordError

    client_errors = [
        v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)
    ]
    assert len(client_errors) > 20
    assert all(issubclass(e, errors.MetaClientError) for e in client_errors)
    assert issubclass(CorruptRecordError, StorageError)
    assert errors.may_be_stored("x", errors.RequestTimeout("t")).invalid_metadata
    assert not errors.UnknownTopicOrPartition("t").invalid_metadata
