"""Message batches: what ``poll()`` returns and what a partition buffers.

A fetch reply is checked eagerly by :func:`~pymetaq.client.consumer.scan.scan` (every record's
header and CRC) which keeps, per plain record, its offset, id and payload (``bytes``) in three
parallel lists. :class:`~pymetaq.client.transport.Message` objects (named tuples) are built only
when accessed, in C: iteration is ``map(tuple.__new__, repeat(Message), zip(...))`` with no
Python bytecode per message. A consumer that needs only payloads uses ``values()`` and never
pays for message objects.

* :class:`MessageBatch` — the plain records of one reply: ``bounds`` (record starts plus
  the end of the last one), ``ids`` and ``values`` (parallel sequences). ``batch[i]`` / iteration build
  messages; ``values()`` returns the payloads; slicing makes views, no copies.
* :class:`Messages` — a read-only sequence over parts (batches or lists) that ``poll()``
  returns; it compares equal to a list with the same messages.

Memory: a batch holds the payloads (copies; the reply's bytes are not kept) plus up to two
ints per record.

Thread-safety: immutable after construction.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import Any, overload

from pymetaq.client.speedups import speedups
from pymetaq.client.types import Message

_new: Callable[..., Message] = tuple.__new__
#: ``messages(...)``: the C accelerator's iterator of a batch's messages, or None
_messages = speedups.messages if speedups is not None else None


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
            stop = max(stop, start)
            return MessageBatch(
                self._bounds,
                self._ids,
                self._values,
                self._topic,
                self._part,
                self._broker,
                self._lo + start,
                self._lo + stop,
            )
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
