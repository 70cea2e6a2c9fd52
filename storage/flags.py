"""What a record's flag promises about its data, checked before the record is stored.

A consumer decodes a record by its flag (see :mod:`pymetaq.storage.record`): bit 0 = the data
starts with ``int32 attrLen`` + a UTF-8 attribute; bit 8 (``0x100``, pymetaq's extension) = the
data is one lz4 frame holding complete records.  A record whose flag promises what its data does
not hold cannot be decoded; stored, it would stall every consumer of its partition.  So the
broker refuses it (``result 400``), and :func:`flag_problem` says why:

| flag                   | the data must be                                                    |
|------------------------|---------------------------------------------------------------------|
| 0                      | anything                                                            |
| ``0x1`` (attribute)    | ``int32 attrLen`` (0 <= attrLen <= len - 4) + attrLen bytes of UTF-8 |
| ``0x100`` (lz4 batch)  | one lz4 frame (trailing bytes ignored, as by the consumer) that     |
|                        | expands to at most :data:`MAX_LZ4_CONTENT` bytes (its declared      |
|                        | content size, if any, exact) holding >= 1 complete records, each   |
|                        | with a flag of 0 or ``0x1`` (checked as above)                      |
| any other bit, or both | refused: bits MetaQ reserves, a negative flag, an lz4 batch with an |
| ``0x1`` and ``0x100``  | attribute                                                          |

The inner records' CRCs are *not* checked here: the outer record's CRC (which the broker does
check) covers the compressed bytes end to end, so an inner CRC can only be wrong if the producer
computed it wrong, and verifying them would cost the broker ~0.4 us per inner message (a
``zlib.crc32`` call each: measured 395 us per 1,000 records of 100 bytes, against 21 us to
decompress them) - more than the rest of the produce path.  A consumer verifies them and hands
a record that fails to its reject policy.

Cost: a flag of 0 costs nothing here (callers test ``if flag`` first; the uniform-batch path
tests four extended slices of flag bytes at once).  An attribute costs one ``unpack`` and a
UTF-8 decode of the attribute; an lz4 batch one decompression (``lz4.frame.decompress`` sized
by the declared content size, else a decompressor bounded by :data:`MAX_LZ4_CONTENT`) and a
framing check of its inner records: extended-slice comparisons when they all have one length
(~10 us per 1,000), else one ``unpack_from`` per record (~130 us per 1,000).

Thread-safe: pure functions.
"""

from __future__ import annotations

import struct

import lz4.frame

from pymetaq.storage.record import FLAG_ATTRIBUTE, FLAG_LZ4_BATCH, HEADER_SIZE

#: every flag bit a record may carry
KNOWN_FLAGS = FLAG_ATTRIBUTE | FLAG_LZ4_BATCH
#: an lz4 batch expands to at most this many bytes (the default ``maxBatchSize``): bounds the
#: broker's check and every consumer's decompression of it (lz4 expands up to ~255x)
MAX_LZ4_CONTENT = 16 << 20

_ATTR_LEN = struct.Struct(">i")
_LEN_FLAG = struct.Struct(">I12xi")  # length (unsigned: negative = huge), flag


def flag_problem(flag: int, data: bytes | bytearray | memoryview) -> str | None:
    """Why a record with ``flag`` and ``data`` could not be decoded, or None if it can."""
    unknown = flag & ~KNOWN_FLAGS & 0xFFFFFFFF
    if unknown:
        return f"unknown flag bits 0x{unknown:x} in flag {flag}"
    if flag & FLAG_LZ4_BATCH:
        if flag & FLAG_ATTRIBUTE:
            return f"an lz4 batch has no attribute (flag {flag})"
        return _lz4_problem(data)
    if flag & FLAG_ATTRIBUTE:
        return _attribute_problem(data)
    return None


def _attribute_problem(data: bytes | bytearray | memoryview) -> str | None:
    if len(data) < 4:
        return "attribute flag set but data shorter than 4 bytes"
    (alen,) = _ATTR_LEN.unpack_from(data, 0)
    if alen < 0 or 4 + alen > len(data):
        return f"attribute length {alen} exceeds data length {len(data)}"
    try:
        str(memoryview(data)[4 : 4 + alen], "utf-8")
    except UnicodeDecodeError:
        return "attribute is not UTF-8"
    return None


def _lz4_problem(data: bytes | bytearray | memoryview) -> str | None:
    raw = _decompress(bytes(data))
    if isinstance(raw, str):
        return raw
    if not raw:
        return "lz4 batch holds no record"
    return _inner_problem(raw)


def _decompress(frame: bytes) -> bytes | str:
    """The frame's content, or why there is none."""
    try:
        size = int(lz4.frame.get_frame_info(frame)["content_size"])
        if 0 < size <= MAX_LZ4_CONTENT:
            raw: bytes = lz4.frame.decompress(frame)  # allocates the declared size: bounded
            if len(raw) != size:
                return f"lz4 batch declares {size} bytes but holds {len(raw)}"
            return raw
        if size > MAX_LZ4_CONTENT:
            return f"lz4 batch expands beyond {MAX_LZ4_CONTENT} bytes"
        dec = lz4.frame.LZ4FrameDecompressor()
        raw = dec.decompress(frame, max_length=MAX_LZ4_CONTENT + 1)
    except RuntimeError:  # python-lz4 raises RuntimeError for every malformed frame
        return "lz4 batch is not an lz4 frame"
    if len(raw) > MAX_LZ4_CONTENT:
        return f"lz4 batch expands beyond {MAX_LZ4_CONTENT} bytes"
    if not dec.eof:
        return "lz4 batch is not an lz4 frame"
    return raw


def _inner_problem(raw: bytes) -> str | None:
    """The inner records of an lz4 batch: framing and flags (CRCs: the module docstring)."""
    end = len(raw)
    if _uniform_and_unflagged(raw):
        return None
    mv = memoryview(raw)
    pos = 0
    unpack = _LEN_FLAG.unpack_from
    while pos < end:
        if pos + HEADER_SIZE > end:
            return "lz4 batch holds a truncated record"
        length, flag = unpack(mv, pos)
        start = pos + HEADER_SIZE
        stop = start + length
        if stop > end:
            return "lz4 batch holds a truncated record"
        if flag:
            if flag & FLAG_LZ4_BATCH and not flag & ~KNOWN_FLAGS & 0xFFFFFFFF:
                return "lz4 batch: inner record: nested lz4 batch"
            why = flag_problem(flag, mv[start:stop])
            if why is not None:
                return f"lz4 batch: inner record: {why}"
        pos = stop
    return None


def _uniform_and_unflagged(raw: bytes) -> bool:
    """True if every record has the first one's length and a flag of 0 (C-level slices)."""
    end = len(raw)
    if end < HEADER_SIZE:
        return False
    (length,) = _ATTR_LEN.unpack_from(raw, 0)
    stride = HEADER_SIZE + length
    if length < 0 or end % stride:
        return False
    n = end // stride
    if any(raw[k:end:stride] != raw[k : k + 1] * n for k in range(4)):
        return False
    zero = bytes(n)
    return all(raw[16 + k : end : stride] == zero for k in range(4))
