"""storage.flags: a record whose flag promises data a consumer could not decode is refused,
alone (``flag_problem``) and inside a batch on both validation paths (uniform and mixed)."""

from __future__ import annotations

import random
import struct

import lz4.frame
import pytest

from pymetaq.storage.batch import count_records, stamp_batch
from pymetaq.storage.errors import InvalidRecords
from pymetaq.storage.flags import MAX_LZ4_CONTENT, flag_problem
from pymetaq.storage.ids import IdWorker
from pymetaq.storage.record import encode_record

LZ4 = 0x100
INNER = encode_record(b"one") + encode_record(struct.pack(">i", 1) + b"k" + b"two", 1)


def lz4_of(raw: bytes, **kw: bool) -> bytes:
    return bytes(lz4.frame.compress(raw, **kw))


@pytest.mark.parametrize(
    ("flag", "data", "why"),
    [
        (0, b"", None),
        (0, b"anything at all", None),
        (1, struct.pack(">i", 0), None),
        (1, struct.pack(">i", 3) + b"k=v" + b"payload", None),
        (LZ4, lz4_of(INNER), None),
        (LZ4, lz4_of(INNER, store_size=False), None),
        (LZ4, lz4_of(encode_record(b"x" * 100) * 50), None),  # uniform inner records
        (2, b"x", "unknown flag bits 0x2 in flag 2"),
        (0x80000000 - (1 << 32), b"x", "unknown flag bits 0x80000000 in flag -2147483648"),
        (1, b"", "attribute flag set but data shorter than 4 bytes"),
        (1, struct.pack(">i", 5) + b"abc", "attribute length 5 exceeds data length 7"),
        (1, struct.pack(">i", 1) + b"\x80", "attribute is not UTF-8"),
        (LZ4 | 1, lz4_of(INNER), "an lz4 batch has no attribute (flag 257)"),
        (LZ4, b"", "lz4 batch is not an lz4 frame"),
        (LZ4, INNER, "lz4 batch is not an lz4 frame"),
        (LZ4, lz4_of(b""), "lz4 batch holds no record"),
        (LZ4, lz4_of(INNER + b"\0" * 19), "lz4 batch holds a truncated record"),
        (LZ4, lz4_of(encode_record(b"x" * 10, 4)), "lz4 batch: inner record: unknown flag bits"),
        (LZ4, lz4_of(encode_record(lz4_of(INNER), LZ4)), "lz4 batch: inner record: nested lz4"),
        (
            LZ4,
            lz4_of(encode_record(b"x" * 100) * 9 + encode_record(b"y" * 100, 3)),
            "lz4 batch: inner record: unknown flag bits 0x2 in flag 3",
        ),
    ],
)
def test_flag_problem(flag: int, data: bytes, why: str | None) -> None:
    got = flag_problem(flag, data)
    if why is None:
        assert got is None
    else:
        assert got is not None and got.startswith(why), got


def test_an_lz4_bomb_is_refused_without_expanding_it() -> None:
    raw = b"\0" * (MAX_LZ4_CONTENT + 1)
    undeclared = lz4_of(raw, store_size=False)
    assert len(undeclared) < 100_000  # zeros compress ~250x
    assert flag_problem(LZ4, undeclared) == f"lz4 batch expands beyond {MAX_LZ4_CONTENT} bytes"
    declared = lz4_of(raw, store_size=True)
    assert flag_problem(LZ4, declared) == f"lz4 batch expands beyond {MAX_LZ4_CONTENT} bytes"


def test_a_declared_content_size_that_lies_is_refused() -> None:
    frame = bytearray(lz4_of(INNER, store_size=True))
    info = lz4.frame.get_frame_info(bytes(frame))
    assert info["content_size"] == len(INNER)
    # the content size is the 8 bytes after the FLG and BD bytes (then a header checksum):
    # rewriting it breaks the header checksum, which lz4 checks - either way: refused
    frame[6:14] = struct.pack("<Q", len(INNER) + 1)
    assert flag_problem(LZ4, bytes(frame)) is not None


BAD_RECORDS = [
    encode_record(b"data", 2),
    encode_record(b"abc", 1),
    encode_record(b"not lz4 at all", LZ4),
    encode_record(b"data", -1),
]


@pytest.mark.parametrize("bad", BAD_RECORDS, ids=["bits", "attr", "lz4", "negative"])
def test_a_batch_with_one_bad_record_is_refused_on_both_paths(bad: bytes, seed: int) -> None:
    rng = random.Random(seed)
    size = len(bad) - 20
    n = rng.randrange(2, 50)
    at = rng.randrange(n)
    uniform = [encode_record(b"u" * size) for _ in range(n)]
    uniform[at] = bad
    mixed = [encode_record(b"m" * rng.randrange(0, 200)) for _ in range(n)]
    mixed[at] = bad
    for records in (uniform, mixed):
        buf = bytearray(b"".join(records))
        offset = sum(len(r) for r in records[:at])
        with pytest.raises(InvalidRecords) as info:
            stamp_batch(IdWorker(1), buf)
        assert info.value.offset == offset
        assert info.value.reason == flag_problem(*_flag_and_data(bad))
        with pytest.raises(InvalidRecords):
            count_records(bytes(buf))


def _flag_and_data(record: bytes) -> tuple[int, bytes]:
    (flag,) = struct.unpack_from(">i", record, 16)
    return flag, record[20:]


def test_batches_of_decodable_flagged_records_are_stamped() -> None:
    attr = encode_record(struct.pack(">i", 1) + b"k" + b"v", 1)
    batch = encode_record(lz4_of(INNER), LZ4)
    for records in ([attr] * 10, [batch] * 3, [attr, batch, encode_record(b"plain")]):
        buf = bytearray(b"".join(records))
        first, count = stamp_batch(IdWorker(1), buf)
        assert count == len(records) and first > 0
