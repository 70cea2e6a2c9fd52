"""The consumer's fetch side: the transport seam, read-ahead replies, per-partition state.

* :class:`ConsumerTransport` is the seam between the consumer logic and the network: three
  async calls (``partitions``, ``fetch``, ``nearest_offset``). :class:`BrokerTransport`
  implements it over the client core's :class:`~pymetaq.client.transport.BrokerSet`; tests use an
  in-memory fake.
* :func:`~pymetaq.client.consumer.scan.scan` (re-exported here) checks the records of one
  ``get`` reply (headers, CRCs) and splits it into messages.
* :class:`PartitionState` is everything the consumer knows about one partition, and
  :func:`apply_scan` / :func:`backoff` / :func:`grown_size` are MetaQ's fetch rules as pure
  functions: empty → ``delay += max/10`` up to max, progress resets it; a record that does not
  fit doubles the max size up to the cap and shrinks back when replies are small again.

Thread-safety: values and pure functions are thread-safe; a ``PartitionState`` is owned by one
worker at a time (the consumer guarantees it); a ``BrokerTransport`` belongs to one loop.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Protocol

from pymetaq.client.consumer.config import ConsumerConfig
from pymetaq.client.errors import MetaClientError
from pymetaq.client.protocol import GetCommand, OffsetCommand, ResultReply, ValueReply
from pymetaq.client.transport.brokers import BrokerSet
from pymetaq.client.transport.connection import raise_for_reply
from pymetaq.client.transport.zkbrokers import open_broker_set
from pymetaq.client.types import TopicPartition

log = logging.getLogger(__name__)

#: ``offset`` query for the end of a partition (MetaQ: beyond the end -> max offset).
END_OFFSET = (1 << 63) - 1


class FetchStatus(enum.Enum):
    DATA = "data"  # bytes at the requested offset
    NO_DATA = "no_data"  # 404: nothing (yet) at that offset
    MOVED = "moved"  # 301: fetch from new_offset instead
    ERROR = "error"  # anything else (connection, timeout, 403, 500, ...)


@dataclass(frozen=True, slots=True)
class FetchReply:
    status: FetchStatus
    data: bytes = b""
    new_offset: int = -1
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Prefetched:
    """A raw ``get`` reply fetched ahead (read-ahead), with what it was asked for."""

    offset: int
    generation: int
    started: float  # time.monotonic() when the get was sent (long-poll accounting)
    reply: FetchReply


class ConsumerTransport(Protocol):
    """What the consumer needs from the network (async; one event loop)."""

    async def start(self) -> None: ...

    async def partitions(self, topic: str) -> list[TopicPartition]: ...

    async def fetch(
        self, tp: TopicPartition, group: str, offset: int, max_size: int, max_wait_ms: int
    ) -> FetchReply: ...

    async def nearest_offset(self, tp: TopicPartition, group: str, offset: int) -> int: ...

    def close(self) -> None: ...


class BrokerTransport:
    """:class:`ConsumerTransport` over real brokers (the client core's ``BrokerSet``)."""

    def __init__(self, servers: str | list[str], config: ConsumerConfig) -> None:
        self.request_timeout_s = config.request_timeout_ms / 1000
        #: a static set for ``meta://`` lists, a ZkBrokerSet (``topics-sub``) for ``zk://``
        self.brokers: BrokerSet = open_broker_set(
            servers,
            side="sub",
            connect_timeout_s=config.connect_timeout_ms / 1000,
            request_timeout_s=self.request_timeout_s,
            zk_session_timeout_s=config.zk_session_timeout_ms / 1000,
            prefer_slaves=config.read_from_slaves,
        )

    async def start(self) -> None:
        await self.brokers.start()

    async def partitions(self, topic: str) -> list[TopicPartition]:
        parts = await self.brokers.partitions(topic, refresh=True)
        return [TopicPartition(topic, p.broker_id, p.partition) for p in parts]

    async def fetch(
        self, tp: TopicPartition, group: str, offset: int, max_size: int, max_wait_ms: int
    ) -> FetchReply:
        cmd = GetCommand(tp.topic, group, tp.partition, offset, max_size, 0, max_wait_ms or None)
        try:
            conn = await self.brokers.connection(tp.broker_id)
            reply = await conn.request(cmd, self.request_timeout_s + max_wait_ms / 1000)
        except MetaClientError as e:
            return FetchReply(FetchStatus.ERROR, error=e)
        if isinstance(reply, ValueReply):
            return FetchReply(FetchStatus.DATA, reply.data)
        assert isinstance(reply, ResultReply)
        if reply.code == 404 or (reply.code == 200 and not reply.body):
            return FetchReply(FetchStatus.NO_DATA)
        if reply.code == 301:
            try:
                return FetchReply(FetchStatus.MOVED, new_offset=int(reply.body.strip()))
            except ValueError:
                pass
        try:
            raise_for_reply(reply)
        except MetaClientError as e:
            return FetchReply(FetchStatus.ERROR, error=e)
        return FetchReply(FetchStatus.ERROR, error=MetaClientError(f"unexpected reply {reply!r}"))

    async def nearest_offset(self, tp: TopicPartition, group: str, offset: int) -> int:
        conn = await self.brokers.connection(tp.broker_id)
        cmd = OffsetCommand(tp.topic, group, tp.partition, offset, 0)
        reply = await conn.request(cmd, self.request_timeout_s)
        assert isinstance(reply, ResultReply)
        if reply.code == 404:
            return 0  # a configured partition nothing was written to yet: empty, starts at 0
        raise_for_reply(reply)
        return int(reply.body.strip())

    def close(self) -> None:
        self.brokers.close()
