"""MetaQ's record format, byte for byte, and the helpers that build and walk it.

A partition log is a concatenation of records; the stored bytes are exactly the bytes a
``get`` returns and the bytes a batch put carries.  All integers are big-endian.

| offset | size | field     | meaning                                                    |
|-------:|-----:|-----------|------------------------------------------------------------|
| 0      | 4    | length    | int32, byte length of ``data`` only (header excluded)      |
| 4      | 4    | checksum  | int32, ``CRC32(data) & 0x7FFFFFFF``                         |
| 8      | 8    | msg_id    | int64, broker-assigned id (0 until the broker stamps it)    |
| 16     | 4    | flag      | int32, bit 0 = data starts with an attribute                |
| 20     | len  | data      | [int32 attrLen + UTF-8 attribute, if flag bit 0] + payload |

Thread-safe: pure functions over caller-owned buffers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pymetaq.storage.checksum import MASK31, checksum, crc32
from pymetaq.storage.errors import StorageError
from pymetaq.storage.speedups import speedups

HEADER = struct.Struct(">iiqi")
HEADER_SIZE = HEADER.size  # 20
LEN_CRC = struct.Struct(">ii")
#: the length read unsigned: a negative length becomes huge and fails one bounds check
LEN_CRC_UNSIGNED = struct.Struct(">Ii")
#: length (unsigned, as above), CRC and flag of a header in one unpack (the msg id skipped)
LEN_CRC_FLAG_UNSIGNED = struct.Struct(">Ii8xi")
FLAG = struct.Struct(">i")
MSG_ID = struct.Struct(">q")
ATTR_LEN = struct.Struct(">i")
#: the all-zero header: the end of a preallocated (zero-filled) segment tail, never a record
ZERO_HEADER = bytes(HEADER.size)
_pack = HEADER.pack


def record_parts_py(values: list[bytes]) -> tuple[list[bytes], int]:
    """The records of plain payloads (no attribute, id 0): ``[header, value, ...]`` (join them
    for the batch) and their total size. The reference of the C accelerator's ``record_parts``.
    """
    parts: list[bytes] = [b""] * (2 * len(values))
    parts[0::2] = [_pack(len(v), crc32(v) & MASK31, 0, 0) for v in values]
    parts[1::2] = values
    return parts, sum(map(len, values)) + HEADER_SIZE * len(values)


#: ``record_parts(values)``: the C accelerator's when built (:mod:`pymetaq.storage.speedups`)
record_parts: Callable[[list[bytes]], tuple[list[bytes], int]] = (
    speedups.record_parts if speedups is not None else record_parts_py
)

#: flag bit 0: the data section starts with ``int32 attrLen`` + UTF-8 attribute (MetaQ).
FLAG_ATTRIBUTE = 0x1
#: pymetaq extension, a reserved MetaQ bit: the payload is an lz4 frame of a record batch.
FLAG_LZ4_BATCH = 0x100

assert HEADER_SIZE == 20

__all__ = [
    "ATTR_LEN",
    "FLAG",
    "FLAG_ATTRIBUTE",
    "FLAG_LZ4_BATCH",
    "HEADER",
    "HEADER_SIZE",
    "LEN_CRC",
    "LEN_CRC_FLAG_UNSIGNED",
    "LEN_CRC_UNSIGNED",
    "MASK31",
    "MSG_ID",
    "ZERO_HEADER",
    "CorruptRecordError",
    "Record",
    "checksum",
    "decode_data",
    "encode_data",
    "encode_record",
    "iter_records",
    "record_parts",
    "record_parts_py",
]


def encode_data(payload: bytes, attribute: str | None = None) -> tuple[bytes, int]:
    """Build a record's data section and flag from a payload and optional attribute."""
    if attribute is None:
        return payload, 0
    attr = attribute.encode("utf-8")
    return ATTR_LEN.pack(len(attr)) + attr + payload, FLAG_ATTRIBUTE


def decode_data(data: bytes, flag: int) -> tuple[str | None, bytes]:
    """Split a data section into (attribute, payload)."""
    if not flag & FLAG_ATTRIBUTE:
        return None, data
    if len(data) < 4:
        raise ValueError("attribute flag set but data shorter than the attribute length field")
    (alen,) = ATTR_LEN.unpack_from(data, 0)
    if alen < 0 or 4 + alen > len(data):
        raise ValueError(f"attribute length {alen} exceeds data length {len(data)}")
    return data[4 : 4 + alen].decode("utf-8"), data[4 + alen :]


def encode_record(data: bytes, flag: int = 0, msg_id: int = 0) -> bytes:
    """One whole record: header (with the checksum of ``data``) + data."""
    return HEADER.pack(len(data), checksum(data), msg_id, flag) + data


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded record; ``offset`` is its byte position in the partition log."""

    offset: int
    msg_id: int
    flag: int
    data: bytes

    @property
    def size(self) -> int:
        return HEADER_SIZE + len(self.data)


def iter_records(
    buf: bytes | bytearray | memoryview, base_offset: int = 0, *, verify: bool = True
) -> Iterator[Record]:
    """Yield the complete records at the start of ``buf``.

    Stops silently at a trailing partial record (as MetaQ's client iterator does).  Raises
    :class:`CorruptRecordError` for a negative length or (with ``verify``) a checksum mismatch.
    """
    mv = memoryview(buf)
    pos, end = 0, len(mv)
    while pos + HEADER_SIZE <= end:
        length, crc, msg_id, flag = HEADER.unpack_from(mv, pos)
        if length < 0:
            raise CorruptRecordError(base_offset + pos, f"negative length {length}")
        stop = pos + HEADER_SIZE + length
        if stop > end:
            return
        data = mv[pos + HEADER_SIZE : stop]
        if verify and checksum(data) != crc:
            raise CorruptRecordError(base_offset + pos, "checksum mismatch")
        yield Record(base_offset + pos, msg_id, flag, bytes(data))
        pos = stop


class CorruptRecordError(StorageError, ValueError):
    """A record whose framing or checksum is invalid; ``offset`` is where it starts.

    Storage corruption, so a :class:`StorageError`; still a ``ValueError`` for older callers."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"corrupt record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason
