"""The transaction journal's byte format: file header, record framing, record bodies.

A journal file ``redo.<n>`` starts with an 8-byte magic and is followed by records.  All
integers are big-endian; strings are UTF-8 with a ``u16`` length in front.

File header:

| offset | size | field | value                                                  |
|-------:|-----:|-------|--------------------------------------------------------|
| 0      | 8    | magic | ``PMQTXJ01``                                           |

Record frame (:func:`frame` / :func:`read_frame`):

| offset | size  | field  | meaning                                                        |
|-------:|------:|--------|----------------------------------------------------------------|
| 0      | 4     | length | u32, byte length ``L`` of type + payload, ``1 <= L <= 2**30``  |
| 4      | 4     | crc    | u32, ``zlib.crc32`` of bytes 0..3 (the length) and the body    |
| 8      | 1     | type   | u8, a :class:`RecType`                                         |
| 9      | L - 1 | body   | the type's payload (below)                                     |

A frame is valid when its length is in range, the whole frame is in the file and the CRC
matches; replay stops at the first invalid frame (see :mod:`pymetaq.storage.txjournal.journal`).
A zero-filled tail reads as length 0: invalid, so it is the end.

Payloads (``tid`` is the broker's internal transaction number, a u64 unique per journal):

| type          | payload                                                                     |
|---------------|-----------------------------------------------------------------------------|
| BEGIN 1       | u64 tid, u8 flags (bit 0 = XA), str key                                     |
| PUT 2         | u64 tid, str topic, i32 partition, the record (20-byte header + data) as it |
|               | will be appended (msg id stamped at put time)                               |
| PREPARE 3     | u64 tid                                                                     |
| COMMIT 4      | u64 tid, u8 was_prepared, u16 n, n x part; part = str topic, i32 partition, |
|               | i64 lower_bound (the log's write offset before the append), u32 count,      |
|               | u64 length, u32 crc32 of the bytes to append                                |
| APPLIED 5     | u64 tid, u16 n, n x (str topic, i32 partition, i64 offset of the range)     |
| ROLLBACK 6    | u64 tid                                                                     |
| HEURISTIC 7   | u8 outcome (1 commit, 2 rollback), i64 epoch ms, str key                    |
| FORGET 8      | str key                                                                     |

BEGIN re-sent for a live tid (a checkpoint's relog) resets that transaction: everything
journaled for it is journaled again after it.

Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass

MAGIC = b"PMQTXJ01"
FRAME = struct.Struct(">II")
FRAME_SIZE = FRAME.size  # 8
MAX_BODY = 1 << 30

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_TID_FLAGS = struct.Struct(">QB")
_PART_TAIL = struct.Struct(">iqIQI")  # partition, lower_bound, count, length, crc
_APPLIED_TAIL = struct.Struct(">iq")  # partition, offset
_HEUR = struct.Struct(">Bq")
_I32 = struct.Struct(">i")


class RecType(enum.IntEnum):
    BEGIN = 1
    PUT = 2
    PREPARE = 3
    COMMIT = 4
    APPLIED = 5
    ROLLBACK = 6
    HEURISTIC = 7
    FORGET = 8


class Outcome(enum.IntEnum):
    """A heuristic decision taken by an operator."""

    COMMIT = 1
    ROLLBACK = 2


class FormatError(ValueError):
    """A body that does not decode (a bug or corruption the CRC missed)."""


@dataclass(frozen=True, slots=True)
class PartIntent:
    """One partition of a commit: what will be appended and where the log stood before."""

    topic: str
    partition: int
    lower_bound: int
    count: int
    length: int
    crc: int


@dataclass(frozen=True, slots=True)
class Begin:
    tid: int
    xa: bool
    key: str


@dataclass(frozen=True, slots=True)
class Put:
    tid: int
    topic: str
    partition: int
    record: bytes


@dataclass(frozen=True, slots=True)
class Prepare:
    tid: int


@dataclass(frozen=True, slots=True)
class Commit:
    tid: int
    was_prepared: bool
    parts: tuple[PartIntent, ...]


@dataclass(frozen=True, slots=True)
class Applied:
    tid: int
    offsets: tuple[tuple[str, int, int], ...]  # (topic, partition, offset)


@dataclass(frozen=True, slots=True)
class Rollback:
    tid: int


@dataclass(frozen=True, slots=True)
class Heuristic:
    outcome: Outcome
    time_ms: int
    key: str


@dataclass(frozen=True, slots=True)
class Forget:
    key: str


Record = Begin | Put | Prepare | Commit | Applied | Rollback | Heuristic | Forget


# -- framing ---------------------------------------------------------------------------------


def frame(body: bytes | bytearray) -> bytes:
    """Length + CRC + body."""
    n = len(body)
    if not 1 <= n <= MAX_BODY:
        raise ValueError(f"journal record body of {n} bytes")
    head = n.to_bytes(4, "big")
    return head + (zlib.crc32(body, zlib.crc32(head)) & 0xFFFFFFFF).to_bytes(4, "big") + body


def read_frame(buf: bytes | bytearray | memoryview, pos: int) -> memoryview | None:
    """The body of the valid frame at ``pos``, or None (incomplete, bad length or CRC)."""
    end = len(buf)
    if pos + FRAME_SIZE > end:
        return None
    n, crc = FRAME.unpack_from(buf, pos)
    if not 1 <= n <= MAX_BODY or pos + FRAME_SIZE + n > end:
        return None
    mv = memoryview(buf)
    body = mv[pos + FRAME_SIZE : pos + FRAME_SIZE + n]
    if zlib.crc32(body, zlib.crc32(mv[pos : pos + 4])) & 0xFFFFFFFF != crc:
        return None
    return body


# -- bodies ----------------------------------------------------------------------------------


def _s(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError(f"string of {len(raw)} bytes in a journal record")
    return _U16.pack(len(raw)) + raw


def encode(rec: Record) -> bytes:
    """The framed bytes of one record."""
    return frame(_body(rec))


def encode_puts(tid: int, topic: str, partition: int, records: list[bytes]) -> bytes:
    """The framed PUT records of several records of one transaction and partition: the same
    bytes as ``encode(Put(...))`` for each, with the common part of the body built once."""
    common = bytes((RecType.PUT,)) + _U64.pack(tid) + _s(topic) + _I32.pack(partition)
    crc32, n_common = zlib.crc32, len(common)
    out: list[bytes] = []
    append = out.append
    for r in records:
        n = n_common + len(r)
        if n > MAX_BODY:
            raise ValueError(f"journal record body of {n} bytes")
        head = n.to_bytes(4, "big")
        append(head + (crc32(r, crc32(common, crc32(head))) & 0xFFFFFFFF).to_bytes(4, "big"))
        append(common)
        append(r)
    return b"".join(out)


def _body(rec: Record) -> bytes:
    if isinstance(rec, Put):
        head = bytes((RecType.PUT,)) + _U64.pack(rec.tid) + _s(rec.topic)
        return head + _I32.pack(rec.partition) + rec.record
    if isinstance(rec, Begin):
        return bytes((RecType.BEGIN,)) + _TID_FLAGS.pack(rec.tid, int(rec.xa)) + _s(rec.key)
    if isinstance(rec, Prepare | Rollback):
        kind = RecType.PREPARE if isinstance(rec, Prepare) else RecType.ROLLBACK
        return bytes((kind,)) + _U64.pack(rec.tid)
    if isinstance(rec, Commit):
        out = bytearray((RecType.COMMIT,))
        out += _TID_FLAGS.pack(rec.tid, int(rec.was_prepared)) + _U16.pack(len(rec.parts))
        for p in rec.parts:
            out += _s(p.topic)
            out += _PART_TAIL.pack(p.partition, p.lower_bound, p.count, p.length, p.crc)
        return bytes(out)
    if isinstance(rec, Applied):
        out = bytearray((RecType.APPLIED,)) + _U64.pack(rec.tid) + _U16.pack(len(rec.offsets))
        for topic, partition, offset in rec.offsets:
            out += _s(topic) + _APPLIED_TAIL.pack(partition, offset)
        return bytes(out)
    if isinstance(rec, Heuristic):
        return bytes((RecType.HEURISTIC,)) + _HEUR.pack(rec.outcome, rec.time_ms) + _s(rec.key)
    return bytes((RecType.FORGET,)) + _s(rec.key)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 1  # after the type byte

    def take(self, s: struct.Struct) -> tuple[int, ...]:
        if self.pos + s.size > len(self.buf):
            raise FormatError("record body too short")
        values = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return values

    def text(self) -> str:
        (n,) = self.take(_U16)
        if self.pos + n > len(self.buf):
            raise FormatError("string runs past the record body")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f"string is not UTF-8: {exc}") from None

    def rest(self) -> bytes:
        out = bytes(self.buf[self.pos :])
        self.pos = len(self.buf)
        return out

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise FormatError(f"{len(self.buf) - self.pos} trailing bytes in a record body")


def decode(body: memoryview) -> Record:
    """Decode a frame's body; :class:`FormatError` if it is malformed."""
    try:
        kind = RecType(body[0])
    except ValueError:
        raise FormatError(f"unknown journal record type {body[0]}") from None
    r = _Reader(body)
    rec: Record
    if kind is RecType.PUT:
        (tid,) = r.take(_U64)
        topic = r.text()
        (partition,) = r.take(_I32)
        rec = Put(tid, topic, partition, r.rest())
    elif kind is RecType.BEGIN:
        tid, flags = r.take(_TID_FLAGS)
        rec = Begin(tid, bool(flags & 1), r.text())
    elif kind in (RecType.PREPARE, RecType.ROLLBACK):
        (tid,) = r.take(_U64)
        rec = Prepare(tid) if kind is RecType.PREPARE else Rollback(tid)
    elif kind is RecType.COMMIT:
        rec = _decode_commit(r)
    elif kind is RecType.APPLIED:
        (tid,) = r.take(_U64)
        (n,) = r.take(_U16)
        offsets = []
        for _ in range(n):
            topic = r.text()
            partition, offset = r.take(_APPLIED_TAIL)
            offsets.append((topic, partition, offset))
        rec = Applied(tid, tuple(offsets))
    elif kind is RecType.HEURISTIC:
        outcome, time_ms = r.take(_HEUR)
        try:
            rec = Heuristic(Outcome(outcome), time_ms, r.text())
        except ValueError:
            raise FormatError(f"unknown heuristic outcome {outcome}") from None
    else:
        rec = Forget(r.text())
    r.done()
    return rec


def _decode_commit(r: _Reader) -> Commit:
    tid, prepared = r.take(_TID_FLAGS)
    (n,) = r.take(_U16)
    parts = []
    for _ in range(n):
        topic = r.text()
        partition, lower, count, length, crc = r.take(_PART_TAIL)
        parts.append(PartIntent(topic, partition, lower, count, length, crc))
    return Commit(tid, bool(prepared), tuple(parts))
