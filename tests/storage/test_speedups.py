"""The record format's C accelerator (storage/_speedups.c) against its pure-Python references.

Whichever runs, producers build the same bytes and the broker accepts and refuses the same
batches: each C function is compared with the Python it replaces on the same inputs
(hypothesis, seeded), hostile arguments get a clear error, and the record tests run once more
with ``PYMETAQ_NO_EXTENSIONS=1``.
"""

from __future__ import annotations

import platform
import random
import zlib
from typing import Any

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from pymetaq.storage import batch
from pymetaq.storage import speedups as speedups_mod
from pymetaq.storage.checksum import checksum_reference
from pymetaq.storage.errors import InvalidRecords
from pymetaq.storage.ids import IdWorker
from pymetaq.storage.record import encode_record, record_parts, record_parts_py
from tests._helpers import pytest_in_pure_python

C = speedups_mod.speedups


def test_the_extension_is_built_and_chosen() -> None:
    assert C is not None, (
        "pymetaq.storage._speedups is not built: install gcc and python3-dev, then "
        "pip install -e . again"
    )
    assert speedups_mod.SPEEDUPS_IMPL == "c"
    assert record_parts is C.record_parts


@seed(20261125)
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs_and_crcmods(data: bytes, start: int) -> None:
    assert C is not None
    assert C.crc32(data) == zlib.crc32(data)
    assert C.crc32(data) & 0x7FFFFFFF == checksum_reference(data)
    assert C.crc32(data, start) == zlib.crc32(data, start)
    assert C.crc32(memoryview(data)) == zlib.crc32(data)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return {w for line in f if line.startswith("flags") for w in line.split()[2:]}
    except OSError:
        return set()


def test_crc32_folds_with_pclmul_where_the_cpu_has_it() -> None:
    assert C is not None
    flags = _cpu_flags()
    if platform.machine() in ("x86_64", "AMD64") and {"pclmulqdq", "sse4_1"} <= flags:
        assert C.CRC32_IMPL == "pclmul"
    else:
        assert C.CRC32_IMPL == "slicing-by-8"


def test_crc32_is_zlibs_at_every_length_and_alignment() -> None:
    """Every length to 1100 (the folding path starts at 64 bytes: 4 lanes, 16-byte steps, a
    tail of up to 15 bytes by table) from unaligned starts, with random initial values."""
    assert C is not None
    rnd = random.Random(20261125)
    print("seed 20261125")
    data = rnd.randbytes(1200)
    with memoryview(data) as mv:
        for n in range(1101):
            at = rnd.randrange(16)
            start = rnd.getrandbits(32)
            chunk = mv[at : at + n]
            assert C.crc32(chunk, start) == zlib.crc32(chunk, start), (n, at)
    for n in (4096, 65536 + 7, 1 << 20):
        big = rnd.randbytes(n)
        assert C.crc32(big) == zlib.crc32(big)
        # a CRC continued over two pieces is the CRC of the whole
        assert C.crc32(big[n // 3 :], C.crc32(big[: n // 3])) == zlib.crc32(big)


@seed(20261125)
@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=40))
def test_record_parts_builds_the_reference_records(values: list[bytes]) -> None:
    assert C is not None
    parts, total = C.record_parts(values)
    assert (parts, total) == record_parts_py(values)
    assert b"".join(parts) == b"".join(encode_record(v) for v in values)


def test_record_parts_refuses_what_is_not_a_list_of_bytes() -> None:
    assert C is not None
    with pytest.raises(TypeError, match="item 1 is not bytes"):
        C.record_parts([b"a", "b"])
    with pytest.raises(TypeError, match="a list of bytes"):
        C.record_parts((b"a",))

    class Sub(bytes):
        pass

    assert C.record_parts([Sub(b"ab")]) == record_parts_py([Sub(b"ab")])


#: byte flips (position modulo the batch's size, xor mask) for :func:`_damaged`
_FLIPS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3)


def _damaged(length: int, n: int, flips: list[tuple[int, int]]) -> bytearray:
    """``n`` records of ``length`` random bytes, flipped anywhere: length, CRC, id, flag or
    data bytes."""
    rng = random.Random(length * 1000 + n)
    buf = bytearray(b"".join(encode_record(rng.randbytes(length)) for _ in range(n)))
    for where, mask in flips:
        buf[where % len(buf)] ^= mask
    return buf


def _python_mismatch(buf: bytes | bytearray, stride: int, n: int) -> int:
    for k in range(n):
        rec = buf[k * stride : (k + 1) * stride]
        if zlib.crc32(rec[20:]) & 0x7FFFFFFF != int.from_bytes(rec[4:8], "big"):
            return k
    return -1


@seed(20261125)
@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 120),
    st.integers(1, 40),
    _FLIPS,
)
def test_uniform_crc_mismatch_finds_the_first_bad_record(
    length: int, n: int, flips: list[tuple[int, int]]
) -> None:
    assert C is not None
    buf = _damaged(length, n, flips)
    stride = 20 + length
    assert C.uniform_crc_mismatch(buf, stride, n) == _python_mismatch(buf, stride, n)
    assert C.uniform_crc_mismatch(bytes(buf), stride, n) == _python_mismatch(buf, stride, n)


