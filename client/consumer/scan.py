"""The consumer's record scan: check one ``get`` reply and split it into messages.

:func:`scan` walks the complete records at the start of a reply (fetched at offset ``base``):
lengths, flags and every record's CRC32 are checked; each plain record's offset, id and
payload (``bytes``) go into a :class:`~pymetaq.client.consumer.batch.MessageBatch` (messages
are built lazily, in C). A reply holding a flagged record (attribute, lz4 batch) is decoded
eagerly into a list of messages by :func:`_scan_eager`. The scan stops at a trailing partial
record, at a corrupt one (bad length or CRC: reported, never raised) and at an *undecodable*
one (CRC-valid, but a flag or framing this client cannot read: reported with the whole record
as an :class:`~pymetaq.client.errors.UndecodableRecord`, for the reject policy).

With the C accelerators the whole walk is one call, ``index_records`` (storage/_speedups.c),
which checks each record as the walk below does, without the GIL, and returns where each
valid record starts: the reply is kept whole in a
:class:`~pymetaq.client.consumer.batch.RecordBatch` and messages are built from it on access.

In pure Python, two paths, same result (the property tests compare them on arbitrary inputs):

* **runs** — records of equal length with flag 0 (the common case: fixed-size messages). The
  header fields of a run are read as byte *columns* (``memoryview[c::stride]``, one C copy per
  header byte), the payloads sliced in one comprehension, the CRCs computed with
  ``map(crc32, ...)`` (``storage.checksum``'s) and compared as packed big-endian bytes (the stored CRC is
  ``crc & 0x7FFFFFFF``: the top byte of the computed CRCs is masked with ``bytes.translate``),
  the ids unpacked with one ``struct.unpack``. No Python bytecode per record but the slice.
  With the C accelerator (:mod:`pymetaq.storage.speedups`) the CRCs are one call,
  ``uniform_crc_mismatch`` over the run's bytes, which finds the same first bad record.
* **walk** — anything else: one ``struct.unpack_from`` and one CRC32 call per record,
  ``_WALK_CHUNK`` records at a time, then the next run is probed (cheap when record lengths
  vary: one header read rejects it).

Header columns of a run of ``k`` records of stride ``S = 20 + length`` starting at ``p``:

| bytes (in each record) | field        | check                                        |
|------------------------|--------------|----------------------------------------------|
| 0..3                   | data length  | equal to the first record's (``>i``)          |
| 4..7                   | CRC32 & 0x7FFFFFFF | equal to the computed CRC of bytes 20..S |
| 8..15                  | message id   | read (``>q``)                                |
| 16..19                 | flag         | zero                                         |

Thread-safety: pure functions over immutable bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import gcd
from typing import Literal

from pymetaq.client.consumer.batch import MessageBatch, RecordBatch, make_message
from pymetaq.client.errors import CorruptMessage, UndecodableRecord
from pymetaq.client.speedups import speedups as client_speedups
from pymetaq.client.transport.records import decode_messages
from pymetaq.client.types import Message, TopicPartition
from pymetaq.storage.checksum import MASK31, crc32
from pymetaq.storage.record import HEADER, HEADER_SIZE
from pymetaq.storage.speedups import speedups

#: a run shorter than this is walked record by record (the column set-up costs ~2 us).
_MIN_RUN = 16
#: records walked one by one before the next run is probed.
_WALK_CHUNK = 128

_unpack = HEADER.unpack_from
_INT32 = struct.Struct(">i")  # a header's first field (the data length), read on its own
_unpack_len = _INT32.unpack_from
_pack_len = _INT32.pack
_crc = crc32  # ISA-L's when installed (storage.checksum: 45 ns per 100 bytes, zlib 180)
_TOP7 = bytes(b & 0x7F for b in range(256))  # translate table: mask the CRC's top bit
#: the C accelerator's ``uniform_crc_mismatch(buf, stride, n)``, or None (pure Python)
_mismatch = speedups.uniform_crc_mismatch if speedups is not None else None
#: ``index_records(buf, max_record, verify)``: the whole walk in C, without the GIL (with a
#: :class:`RecordBatch` built from it), where both C accelerators are built; else None
_index = speedups.index_records if speedups is not None and client_speedups is not None else None
#: payload length -> (records per format, unpack_from of ``"20x<length>s" * records``)
_PAYLOADS: dict[int, tuple[int, Callable[[bytes, int], tuple[bytes, ...]]]] = {}
_FMT: dict[int, Literal["B", "H", "I", "Q"]] = {1: "B", 2: "H", 4: "I", 8: "Q"}  # item formats


@dataclass(slots=True)
class Scan:
    """What :func:`scan` found in one reply."""

    messages: Sequence[Message]
    next_offset: int  # offset after the last complete record scanned
    need: int = 0  # >0: bytes the first (incomplete) record needs; nothing was complete
    corrupt_at: int = -1  # >=0: offset of a corrupt record (scanning stopped there)
    reason: str = ""
    #: a CRC-valid record that cannot be decoded (scanning stopped there: ``next_offset`` is
    #: its offset); retrying cannot help, the consumer rejects it and moves on
    undecodable: UndecodableRecord | None = None


class _Cols:
    """The growing columns of one reply's plain records: ``bounds`` (record starts; the end
    is appended last), ``ids``, ``values``. A reply that is one run keeps the run's ``range``
    and id tuple as they are (no copies); anything more turns them into lists."""

    __slots__ = ("bounds", "ids", "values")

    def __init__(self) -> None:
        self.bounds: Sequence[int] = []
        self.ids: Sequence[int] = []
        self.values: list[bytes] = []

    def lists(self) -> tuple[list[int], list[int], list[bytes]]:
        if not isinstance(self.bounds, list):
            self.bounds = list(self.bounds)
        if not isinstance(self.ids, list):
            self.ids = list(self.ids)
        assert isinstance(self.bounds, list) and isinstance(self.ids, list)
        return self.bounds, self.ids, self.values

    def add_run(self, bounds: range, ids: tuple[int, ...], values: list[bytes]) -> None:
        if not self.values:
            self.bounds, self.ids, self.values = bounds, ids, values
            return
        b, i, v = self.lists()
        b.extend(bounds)
        i.extend(ids)
        v.extend(values)

    def batch(self, end: int, tp: TopicPartition) -> MessageBatch:
        """The batch; ``end`` is the offset after the last record."""
        bounds = self.bounds
        if isinstance(bounds, range):
            bounds = range(bounds.start, end + 1, bounds.step)  # the run's end: end itself
        else:
            self.lists()[0].append(end)
            bounds = self.bounds
        return MessageBatch(bounds, self.ids, self.values, tp.topic, tp.partition, tp.broker_id)


def scan(
    buf: bytes, tp: TopicPartition, base: int, *, verify: bool = True, max_record: int = 1 << 30
) -> Scan:
    """Check the complete records at the start of ``buf`` (fetched at offset ``base``)."""
    if not isinstance(buf, bytes):
        buf = bytes(buf)
    if _index is not None:
        return _scan_indexed(buf, tp, base, verify, max_record)
    cols = _Cols()
    pos, end = 0, len(buf)
    corrupt, reason = -1, ""
    with memoryview(buf) as mv:
        while pos + HEADER_SIZE <= end:
            (length,) = _unpack_len(buf, pos)
            if 0 <= length <= max_record:
                k = _run_length(buf, mv, pos, end, length)
                if k:
                    pos, bad = _take_run(buf, mv, pos, k, length, base, verify, cols)
                    if bad:
                        corrupt, reason = base + pos, "checksum mismatch"
                        break
                    continue
            pos, status = _walk(buf, pos, end, base, verify, max_record, cols)
            if status == _FLAGGED:
                return _scan_eager(buf, tp, base, verify, max_record)
            if status is not None:
                if status:  # a corrupt record (empty string: a partial one, just stop)
                    corrupt, reason = base + pos, status
                break
    batch = cols.batch(base + pos, tp)
    if corrupt >= 0:
        return Scan(batch, base + pos, 0, corrupt, reason)
    if not len(batch) and pos + HEADER_SIZE <= end:
        return Scan(batch, base + pos, HEADER_SIZE + _unpack_len(buf, pos)[0])
    return Scan(batch, base + pos)


_FLAGGED = "flagged"
#: ``index_records``' statuses: 0 the end or a partial record, 1 a flagged record, 2 a bad
#: length, 3 a checksum mismatch
_INDEX_FLAGGED, _INDEX_BAD_LENGTH, _INDEX_BAD_CRC = 1, 2, 3


def _scan_indexed(buf: bytes, tp: TopicPartition, base: int, verify: bool, max_record: int) -> Scan:
    """:func:`scan` by one C walk: the same checks, in the same order, as ``_walk``."""
    positions, status = _index(buf, max_record, verify)  # type: ignore[misc]
    if status == _INDEX_FLAGGED:
        return _scan_eager(buf, tp, base, verify, max_record)
    batch = RecordBatch(buf, positions, base, tp.topic, tp.partition, tp.broker_id)
    pos = batch.end
    if status == _INDEX_BAD_LENGTH:
        return Scan(batch, base + pos, 0, base + pos, f"bad length {_unpack_len(buf, pos)[0]}")
    if status == _INDEX_BAD_CRC:
        return Scan(batch, base + pos, 0, base + pos, "checksum mismatch")
    if not len(batch) and pos + HEADER_SIZE <= len(buf):
        return Scan(batch, base + pos, HEADER_SIZE + _unpack_len(buf, pos)[0])
    return Scan(batch, base + pos)


def _walk(
    buf: bytes, pos: int, end: int, base: int, verify: bool, max_record: int, cols: _Cols
) -> tuple[int, str | None]:
    """Check up to ``_WALK_CHUNK`` records one by one; ``(pos, None)`` to go on, else the
    position and why it stopped: ``""`` (partial record), ``_FLAGGED`` or a corruption."""
    bounds, idl, vall = cols.lists()
    offs, ids, vals = bounds.append, idl.append, vall.append
    unpack, crc32 = _unpack, _crc
    for _ in range(_WALK_CHUNK):
        if pos + HEADER_SIZE > end:
            return pos, ""
        length, crc, mid, flag = unpack(buf, pos)
        if flag:
            return pos, _FLAGGED
        if length < 0 or length > max_record:
            return pos, f"bad length {length}"
        stop = pos + HEADER_SIZE + length
        if stop > end:
            return pos, ""
        value = buf[pos + HEADER_SIZE : stop]
        if verify and crc32(value) & MASK31 != crc:
            return pos, "checksum mismatch"
        offs(base + pos)
        ids(mid)
        vals(value)
        pos = stop
    return pos, None


def _column(mv: memoryview, start: int, k: int, stride: int, width: int) -> bytes:
    """The ``width``-byte field at ``start``, ``start + stride``, ... (``k`` records),
    concatenated: one strided C copy per ``gcd(stride, width)``-byte piece of the field."""
    size = gcd(stride, width)
    fmt, step, pieces = _FMT[size], stride // size, width // size
    src = mv[start : start + (k - 1) * stride + width].cast(fmt)
    if pieces == 1:
        return src[::step].tobytes()
    out = bytearray(width * k)
    with memoryview(out) as view:
        dst = view.cast(fmt)
        for j in range(pieces):
            dst[j::pieces] = src[j::step]
        dst.release()
    return bytes(out)


def _payloads(buf: bytes, pos: int, k: int, length: int) -> list[bytes]:
    """The payloads of ``k`` records of data length ``length`` at ``pos``: a ``struct``
    format of ``n`` records (``"20x<length>s" * n``) slices ``n`` payloads per C call (~15 ns
    a payload instead of ~70 ns for a Python-level slice per record)."""
    cached = _PAYLOADS.get(length)
    if cached is None:
        if len(_PAYLOADS) >= 64:
            _PAYLOADS.clear()
        n = max(1, min(1024, (64 << 10) // (HEADER_SIZE + length)))
        cached = _PAYLOADS[length] = (n, struct.Struct(f"20x{length}s" * n).unpack_from)
    n, unpack = cached
    stride = HEADER_SIZE + length
    out: list[bytes] = []
    full = k - k % n
    for off in range(pos, pos + full * stride, n * stride):
        out.extend(unpack(buf, off))
    if full < k:
        out.extend(struct.unpack_from(f"20x{length}s" * (k - full), buf, pos + full * stride))
    return out


def _equal_prefix(a: bytes, b: bytes, width: int) -> int:
    """How many ``width``-byte items at the start of ``a`` equal those of ``b``."""
    if a == b:
        return len(a) // width
    lo, hi = 0, len(a) // width  # a[: lo * width] == b[...] holds, a[: hi * width] differs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[: mid * width] == b[: mid * width]:
            lo = mid
        else:
            hi = mid
    return lo


def _run_length(buf: bytes, mv: memoryview, pos: int, end: int, length: int) -> int:
    """How many complete records from ``pos`` on have data length ``length`` and flag 0
    (0 if fewer than ``_MIN_RUN``): the length column, then the flag column."""
    stride = HEADER_SIZE + length
    k = (end - pos) // stride
    if k < _MIN_RUN or _unpack_len(buf, pos + stride)[0] != length:
        return 0
    k = _equal_prefix(_column(mv, pos, k, stride, 4), _pack_len(length) * k, 4)
    if k < _MIN_RUN:
        return 0
    k = _equal_prefix(_column(mv, pos + 16, k, stride, 4), bytes(4 * k), 4)
    return k if k >= _MIN_RUN else 0


def _take_run(
    buf: bytes,
    mv: memoryview,
    pos: int,
    k: int,
    length: int,
    base: int,
    verify: bool,
    cols: _Cols,
) -> tuple[int, bool]:
    """Append ``k`` same-length plain records at ``pos``; returns the position after them and
    whether a CRC mismatch stopped the run (the position is then the bad record's)."""
    stride = HEADER_SIZE + length
    stop = pos + k * stride
    values = _payloads(buf, pos, k, length)
    bad = False
    if verify:
        if _mismatch is not None:  # the same check in C, without the GIL (storage.speedups)
            first_bad = _mismatch(mv[pos:stop], stride, k)
        else:
            computed = bytearray(struct.pack(f">{k}I", *map(_crc, values)))
            computed[0::4] = computed[0::4].translate(_TOP7)
            stored = _column(mv, pos + 4, k, stride, 4)
            first_bad = -1 if computed == stored else _equal_prefix(bytes(computed), stored, 4)
        if first_bad >= 0:
            k = first_bad
            del values[k:]
            stop = pos + k * stride
            bad = True
    if k:
        ids = struct.unpack(f">{k}q", _column(mv, pos + 8, k, stride, 8))
        cols.add_run(range(base + pos, base + stop, stride), ids, values)
    return stop, bad


def _scan_eager(buf: bytes, tp: TopicPartition, base: int, verify: bool, max_record: int) -> Scan:
    """Decode every record now (replies with attributes or lz4 batches)."""
    topic, part, broker = tp.topic, tp.partition, tp.broker_id
    out: list[Message] = []
    pos, end = 0, len(buf)
    while pos + HEADER_SIZE <= end:
        length, crc, mid, flag = _unpack(buf, pos)
        if length < 0 or length > max_record:
            return Scan(out, base + pos, 0, base + pos, f"bad length {length}")
        stop = pos + HEADER_SIZE + length
        if stop > end:
            break
        data = buf[pos + HEADER_SIZE : stop]
        if verify and _crc(data) & MASK31 != crc:
            return Scan(out, base + pos, 0, base + pos, "checksum mismatch")
        if flag:
            try:
                msgs, _ = decode_messages(
                    buf[pos:stop], topic, part, base + pos, verify, broker_id=broker
                )
            except CorruptMessage as e:  # the CRC was right: the record itself is bad
                bad = UndecodableRecord(
                    base + pos,
                    f"flag {flag:#x}: {e.reason}",
                    record=buf[pos:stop],
                    flag=flag,
                    msg_id=mid,
                    next_offset=base + stop,
                )
                return Scan(out, base + pos, undecodable=bad)
            out.extend(msgs)
        else:
            out.append(make_message(topic, part, base + pos, mid, data, base + stop, broker))
        pos = stop
    if not out and pos + HEADER_SIZE <= end:
        return Scan(out, base + pos, HEADER_SIZE + _unpack(buf, pos)[0])
    return Scan(out, base + pos)
