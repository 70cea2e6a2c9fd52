"""The asyncio face of the producer: ``AsyncProducer`` on the application's event loop.

Same engine and semantics as :class:`~pymetaq.client.producer.sync.Producer` (see
``docs/client.md``); every method runs on the loop the producer was started on, so a
``send_nowait`` is written by the loop that later reads its ack.

Thread-safety: an ``AsyncProducer`` belongs to the loop it was started on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pymetaq.client.errors import ClientClosed, UnknownTopicOrPartition
from pymetaq.client.producer.batch import BatchHandle, SendHandle
from pymetaq.client.producer.config import ProducerConfig, make_config
from pymetaq.client.producer.engine import PartitionArg, ProducerEngine, all_small_bytes
from pymetaq.client.producer.sync import _shutdown
from pymetaq.client.types import Partition, SendResult


class AsyncProducer:
    """The asyncio producer: ``async with AsyncProducer(servers) as p: await p.send(...)``."""

    def __init__(
        self, servers: str | list[str], *, config: ProducerConfig | None = None, **overrides: Any
    ) -> None:
        self.config = make_config(config, overrides)
        self._servers = servers
        self._engine: ProducerEngine | None = None

    async def start(self) -> AsyncProducer:
        """Connect to the brokers (raises NoBrokerAvailable if none answers)."""
        loop = asyncio.get_running_loop()
        engine = ProducerEngine(self._servers, self.config, loop, loop.create_future, False)
        await engine.brokers.start()
        self._engine = engine
        return self

    def _require(self) -> ProducerEngine:
        if self._engine is None:
            raise ClientClosed("AsyncProducer not started: use 'async with' or await start()")
        return self._engine

    async def publish(self, topic: str) -> list[Partition]:
        """Fetch (and cache) a topic's partitions; ``send_nowait`` needs this done first."""
        parts: list[Partition] = await self._require().brokers.partitions(topic)
        return parts

    def send_nowait(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        partition: PartitionArg = None,
        attribute: str | None = None,
    ) -> SendHandle:
        """Queue one message without waiting; ``await`` the returned handle for its result.

        The topic must be known (``await publish(topic)`` or an earlier ``await send``).
        """
        return self._queue(topic, value, key, partition, attribute, False)

    def _queue(
        self,
        topic: str,
        value: bytes,
        key: Any,
        partition: PartitionArg,
        attribute: str | None,
        force: bool,
    ) -> SendHandle:
        engine = self._require()
        value = engine.check(value)
        parts = engine.brokers.cached_partitions(topic)
        if parts is None:
            raise UnknownTopicOrPartition(
                f"topic {topic!r} not published yet: await producer.publish({topic!r}) first"
            )
        p = engine.select(topic, parts, value, key, partition, attribute)
        return engine.acc.append(topic, p, value, attribute, force=force, block_s=0.0)

    def send_many(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        key: bytes | str | None = None,
        partition: PartitionArg = None,
        attribute: str | None = None,
    ) -> BatchHandle:
        """As :meth:`Producer.send_many` (the topic must be published); ``await`` the handle."""
        engine = self._require()
        values = (
            [engine.check(v) for v in values]
            if not all_small_bytes(values, self.config.max_message_bytes)
            else values
        )
        parts = engine.brokers.cached_partitions(topic)
        if parts is None:
            raise UnknownTopicOrPartition(
                f"topic {topic!r} not published yet: await producer.publish({topic!r}) first"
            )
        p = engine.select(topic, parts, values[0] if values else b"", key, partition, attribute)
        return engine.acc.append_many(topic, p, values, attribute, block_s=0.0)

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        partition: PartitionArg = None,
        attribute: str | None = None,
    ) -> SendResult:
        """Send one message and wait for its ack."""
        engine = self._require()
        if engine.brokers.cached_partitions(topic) is None:
            await engine.brokers.partitions(topic)
        return await self._queue(topic, value, key, partition, attribute, True)

    async def flush(self) -> None:
        """Send everything queued now and wait for it."""
        engine = self._require()
        acc = engine.acc
        with acc.cond:
            acc.flushing += 1
            batches = list(acc.incomplete.values())
        try:
            engine.sender.wake()
            for b in batches:
                fut = b.fut
                assert isinstance(fut, asyncio.Future)
                await fut
        finally:
            with acc.cond:
                acc.flushing -= 1

    async def close(self) -> None:
        engine = self._engine
        if engine is None or engine.closed:
            return
        try:
            await asyncio.wait_for(self.flush(), self.config.delivery_timeout_s)
        except TimeoutError:
            pass
        engine.closed = True
        await _shutdown(engine)

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
