"""The asyncio face of the consumer: ``AsyncConsumer`` (poll mode) on the application's loop.

```python
async with AsyncConsumer("meta://localhost:8123", "billing", store) as c:
    c.subscribe("orders")
    for m in await c.poll(1.0):
        ...
    await c.commit()
```

Same engine, semantics and configuration as :class:`pymetaq.client.consumer.Consumer` (poll
mode): messages returned by one ``poll()`` count as consumed at the next ``poll()`` or
``commit()``; auto commit every ``commit_interval_s`` seconds (a task) and on ``close()``. Blocking
offset-store calls run in worker threads (``asyncio.to_thread``).

Thread-safety: an ``AsyncConsumer`` belongs to the loop it is first used on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from types import TracebackType

from pymetaq.client.consumer.batch import Messages
from pymetaq.client.consumer.config import UNGROUPED_GROUP
from pymetaq.client.consumer.face import ConsumerFace
from pymetaq.client.consumer.iterate import AsyncMessageIterator
from pymetaq.client.errors import ClientClosed
from pymetaq.client.types import Message, TopicPartition

log = logging.getLogger("pymetaq.client.consumer")


class AsyncConsumer(ConsumerFace):
    """The asyncio face: ``subscribe``, ``await poll()``, ``await commit()``, ``await close()``
    (constructor: :class:`~pymetaq.client.consumer.face.ConsumerFace`)."""

    def _setup(self) -> None:
        self._committer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect and position (the first ``poll()`` does it if not called)."""
        if self._closed:
            raise ClientClosed("consumer is closed")
        if self._engine.opened:
            return
        await self._engine.open()
        self._engine.reject_policy.bind(self.group or UNGROUPED_GROUP, {})
        if self.config.enable_auto_commit and self.group is not None:
            self._committer = asyncio.ensure_future(self._commit_loop())

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.commit_interval_s)
            try:
                await asyncio.to_thread(self._engine.commit_now)
            except Exception:  # logged with the traceback; the next round tries again
                log.exception("periodic offset commit failed")

    async def poll(self, timeout_s: float = 1.0, max_records: int = 0) -> Messages:
        await self.start()
        partly = self._cursor.pending()  # an iteration stopped part-way: its rest comes again
        self._cursor.clear()
        if partly:
            self._engine.rewind_partly(partly)
        limit = max_records or self.config.max_poll_records
        msgs: Messages = await self._engine.poll(timeout_s, limit)
        try:
            msgs = self._deserialized(msgs)
        except BaseException:  # the caller never gets them: fetched again by the next poll
            self._engine.rewind_unclaimed()
            raise
        self._engine.claim()
        return msgs

    async def commit(self) -> None:
        """Write the consumed positions now (including the last poll's messages; while
        iterating, the messages handed out so far)."""
        if self._engine.opened:
            self._mark_consumed(final=False)
            await asyncio.to_thread(self._engine.commit_now)

    def _mark_consumed(self, final: bool) -> None:
        """The last poll's messages count as consumed — while an iteration is part-way
        through them, only those handed out (``final``: the rest never will)."""
        self._engine.mark_returned_consumed(self._cursor.pending(), final=final)
        if final:
            self._cursor.clear()

    def __aiter__(self) -> AsyncIterator[Message]:
        """``async for message in consumer``: messages as they arrive, awaiting; stops when
        the consumer is closed. A message counts as consumed once handed out (see
        :mod:`pymetaq.client.consumer.iterate`)."""
        return AsyncMessageIterator(self)

    def assignment(self) -> list[TopicPartition]:
        return list(self._engine.states)

    async def assign(self, partitions: list[TopicPartition]) -> None:
        """Own exactly ``partitions`` (no ZooKeeper group): commits released ones."""
        self._check_manual_assign()
        await self.start()
        await self._engine.assign(partitions)

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.seek(tp, await self._engine.bound(tp, end=False))

    async def seek_to_end(self, tp: TopicPartition) -> None:
        self.seek(tp, await self._engine.bound(tp, end=True))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._committer is not None:
            self._committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._committer
        try:
            if self.membership is not None and self._engine.opened:
                # the application is done with its last poll; leaving commits everything
                self._mark_consumed(final=True)
                await asyncio.to_thread(self.membership.leave)
            if self._engine.opened and self.config.enable_auto_commit:
                self._mark_consumed(final=True)
                await asyncio.to_thread(self._engine.commit_now)
        finally:
            await asyncio.to_thread(self._engine.reject_policy.close)
            await self._engine.shutdown()
            self._close_store()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
