"""Record codec: exact bytes, round trips, crcmod == zlib, batch validation and stamping."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymetaq.storage import IdWorker, InvalidRecords
from pymetaq.storage.batch import count_records, stamp_batch, validate_and_stamp
from pymetaq.storage.checksum import checksum, checksum_reference
from pymetaq.storage.record import (
    FLAG_ATTRIBUTE,
    CorruptRecordError,
    decode_data,
    encode_data,
    encode_record,
    iter_records,
)


def test_exact_bytes_of_a_record() -> None:
    data, flag = encode_data(b"hello", "attr")
    assert data == b"\x00\x00\x00\x04attrhello" and flag == FLAG_ATTRIBUTE
    rec = encode_record(data, flag, msg_id=0x0102030405060708)
    crc = checksum(data)
    assert rec == struct.pack(">iiqi", 13, crc, 0x0102030405060708, 1) + data
    assert checksum(b"") == 0 and checksum(b"123456789") == 0xCBF43926 & 0x7FFFFFFF


@settings(deadline=None)
@given(st.binary(max_size=2048))
def test_zlib_checksum_equals_crcmod(data: bytes) -> None:
    assert checksum(data) == checksum_reference(data)


@settings(deadline=None)
@given(st.binary(max_size=300), st.one_of(st.none(), st.text(max_size=40)), st.integers(0, 2**62))
def test_round_trip(payload: bytes, attribute: str | None, msg_id: int) -> None:
    data, flag = encode_data(payload, attribute)
    rec = encode_record(data, flag, msg_id)
    [r] = list(iter_records(rec + rec[:7], 100))
    assert (r.offset, r.msg_id, r.flag, r.size) == (100, msg_id, flag, len(rec))
    assert decode_data(r.data, r.flag) == (attribute, payload)


@settings(deadline=None)
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=50))
def test_stamp_batch_consecutive_ids_and_only_id_bytes_change(payloads: list[bytes]) -> None:
    buf = bytearray(b"".join(encode_record(p) for p in payloads))
    before = bytes(buf)
    worker = IdWorker(7, clock=lambda: 1_700_000_000_000)
    first, count = stamp_batch(worker, buf)
    recs = list(iter_records(buf))
    assert count == len(payloads) == len(recs)
    assert [r.msg_id for r in recs] == list(range(first, first + count))
    assert [r.data for r in recs] == payloads
    for r in recs:  # everything but bytes 8..16 of each header is untouched
        o = r.offset
        assert (
            buf[o : o + 8] == before[o : o + 8]
            and buf[o + 16 : o + r.size] == before[o + 16 : o + r.size]
        )


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b.__setitem__(30, b[30] ^ 1), "checksum"),
        (lambda b: b.__setitem__(slice(0, 4), struct.pack(">i", -1)), "length"),
        (lambda b: b.__setitem__(slice(0, 4), struct.pack(">i", 10_000)), "length"),
        (lambda b: b.extend(b"\x00" * 7), "header"),
        (lambda b: b.clear(), "empty"),
    ],
)
def test_invalid_batches_are_rejected(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    buf = bytearray(encode_record(b"a" * 20) + encode_record(b"b" * 20))
    mutate(buf)
    with pytest.raises(InvalidRecords, match=reason):
        validate_and_stamp(buf, 1)
    with pytest.raises(InvalidRecords):
        count_records(buf)


def test_batch_record_limit() -> None:
    buf = bytearray(encode_record(b"") * 4097)
    with pytest.raises(InvalidRecords, match="at most 4096"):
        validate_and_stamp(buf, 1)


def test_batch_that_does_not_fit_the_millisecond_is_restamped_from_the_next() -> None:
    worker = IdWorker(3, clock=lambda: 1_400_000_000_000)
    worker.reserve(4000)
    buf = bytearray(encode_record(b"x") * 200)
    first, _count = stamp_batch(worker, buf)
    ids = [r.msg_id for r in iter_records(buf)]
    assert ids == list(range(first, first + 200)) and first & 0xFFF == 0
    assert (first >> 12) & 0x3FF == 3


def test_iter_records_raises_on_corruption() -> None:
    buf = bytearray(encode_record(b"abc"))
    buf[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        list(iter_records(buf))


@settings(deadline=None)
@given(
    st.integers(0, 64).flatmap(
        lambda n: st.lists(st.binary(min_size=n, max_size=n), min_size=1, max_size=60)
    ),
    st.integers(0, 4095),
    st.integers(0, 1023),
)
def test_uniform_fast_path_equals_the_generic_loop(
    payloads: list[bytes], seq: int, broker: int
) -> None:
    fast = bytearray(b"".join(encode_record(p) for p in payloads))
    slow = bytearray(fast)
    worker = IdWorker(broker, clock=lambda: 1_500_000_000_000)
    if seq:
        worker.reserve(seq)
    first, count = stamp_batch(worker, fast)
    assert count == len(payloads)
    validate_and_stamp(slow, first)
    assert fast == slow
    assert [r.msg_id for r in iter_records(fast)] == list(range(first, first + count))


def test_uniform_batch_with_bad_checksum_is_rejected() -> None:
    buf = bytearray(encode_record(b"x" * 50) * 10)
    buf[7 * 70 + 30] ^= 0x40
    before = bytes(buf)
    with pytest.raises(InvalidRecords, match="checksum") as ei:
        stamp_batch(IdWorker(1), buf)
    assert ei.value.offset == 7 * 70
    assert bytes(buf) == before  # nothing stamped before validation completed
