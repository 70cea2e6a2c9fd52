"""Client-side values (``Message``, ``SendResult``, ``Partition``), record building and decoding.

The client builds MetaQ records itself (see :mod:`pymetaq.storage.record` for the byte layout:
20-byte header ``>iiqi`` = data length, CRC32(data) & 0x7FFFFFFF, msg id (0 from a client),
flag; then data). A ``bput`` body is a concatenation of such records.

Compressed batches (pymetaq extension, ``docs/protocol.md``): one *outer* record whose flag is
:data:`FLAG_LZ4_BATCH` and whose data is an lz4 *frame* holding the concatenated *inner* records
(each a complete record with its own header and CRC, id 0):

| part          | bytes                                                          |
|---------------|----------------------------------------------------------------|
| outer header  | len(frame), CRC32(frame) & 0x7FFFFFFF, id (broker), 0x100      |
| outer data    | ``lz4.frame.compress(inner_record_1 + inner_record_2 + ...)``  |

All inner messages of a batch share the outer record's offset, ``next_offset`` and id (the
broker stamps one id per stored record).

:func:`decode_messages` walks the bytes of a ``get`` reply: checks CRCs, expands lz4 batches,
stops silently at a trailing partial record and returns the offset after the last complete one.

Thread-safe: immutable values and pure functions.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Sequence

import lz4.frame

from pymetaq.client.errors import CorruptMessage
from pymetaq.client.types import Message
from pymetaq.storage.record import ATTR_LEN, FLAG_ATTRIBUTE, FLAG_LZ4_BATCH, HEADER, HEADER_SIZE

MASK31 = 0x7FFFFFFF
_pack_header: Callable[..., bytes] = HEADER.pack
_unpack_header: Callable[..., tuple[int, int, int, int]] = HEADER.unpack_from
_crc32 = zlib.crc32


#: ``_new(Message, (topic, partition, offset, id, value, attribute, next_offset, broker_id))``
#: builds a Message in C (no Python-level ``__new__``): the decode loops use it.
_new: Callable[..., Message] = tuple.__new__


def make_data(value: bytes, attribute: str | None) -> tuple[bytes, int]:
    """A record's data section and flag for a payload and optional attribute."""
    if attribute is None:
        return value, 0
    attr = attribute.encode("utf-8")
    return ATTR_LEN.pack(len(attr)) + attr + value, FLAG_ATTRIBUTE


def record_header(data: bytes, flag: int = 0) -> bytes:
    """The 20-byte header of a client-built record (id 0)."""
    return _pack_header(len(data), _crc32(data) & MASK31, 0, flag)


def build_record(value: bytes, attribute: str | None = None) -> bytes:
    """One complete record (header + data) for a payload and optional attribute."""
    data, flag = make_data(value, attribute)
    return _pack_header(len(data), _crc32(data) & MASK31, 0, flag) + data


def build_records(values: Iterable[bytes]) -> bytes:
    """Concatenated records (no attributes) for payloads: one join for the whole batch."""
    parts: list[bytes] = []
    append = parts.append
    for v in values:
        append(_pack_header(len(v), _crc32(v) & MASK31, 0, 0))
        append(v)
    return b"".join(parts)


def compress_batch(records: bytes | Sequence[bytes]) -> bytes:
    """One outer :data:`FLAG_LZ4_BATCH` record whose data is an lz4 frame of ``records``."""
    raw = records if isinstance(records, bytes) else b"".join(records)
    frame: bytes = lz4.frame.compress(raw, store_size=True)
    return _pack_header(len(frame), _crc32(frame) & MASK31, 0, FLAG_LZ4_BATCH) + frame


def count_records(buf: bytes) -> int:
    """How many complete records ``buf`` holds (no CRC check)."""
    n = pos = 0
    end = len(buf)
    while pos + HEADER_SIZE <= end:
        (length,) = struct.unpack_from(">i", buf, pos)
        if length < 0 or pos + HEADER_SIZE + length > end:
            break
        pos += HEADER_SIZE + length
        n += 1
    return n


