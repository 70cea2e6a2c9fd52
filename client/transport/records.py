"""The client's side of the record format: building records and decoding fetched ones.

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

**Keys travel in MetaQ's attribute** (a MetaQ record has no key field). A message sent with a
key (and ``ProducerConfig.key_in_attribute``, the default) carries the attribute

| the producer sent                    | the attribute on the wire                            |
|--------------------------------------|------------------------------------------------------|
| ``key=b"user-42"``                   | ``pymetaq-key:user-42``                              |
| ``key=b"user 42", attribute="x;y"``  | ``pymetaq-key:user%2042;x;y``                        |
| ``key=b"k", attribute=""``           | ``pymetaq-key:k;``                                   |

that is ``KEY_PREFIX`` + the key percent-encoded (RFC 3986: every byte but ``A-Z a-z 0-9 - . _
~`` as ``%XX``) + (``;`` + the attribute, if one was given). A pymetaq consumer splits it back
(``Message.key``, ``Message.attribute``); a MetaQ client sees that text as the attribute. An
attribute a producer sends **without** a key may not start with ``KEY_PREFIX``
(``ValueError``): it would read back as a key.

Thread-safe: immutable values and pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from urllib.parse import quote_from_bytes, unquote_to_bytes

from pymetaq.client.errors import CorruptMessage
from pymetaq.client.types import Message
from pymetaq.storage.record import (
    FLAG_ATTRIBUTE,
    FLAG_LZ4_BATCH,
    CorruptRecordError,
    Record,
    decode_data,
    encode_data,
    encode_record,
    iter_records,
    record_parts,
)

#: ``_new(Message, (topic, partition, offset, id, value, attribute, next_offset, broker_id,
#: key))``
#: builds a Message in C (no Python-level ``__new__``): the decode loops use it.
_new: Callable[..., Message] = tuple.__new__


#: how an attribute that carries a key starts (see the module docstring)
KEY_PREFIX = "pymetaq-key:"


def join_key(key: bytes | None, attribute: str | None) -> str | None:
    """The attribute that carries ``key`` and ``attribute`` (``attribute`` when no key)."""
    if key is None:
        if attribute is not None and attribute.startswith(KEY_PREFIX):
            raise ValueError(f"an attribute may not start with {KEY_PREFIX!r} (it holds keys)")
        return attribute
    head = KEY_PREFIX + quote_from_bytes(key, safe="")
    return head if attribute is None else f"{head};{attribute}"


def split_key(attribute: str | None) -> tuple[bytes | None, str | None]:
    """``(key, attribute)`` from an attribute as stored (the inverse of :func:`join_key`)."""
    if attribute is None or not attribute.startswith(KEY_PREFIX):
        return None, attribute
    encoded, sep, rest = attribute[len(KEY_PREFIX) :].partition(";")
    return unquote_to_bytes(encoded), rest if sep else None


def build_record(value: bytes, attribute: str | None = None) -> bytes:
    """One complete record (header with id 0 + data) for a payload and optional attribute."""
    return encode_record(*encode_data(value, attribute))


def build_records(values: Iterable[bytes]) -> bytes:
    """Concatenated records (no attributes) for payloads: one join for the whole batch."""
    return b"".join(record_parts(values if isinstance(values, list) else list(values))[0])


def compress_batch(records: bytes | Sequence[bytes]) -> bytes:
    """One outer :data:`FLAG_LZ4_BATCH` record whose data is an lz4 frame of ``records``."""
    import lz4.frame  # only producers that compress need lz4

    raw = records if isinstance(records, bytes) else b"".join(records)
    frame: bytes = lz4.frame.compress(raw, store_size=True)
    return encode_record(frame, FLAG_LZ4_BATCH)


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
    out: list[Message] = []
    end = base_offset
    try:
        for rec in iter_records(buf, base_offset, verify=verify):
            end = rec.offset + rec.size
            data, flag, offset = rec.data, rec.flag, rec.offset
            if flag & FLAG_LZ4_BATCH:
                for inner in _inner_records(data, offset, verify):
                    _decode_one(inner, topic, partition, broker_id, offset, end, rec.msg_id, out)
            else:
                _decode_one(rec, topic, partition, broker_id, offset, end, rec.msg_id, out)
    except CorruptRecordError as e:
        raise CorruptMessage(e.offset, e.reason) from None
    return out, end


def _decode_one(
    rec: Record,
    topic: str,
    partition: int,
    broker_id: int,
    offset: int,
    nxt: int,
    msg_id: int,
    out: list[Message],
) -> None:
    """Append the message of one (outer or inner) record; ``offset``/``nxt``/``msg_id`` are the
    stored record's (an lz4 batch's inner messages share them)."""
    if rec.flag & FLAG_LZ4_BATCH:
        raise CorruptMessage(offset, "nested lz4 batch")
    attr: str | None = None
    key: bytes | None = None
    value = rec.data
    if rec.flag & FLAG_ATTRIBUTE:
        try:
            attr, value = decode_data(value, FLAG_ATTRIBUTE)
        except (ValueError, UnicodeDecodeError) as e:  # bad framing / not UTF-8
            raise CorruptMessage(offset, f"bad attribute: {e}") from None
        if attr is not None and attr.startswith(KEY_PREFIX):
            key, attr = split_key(attr)
    row = (topic, partition, offset, msg_id, value, attr, nxt, broker_id, key)
    out.append(_new(Message, row))


def _inner_records(frame: bytes, offset: int, verify: bool) -> list[Record]:
    """The records inside one lz4 batch record (at ``offset``); every byte must belong to one."""
    import lz4.frame  # only consumers that meet an lz4 batch need lz4

    try:
        raw: bytes = lz4.frame.decompress(frame)
    except RuntimeError as e:  # lz4 raises RuntimeError for a bad frame
        raise CorruptMessage(offset, f"bad lz4 batch: {e}") from None
    try:
        inner = list(iter_records(raw, verify=verify))
    except CorruptRecordError as e:
        raise CorruptMessage(offset, f"lz4 batch: inner record {e.reason}") from None
    if sum(r.size for r in inner) != len(raw):
        raise CorruptMessage(offset, "lz4 batch holds a truncated inner record")
    return inner
