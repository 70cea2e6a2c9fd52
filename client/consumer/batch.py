"""Message batches: what ``poll()`` returns and what a partition buffers.

A fetch reply is checked eagerly by :func:`~pymetaq.client.consumer.scan.scan` (every record's
header and CRC). :class:`~pymetaq.client.transport.Message` objects (named tuples) are built
only when accessed, in C where the accelerators are built. A consumer that needs only payloads
uses ``values()`` and never pays for message objects.

* :class:`RecordBatch` (with the C accelerators) — the plain records of one reply, kept whole:
  the reply's bytes and where each record starts, from storage's ``index_records`` (one C pass
  over the reply, without the GIL). A message's payload and id are read out of the reply when
  the message is built, by the thread that iterates: the I/O thread does no per-record Python
  work, and the caller's objects are made on the caller's core.
* :class:`MessageBatch` (pure Python) — the plain records of one reply: ``bounds`` (record
  starts plus the end of the last one), ``ids`` and ``values`` (parallel sequences).
* Both: ``batch[i]`` / iteration build messages; ``values()`` returns the payloads; slicing
  makes views, no copies.
* :class:`Messages` — a read-only sequence over parts (batches or lists) that ``poll()``
  returns; it compares equal to a list with the same messages.

Memory: a :class:`RecordBatch` (and every slice of it) keeps its reply's bytes plus 8 bytes per
record; a :class:`MessageBatch` holds the payloads (copies) plus up to two ints per record. A
message holds its own copy of its payload either way.

Thread-safety: immutable after construction.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import Any, overload

from pymetaq.client.speedups import speedups
from pymetaq.client.types import Message

_new: Callable[..., Message] = tuple.__new__
#: ``messages(...)``: the C accelerator's iterator of a batch's messages, or None
_messages = speedups.messages if speedups is not None else None
#: ``record_messages(...)`` / ``record_values(...)``: the same over a reply kept whole, or None
_record_messages = speedups.record_messages if speedups is not None else None
_record_values = speedups.record_values if speedups is not None else None
_ID = struct.Struct(">q")  # a record header's id (bytes 8..15)


def make_message(
    topic: str, partition: int, offset: int, msg_id: int, value: bytes, nxt: int, broker: int
) -> Message:
    """A Message without an attribute, built the fast way (no Python ``__new__``)."""
    return _new(Message, (topic, partition, offset, msg_id, value, None, nxt, broker, None))


class MessageBatch(Sequence[Message]):
    """Plain records (flag 0) of one reply, messages built on access.

    Record ``k`` starts at ``bounds[k]`` and ends at ``bounds[k + 1]`` (records are
    contiguous; ``bounds`` has one more entry than ``values``: a ``range`` when every record
    has the same length) and has id ``ids[k]`` and payload ``values[k]``. ``lo``/``hi``
    select a sub-range (slicing makes views, no copies).
    """

    __slots__ = ("_bounds", "_broker", "_hi", "_ids", "_lo", "_part", "_topic", "_values")

    def __init__(
        self,
        bounds: Sequence[int],
        ids: Sequence[int],
        values: list[bytes],
        topic: str,
        partition: int,
        broker_id: int,
        lo: int = 0,
        hi: int | None = None,
    ) -> None:
        self._bounds, self._ids, self._values = bounds, ids, values
        self._topic, self._part, self._broker = topic, partition, broker_id
        self._lo = lo
        self._hi = len(values) if hi is None else hi

    def __len__(self) -> int:
        return self._hi - self._lo

    def _view(self, lo: int, hi: int) -> MessageBatch:
        """Records ``lo..hi`` of the same columns (absolute indices)."""
        b = self._bounds, self._ids, self._values
        return MessageBatch(*b, self._topic, self._part, self._broker, lo, hi)

    def _make(self, k: int) -> Message:
        b = self._bounds
        row = (self._topic, self._part, b[k], self._ids[k], self._values[k], None, b[k + 1])
        return _new(Message, (*row, self._broker, None))

    @overload
    def __getitem__(self, i: int) -> Message: ...

    @overload
    def __getitem__(self, i: slice) -> MessageBatch: ...

    def __getitem__(self, i: int | slice) -> Message | MessageBatch:
        n = self._hi - self._lo
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step != 1:
                raise ValueError("MessageBatch slices must be contiguous")
            return self._view(self._lo + start, self._lo + max(stop, start))
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("MessageBatch index out of range")
        return self._make(self._lo + i)

    def __iter__(self) -> Iterator[Message]:
        # all in C: zip the columns, tuple.__new__ each row into a Message; lazy, so one
        # message is alive at a time (cheap for the GC). zip stops at the shortest column.
        lo, hi = self._lo, self._hi
        if hi <= lo:
            return iter(())
        if _messages is not None:  # the same rows, built in one C call each (client.speedups)
            cols = (self._bounds, self._ids, self._values, lo, hi)
            return _messages(Message, self._topic, self._part, self._broker, *cols)  # type: ignore[no-any-return]
        whole = lo == 0 and hi == len(self._values)
        bounds = self._bounds
        rows = zip(
            repeat(self._topic),
            repeat(self._part),
            bounds if whole else bounds[lo:hi],
            self._ids if whole else self._ids[lo:hi],
            self._values if whole else self._values[lo:hi],
            repeat(None),
            bounds[lo + 1 : hi + 1],
            repeat(self._broker),
            repeat(None),
        )
        return map(_new, repeat(Message), rows)

    def values(self) -> list[bytes]:
        """The payloads (a new list), without building message objects."""
        return self._values[self._lo : self._hi]

    def offset_at(self, i: int) -> int:
        """Byte offset of message ``i`` (no message object)."""
        return self._bounds[self._lo + i]

    def next_offset_at(self, i: int) -> int:
        return self._bounds[self._lo + i + 1]

    def id_at(self, i: int) -> int:
        return self._ids[self._lo + i]

    def __repr__(self) -> str:
        return f"MessageBatch({self._topic}/{self._broker}-{self._part}, {len(self)} messages)"


class RecordBatch(MessageBatch):
    """The plain records of one reply, kept whole (see the module docstring).

    Record ``k`` spans ``buf[positions[k]:positions[k + 1]]`` (``positions``: native int64s,
    one more than the records, from ``pymetaq.storage._speedups.index_records``) and has
    offset ``base + positions[k]``; its id is the header's bytes 8..15 and its payload the
    bytes after the 20-byte header. Built by the scan only where the C accelerators are (its
    iteration and ``values()`` are ``record_messages``/``record_values``).
    """

    __slots__ = ("_base", "_buf", "_positions")

    def __init__(
        self,
        buf: bytes,
        positions: bytes,
        base: int,
        topic: str,
        partition: int,
        broker_id: int,
        lo: int = 0,
        hi: int | None = None,
    ) -> None:
        starts = memoryview(positions).cast("q")
        n = len(starts) - 1 if hi is None else hi
        super().__init__(starts, (), [], topic, partition, broker_id, lo, n)
        self._buf, self._positions, self._base = buf, positions, base

    def _view(self, lo: int, hi: int) -> MessageBatch:
        b = self._buf, self._positions, self._base
        return RecordBatch(*b, self._topic, self._part, self._broker, lo, hi)

    def __reduce__(self) -> tuple[type[RecordBatch], tuple[Any, ...]]:
        """Pickled by its reply and positions (the memoryview over them does not pickle)."""
        b = self._buf, self._positions, self._base
        return RecordBatch, (*b, self._topic, self._part, self._broker, self._lo, self._hi)

    def _make(self, k: int) -> Message:
        p, q = self._bounds[k], self._bounds[k + 1]
        base, buf = self._base, self._buf
        (msg_id,) = _ID.unpack_from(buf, p + 8)
        row = (self._topic, self._part, base + p, msg_id, buf[p + 20 : q], None, base + q)
        return _new(Message, (*row, self._broker, None))

    def __iter__(self) -> Iterator[Message]:
        lo, hi = self._lo, self._hi
        if _record_messages is None:  # only when unpickled where the extension is off
            return map(self._make, range(lo, hi))
        cols = (self._buf, self._positions, self._base, lo, hi)
        return _record_messages(Message, self._topic, self._part, self._broker, *cols)  # type: ignore[no-any-return]

    def values(self) -> list[bytes]:
        if _record_values is None:
            return [m.value for m in self]
        return _record_values(self._buf, self._positions, self._lo, self._hi)  # type: ignore[no-any-return]

    @property
    def end(self) -> int:
        """Where the reply's last indexed record ends in ``buf`` (the whole batch's)."""
        return int(self._bounds[-1])

    def offset_at(self, i: int) -> int:
        return self._base + self._bounds[self._lo + i]

    def next_offset_at(self, i: int) -> int:
        return self._base + self._bounds[self._lo + i + 1]

    def id_at(self, i: int) -> int:
        return int(_ID.unpack_from(self._buf, self._bounds[self._lo + i] + 8)[0])

    def __repr__(self) -> str:
        return f"RecordBatch({self._topic}/{self._broker}-{self._part}, {len(self)} messages)"


def offset_at(seq: Sequence[Message], i: int) -> int:
    return seq.offset_at(i) if isinstance(seq, MessageBatch) else int(seq[i].offset)


def next_offset_at(seq: Sequence[Message], i: int) -> int:
    return seq.next_offset_at(i) if isinstance(seq, MessageBatch) else int(seq[i].next_offset)


def id_at(seq: Sequence[Message], i: int) -> int:
    return seq.id_at(i) if isinstance(seq, MessageBatch) else int(seq[i].id)


class Messages(Sequence[Message]):
    """What ``poll()`` returns: a read-only sequence over per-partition parts.

    Messages are built on access; ``values()`` gives the payloads without building them. Compares
    equal to any sequence holding equal messages (``poll() == []`` works); ``list(x)`` copies.
    """

    __slots__ = ("_len", "_parts")

    def __init__(self, parts: list[Sequence[Message]] | None = None) -> None:
        self._parts = [p for p in parts or [] if len(p)]
        self._len = sum(len(p) for p in self._parts)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> Message: ...

    @overload
    def __getitem__(self, i: slice) -> list[Message]: ...

    def __getitem__(self, i: int | slice) -> Message | list[Message]:
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("Messages index out of range")
        for p in self._parts:
            if i < len(p):
                return p[i]
            i -= len(p)
        raise IndexError("Messages index out of range")  # pragma: no cover

    def __iter__(self) -> Iterator[Message]:
        if len(self._parts) == 1:
            return iter(self._parts[0])  # no chain step per message
        return itertools.chain.from_iterable(self._parts)

    def values(self) -> list[bytes]:
        """All payloads, in order, without building message objects."""
        if len(self._parts) == 1 and isinstance(self._parts[0], MessageBatch):
            return self._parts[0].values()
        out: list[bytes] = []
        for p in self._parts:
            out.extend(p.values() if isinstance(p, MessageBatch) else [m.value for m in p])
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == self._len and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._len > 0

    def __add__(self, other: Any) -> list[Message]:
        return [*self, *other]

    def __radd__(self, other: Any) -> list[Message]:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"Messages({self._len} messages)"