def decode_messages(
    buf: bytes | bytearray | memoryview,
    topic: str,
    partition: int,
    base_offset: int,
    verify: bool = True,
    *,
    broker_id: int = 0,
) -> tuple[list[Message], int]:
    """Decode the records at the start of ``buf`` (a ``get`` reply fetched at ``base_offset``).

    Returns ``(messages, next_offset)``: ``next_offset`` is ``base_offset`` plus the bytes of
    the complete records decoded (a trailing partial record is left for the next fetch).
    Raises :class:`CorruptMessage` for a negative length, a CRC mismatch (with ``verify``) or
    an undecodable lz4 batch.
    """
    src = buf if isinstance(buf, bytes) else bytes(buf)  # bytes slices copy once (no view)
    out: list[Message] = []
    append, new = out.append, _new
    pos, end = 0, len(src)
    while pos + HEADER_SIZE <= end:
        length, crc, msg_id, flag = _unpack_header(src, pos)
        if length < 0:
            raise CorruptMessage(base_offset + pos, f"negative length {length}")
        stop = pos + HEADER_SIZE + length
        if stop > end:
            break
        data = src[pos + HEADER_SIZE : stop]
        offset = base_offset + pos
        if verify and (_crc32(data) & MASK31) != crc:
            raise CorruptMessage(offset, "checksum mismatch")
        nxt = base_offset + stop
        if flag & FLAG_LZ4_BATCH:
            _expand_batch(data, topic, partition, broker_id, offset, nxt, msg_id, verify, out)
        elif flag & FLAG_ATTRIBUTE:
            attr, value = _split_attribute(data, offset)
            append(new(Message, (topic, partition, offset, msg_id, value, attr, nxt, broker_id)))
        else:
            append(new(Message, (topic, partition, offset, msg_id, data, None, nxt, broker_id)))
        pos = stop
    return out, base_offset + pos


def _split_attribute(data: bytes, offset: int) -> tuple[str, bytes]:
    if len(data) < 4:
        raise CorruptMessage(offset, "attribute flag set but data shorter than 4 bytes")
    (alen,) = ATTR_LEN.unpack_from(data, 0)
    if alen < 0 or 4 + alen > len(data):
        raise CorruptMessage(offset, f"attribute length {alen} exceeds data length {len(data)}")
    try:
        attr = data[4 : 4 + alen].decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptMessage(offset, f"attribute is not UTF-8: {e}") from None
    return attr, data[4 + alen :]


def _expand_batch(
    frame: bytes,
    topic: str,
    partition: int,
    broker_id: int,
    offset: int,
    nxt: int,
    msg_id: int,
    verify: bool,
    out: list[Message],
) -> None:
    """Append the inner messages of one lz4 batch record (they share offset/next/id)."""
    try:
        raw: bytes = lz4.frame.decompress(frame)
    except RuntimeError as e:  # lz4 raises RuntimeError for a bad frame
        raise CorruptMessage(offset, f"bad lz4 batch: {e}") from None
    pos, end = 0, len(raw)
    append, new = out.append, _new
    while pos < end:
        if pos + HEADER_SIZE > end:
            raise CorruptMessage(offset, "lz4 batch ends inside an inner header")
        length, crc, _inner_id, flag = _unpack_header(raw, pos)
        stop = pos + HEADER_SIZE + length
        if length < 0 or stop > end:
            raise CorruptMessage(offset, "lz4 batch holds a truncated inner record")
        data = raw[pos + HEADER_SIZE : stop]
        if verify and (_crc32(data) & MASK31) != crc:
            raise CorruptMessage(offset, "inner record checksum mismatch")
        if flag & FLAG_LZ4_BATCH:
            raise CorruptMessage(offset, "nested lz4 batch")
        if flag & FLAG_ATTRIBUTE:
            attr, value = _split_attribute(data, offset)
            append(new(Message, (topic, partition, offset, msg_id, value, attr, nxt, broker_id)))
        else:
            append(new(Message, (topic, partition, offset, msg_id, data, None, nxt, broker_id)))
        pos = stop
