"""Iterating a consumer: ``for message in consumer`` and ``async for message in consumer``.

Both block (poll, then hand out the batch one message at a time) and stop when the consumer is
closed (also by another thread or task). Delivery is exact, like aiokafka's: **a message
counts as consumed once the iterator has handed it out** — so when the loop stops part-way
through a batch (``break``, an exception, ``close()``), the messages not handed out yet are
neither committed nor lost; the next run gets them again. The consumer asks the iteration's
cursor (:meth:`BatchCursor.pending`) what was handed out when it commits or closes.

Cost per message: one ``__next__`` call and a counter (the batch is walked by its C iterator).

Thread-safety: one iteration per consumer at a time; ``close()``/``commit()`` may come from
any thread (the cursor's fields are single assignments).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pymetaq.client.consumer.batch import Messages
from pymetaq.client.consumer.ledger import Partly
from pymetaq.client.types import Message, TopicPartition

if TYPE_CHECKING:
    from pymetaq.client.consumer.aio import AsyncConsumer
    from pymetaq.client.consumer.sync import Consumer

#: how long one poll of an iteration waits before checking whether the consumer was closed
POLL_S = 1.0


def partly(batch: Messages, done: int) -> Partly:
    """For each partition with a message at index ``done`` or later in ``batch``: the offset of
    the first such message and the id of the last one before ``done`` there (None: none)."""
    first: dict[TopicPartition, int] = {}
    last: dict[TopicPartition, int] = {}
    for i, m in enumerate(batch):
        tp = TopicPartition(m.topic, m.broker_id, m.partition)
        if i < done:
            last[tp] = m.id
        elif tp not in first:
            first[tp] = m.offset
    return {tp: (offset, last.get(tp)) for tp, offset in first.items()}


class BatchCursor:
    """The batch an iteration is handing out and how many messages it handed out."""

    __slots__ = ("batch", "done", "it")

    def __init__(self) -> None:
        self.batch: Messages | None = None
        self.done = 0
        self.it: Iterator[Message] | None = None

    def load(self, batch: Messages) -> None:
        self.batch, self.done, self.it = batch, 0, iter(batch)

    def take(self) -> Message | None:
        """The next message of the batch, or None when it is used up."""
        it = self.it
        if it is None:
            return None
        m = next(it, None)
        if m is not None:
            self.done += 1
        return m

    def pending(self) -> Partly | None:
        """What the consumer must not count as consumed yet (see :func:`partly`); None if
        the batch was handed out whole (or there is none)."""
        batch, done = self.batch, self.done
        if batch is None or done >= len(batch):
            return None
        return partly(batch, done)

    def clear(self) -> None:
        self.batch, self.it, self.done = None, None, 0


class MessageIterator:
    """``iter(consumer)``: messages, blocking; stops when the consumer is closed."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def __iter__(self) -> MessageIterator:
        return self

    def __next__(self) -> Message:
        c = self._consumer
        m = c._cursor.take()
        if m is not None:
            return m
        while True:
            if c.closed:
                raise StopIteration
            try:
                batch = c.poll(POLL_S)
            except Exception:  # ClientClosed, a cancelled poll, a closed loop: if closed, stop
                if c.closed:
                    raise StopIteration from None
                raise
            if batch:
                c._cursor.load(batch)
                m = c._cursor.take()
                assert m is not None
                return m


class AsyncMessageIterator:
    """``aiter(consumer)``: messages, awaiting; stops when the consumer is closed."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: AsyncConsumer) -> None:
        self._consumer = consumer

    def __aiter__(self) -> AsyncMessageIterator:
        return self

    async def __anext__(self) -> Message:
        c = self._consumer
        m = c._cursor.take()
        if m is not None:
            return m
        while True:
            if c.closed:
                raise StopAsyncIteration
            try:
                batch = await c.poll(POLL_S)
            except Exception:
                if c.closed:
                    raise StopAsyncIteration from None
                raise
            if batch:
                c._cursor.load(batch)
                m = c._cursor.take()
                assert m is not None
                return m
