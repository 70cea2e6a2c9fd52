"""The asyncio face of the producer: ``AsyncProducer`` on the application's event loop.

Same engine and semantics as :class:`~pymetaq.client.producer.sync.Producer` (see
``docs/client.md``); every method runs on the loop the producer was started on, so a
``send_nowait`` is written by the loop that later reads its ack.

Thread-safety: an ``AsyncProducer`` belongs to the loop it was started on.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Unpack, cast

from pymetaq.client.errors import ClientClosed, UnknownTopicOrPartition
from pymetaq.client.producer.config import ProducerConfig, make_config
from pymetaq.client.producer.engine import ProducerEngine, ProducerFace, SendOptions
from pymetaq.client.types import SendResult, TopicPartition

if TYPE_CHECKING:
    from pymetaq.client.transaction.local import AsyncLocalScope
    from pymetaq.client.transaction.xa import AsyncXAResource


def _not_published(topic: str) -> list[TopicPartition]:
    raise UnknownTopicOrPartition(
        f"topic {topic!r} not published yet: await producer.publish({topic!r}) first"
    )


class _NotStarted:
    """Stands for the engine until ``start()``: any use raises :class:`ClientClosed`."""

    closed = False

    def __getattr__(self, name: str) -> Any:
        raise ClientClosed("AsyncProducer not started: use 'async with' or await start()")


class AsyncProducer(ProducerFace):
    """The asyncio producer: ``async with AsyncProducer(servers) as p: await p.send(...)``."""

    def __init__(
        self, servers: str | list[str], *, config: ProducerConfig | None = None, **overrides: Any
    ) -> None:
        self.config = make_config(config, overrides)
        self._servers = servers
        self._engine = cast(ProducerEngine, _NotStarted())

    async def start(self) -> AsyncProducer:
        """Connect to the brokers (raises NoBrokerAvailable if none answers)."""
        loop = asyncio.get_running_loop()
        engine = ProducerEngine(
            self._servers,
            self.config,
            loop,
            loop.create_future,
            threadsafe=False,
            learn=_not_published,
        )
        await engine.brokers.start()
        self._engine = engine
        # the hot path: one Python call per message, as the thread face's send_async
        self.send_nowait = engine.send_async  # type: ignore[method-assign]
        return self

    async def publish(self, topic: str) -> list[TopicPartition]:
        """Fetch (and cache) a topic's partitions; ``send_nowait`` needs this done first."""
        return await self._engine.brokers.partitions(topic)

    #: queue one message without waiting; ``await`` the returned handle for its result. The
    #: topic must be known (``await publish(topic)`` or an earlier ``await send``). ``start``
    #: binds the engine's method itself per instance (one Python call per message).
    send_nowait = ProducerFace._queue

    async def send(
        self, topic: str, value: Any, *, raise_on_error: bool = False, **opts: Unpack[SendOptions]
    ) -> SendResult:
        """Send one message and wait for its ack (``opts``: ``key=``, ``partition=``,
        ``attribute=``). A failed send returns ``success=False`` (MetaQ's ``SendResult``) —
        or, with ``raise_on_error=True`` (:meth:`send_and_wait`), raises its error."""
        engine = self._engine
        if engine.brokers.cached_partitions(topic) is None:
            await engine.brokers.partitions(topic)
        result: SendResult = await engine.send_async(topic, value, force=True, **opts)
        if raise_on_error and result.error is not None:
            raise result.error
        return result

    async def send_and_wait(
        self, topic: str, value: Any, **opts: Unpack[SendOptions]
    ) -> SendResult:
        """Send one message and return its :class:`SendResult` once acknowledged; a failure
        raises (as aiokafka's ``send_and_wait``)."""
        return await self.send(topic, value, raise_on_error=True, **opts)

    def transaction(
        self, timeout_s: int | None = None, *, request_timeout_s: float = 5.0
    ) -> AsyncLocalScope:
        """A local transaction bound to the calling task: ``async with p.transaction():`` then
        ``await p.send(...)``; commit on normal exit, rollback on an exception."""
        return self._engine.transactions().async_local_scope(timeout_s, request_timeout_s)

    def xa_resource(
        self,
        unique_qualifier: str | None = None,
        *,
        topics: list[str] | None = None,
        request_timeout_s: float = 5.0,
    ) -> AsyncXAResource:
        """An XA resource (coroutine methods); see ``Producer.xa_resource``."""
        txs = self._engine.transactions()
        return txs.async_xa_resource(txs.xa_core(unique_qualifier, topics, request_timeout_s))

    async def flush(self) -> None:
        """Send everything queued now and wait for it."""
        engine = self._engine
        futures = engine.begin_flush()
        try:
            for fut in futures:
                assert isinstance(fut, asyncio.Future)
                await fut
        finally:
            engine.end_flush()

    async def close(self) -> None:
        """Flush (up to the delivery timeout), then close the connections."""
        engine = self._engine
        if isinstance(engine, _NotStarted) or engine.closed:
            return
        try:
            await asyncio.wait_for(self.flush(), self.config.delivery_timeout_s)
        except TimeoutError:  # what is still unsent completes with ClientClosed below
            pass
        await engine.shutdown()

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