def test_uniform_crc_mismatch_refuses_records_that_do_not_fit() -> None:
    assert C is not None
    buf = encode_record(b"x" * 10) * 3  # 3 records of stride 30
    assert C.uniform_crc_mismatch(buf, 30, 3) == -1
    assert C.uniform_crc_mismatch(buf, 30, 0) == -1
    for stride, n in ((30, 4), (31, 3), (19, 1), (30, -1), (2**62, 2), (0, 1)):
        with pytest.raises(ValueError, match="do not fit"):
            C.uniform_crc_mismatch(buf, stride, n)
    with pytest.raises(TypeError):
        C.uniform_crc_mismatch("text", 30, 1)
    with pytest.raises(TypeError):
        C.uniform_crc_mismatch(buf, 30)


class _Clock:
    """A fixed clock for two IdWorkers that must issue the same ids."""

    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.ms


def _outcome(fn: Any, buf: bytearray, max_data: int | None) -> tuple[Any, bytes]:
    """What one uniform-branch implementation does with ``buf``: its result or its error
    (type, reason, position), and the bytes it leaves."""
    worker = IdWorker(7, _Clock())
    try:
        result: Any = fn(worker, buf, max_data)
    except InvalidRecords as exc:
        result = (type(exc), exc.reason, exc.offset)
    return result, bytes(buf)


@seed(20261129)
@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, 120),
    st.integers(1, 40),
    _FLIPS,
    st.sampled_from([None, 0, 50, 119, 120, 10**6]),
    st.booleans(),
)
def test_uniform_scan_and_stamp_do_what_the_python_branch_does(
    length: int, n: int, flips: list[tuple[int, int]], max_data: int | None, truncate: bool
) -> None:
    """Framing, length limit, count, CRC and flag refusals in the same order, with the same
    reason and position, and the same ids stamped, on batches damaged anywhere."""
    assert C is not None
    buf = _damaged(length, n, flips)
    if truncate:
        del buf[-1:]
    c_result = _outcome(batch._stamp_uniform_c, bytearray(buf), max_data)
    py_result = _outcome(batch._stamp_uniform_py, bytearray(buf), max_data)
    assert c_result == py_result


def test_uniform_scan_reports_each_refusal() -> None:
    assert C is not None
    good = bytearray(encode_record(b"x" * 10) * 3)  # 3 records of stride 30
    assert C.uniform_scan(good, -1, 4096) == (0, 30, 3, -1)
    assert C.uniform_scan(bytes(good), 10, 3) == (0, 30, 3, -1)
    assert C.uniform_scan(good, 9, 4096) == (2, 30, 3, -1)
    assert C.uniform_scan(good, -1, 2) == (3, 30, 3, -1)
    bad = bytearray(good)
    bad[2 * 30 + 25] ^= 1  # the third record's data
    assert C.uniform_scan(bad, -1, 4096) == (4, 30, 3, 2)
    flagged = bytearray(encode_record(b"x" * 10, flag=1) * 2)
    assert C.uniform_scan(flagged, -1, 4096)[0] == 5
    for not_uniform in (b"", good[:19], good[:-1], good + encode_record(b"y" * 11)):
        assert C.uniform_scan(not_uniform, -1, 4096) == (1, 0, 0, -1)
    negative = bytearray(good)
    negative[0] = 0x80  # a length of 2^31 or more is never uniform
    assert C.uniform_scan(negative, -1, 4096)[0] == 1
    with pytest.raises(TypeError):
        C.uniform_scan("text", -1, 1)
    with pytest.raises(TypeError):
        C.uniform_scan(good, -1)


def test_stamp_uniform_writes_consecutive_big_endian_ids() -> None:
    assert C is not None
    buf = bytearray(encode_record(b"x" * 10) * 3)
    C.stamp_uniform(buf, 30, 3, 2**40 + 0xFFFF)
    ids = [int.from_bytes(buf[k * 30 + 8 : k * 30 + 16], "big") for k in range(3)]
    assert ids == [2**40 + 0xFFFF, 2**40 + 0x10000, 2**40 + 0x10001]
    assert batch.count_records(buf) == (3, 2**40 + 0x10001)  # nothing else changed
    for stride, n in ((30, 4), (31, 3), (19, 1), (30, -1), (2**62, 2)):
        with pytest.raises(ValueError, match="do not fit"):
            C.stamp_uniform(buf, stride, n, 1)
    with pytest.raises(BufferError):
        C.stamp_uniform(bytes(buf), 30, 3, 1)  # read-only
    with pytest.raises(TypeError):
        C.stamp_uniform(buf, 30, 3)


def test_the_last_of_zero_length_records_has_its_crc_checked_in_python_too() -> None:
    """The Python branch used to walk the records' data starts, which stop short of the last
    zero-length record: its CRC went unchecked (found by the comparison above)."""
    buf = bytearray(encode_record(b"") * 3)
    buf[2 * 20 + 4] ^= 1  # the last record's CRC
    for fn in (batch._stamp_uniform_py, batch._stamp_uniform_c):
        with pytest.raises(InvalidRecords, match="checksum mismatch") as info:
            fn(IdWorker(7, _Clock()), bytearray(buf), None)
        assert info.value.offset == 40


def test_stamp_batch_uses_the_c_branch() -> None:
    buf = bytearray(encode_record(b"x" * 10) * 3)
    worker = IdWorker(7, _Clock())
    first, count = batch.stamp_batch(worker, buf)
    assert count == 3
    assert batch.count_records(buf) == (3, first + 2)


def test_record_and_flag_tests_pass_in_pure_python_too() -> None:
    """The batch validation tests (uniform and mixed, flags, refusals) without the extension."""
    pytest_in_pure_python("tests/storage/test_record.py", "tests/storage/test_flags.py")
