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
``commit()``; auto commit every ``commit_interval`` seconds (a task) and on ``close()``. Blocking
offset-store calls run in worker threads (``asyncio.to_thread``).

Thread-safety: an ``AsyncConsumer`` belongs to the loop it is first used on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Any

from pymetaq.client.consumer.batch import Messages
from pymetaq.client.consumer.config import ConsumerConfig, ConsumerError
from pymetaq.client.consumer.engine import build_engine
from pymetaq.client.consumer.transport import ConsumerTransport
from pymetaq.client.errors import ClientClosed
from pymetaq.client.types import TopicPartition
from pymetaq.offsets import OffsetStore

log = logging.getLogger("pymetaq.client.consumer")


class AsyncConsumer:
    """The asyncio face: ``subscribe``, ``await poll()``, ``await commit()``, ``await close()``."""

    def __init__(
        self,
        servers: str | list[str] = "",
        group: str | None = None,
        offset_store: OffsetStore | None = None,
        *,
        config: ConsumerConfig | None = None,
        transport: ConsumerTransport | None = None,
        **overrides: Any,
    ) -> None:
        self._engine, self._owns_store = build_engine(
            servers, group, offset_store, config, transport, overrides
        )
        self.config = self._engine.config
        self.group = self._engine.group
        self._committer: Any = None
        self._closed = False

    def subscribe(self, topic: str) -> AsyncConsumer:
        if self._engine.opened:
            raise ConsumerError("subscribe() must come before the first poll()")
        if topic not in self._engine.topics:
            self._engine.topics.append(topic)
        return self

    async def start(self) -> None:
        """Connect and position (the first ``poll()`` does it if not called)."""
        if self._closed:
            raise ClientClosed("consumer is closed")
        if self._engine.opened:
            return
        await self._engine.open()
        if self.config.enable_auto_commit and self.group is not None:
            self._committer = asyncio.ensure_future(self._commit_loop())

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.commit_interval)
            try:
                await asyncio.to_thread(self._engine.commit_now)
            except Exception:
                log.exception("periodic offset commit failed")

    async def poll(self, timeout_s: float = 1.0, max_records: int = 0) -> Messages:
        await self.start()
        limit = max_records or self.config.max_poll_records
        msgs: Messages = await self._engine.poll(timeout_s, limit)
        self._engine.claim()
        return msgs

    async def commit(self) -> None:
        if self._engine.opened:
            self._engine.mark_returned_consumed()
            await asyncio.to_thread(self._engine.commit_now)

    def assignment(self) -> list[TopicPartition]:
        return list(self._engine.states)

    async def assign(self, partitions: list[TopicPartition]) -> None:
        await self.start()
        await self._engine.assign(partitions)

    def position(self, tp: TopicPartition) -> int:
        return int(self._engine.state(tp).position)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._engine.state(tp).request_seek(offset)

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.seek(tp, await self._engine.bound(tp, end=False))

    async def seek_to_end(self, tp: TopicPartition) -> None:
        self.seek(tp, await self._engine.bound(tp, end=True))

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._engine.counters)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._committer is not None:
            self._committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._committer
        try:
            if self._engine.opened and self.config.enable_auto_commit:
                self._engine.mark_returned_consumed()
                await asyncio.to_thread(self._engine.commit_now)
        finally:
            await self._engine.shutdown()
            if self._owns_store and self._engine.store is not None:
                self._engine.store.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
