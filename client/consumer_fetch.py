"""The consumer's fetch side: the transport seam, read-ahead replies, per-partition state.

* :class:`ConsumerTransport` is the seam between the consumer logic and the network: three
  async calls (``partitions``, ``fetch``, ``nearest_offset``). :class:`BrokerTransport`
  implements it over the client core's :class:`~pymetaq.client.core.BrokerSet`; tests use an
  in-memory fake.
* :func:`~pymetaq.client.consumer_scan.scan` (re-exported here) checks the records of one
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pymetaq.client.consumer_batch import id_at, next_offset_at, offset_at
from pymetaq.client.consumer_config import ConsumerConfig, TopicPartition
from pymetaq.client.consumer_scan import Scan as Scan  # re-exported
from pymetaq.client.consumer_scan import scan as scan  # re-exported
from pymetaq.client.core import BrokerSet, Message, MetaClientError, raise_for_reply
from pymetaq.client.protocol import GetCommand, OffsetCommand, ResultReply, ValueReply

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
        self.request_timeout = config.request_timeout_ms / 1000
        self.brokers = BrokerSet(
            servers,
            connect_timeout=config.connect_timeout_ms / 1000,
            request_timeout=self.request_timeout,
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
            reply = await conn.request(cmd, self.request_timeout + max_wait_ms / 1000)
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
        reply = await conn.request(cmd, self.request_timeout)
        assert isinstance(reply, ResultReply)
        if reply.code == 404:
            return 0  # a configured partition nothing was written to yet: empty, starts at 0
        raise_for_reply(reply)
        return int(reply.body.strip())

    def close(self) -> None:
        self.brokers.close()


@dataclass(eq=False)
class PartitionState:
    """One owned partition: positions, buffered messages, backoff, retry and resync state.

    ``fetch_offset`` is where the next ``get`` starts; ``position`` is the consumed position
    (the offset to commit: the next byte after the last processed message); ``committed`` the
    last offset written to the store.
    """

    tp: TopicPartition
    fetch_offset: int
    max_size: int
    position: int = -1
    last_msg_id: int = -1
    committed: int = -1
    delay_ms: float = 0.0
    buffer: Sequence[Message] = field(default_factory=list)
    index: int = 0  # next buffered message to deliver
    attempts: int = 0  # failed listener attempts of buffer[index]
    resync_floor: int = -1  # after a CRC resync, skip records below this offset
    last_corrupt: int = -1
    crc_errors: int = 0
    reset_pending: bool = False  # a seek: commit with reset (may move backwards)
    generation: int = 0  # bumped by a seek request: results of older fetches are dropped
    pending_seek: int | None = None
    #: after a seek or a load: on the first empty reply, check the offset is not beyond the
    #: end (a MetaQ broker answers 404, not 301, there unless updateConsumerOffsets is on)
    check_end: bool = True

    def __post_init__(self) -> None:
        if self.position < 0:
            self.position = self.fetch_offset

    @property
    def buffered(self) -> int:
        return len(self.buffer) - self.index

    def request_seek(self, offset: int) -> None:
        """Ask for a seek (any thread); the owner applies it at its next safe point."""
        self.pending_seek = offset
        self.generation += 1

    def apply_pending_seek(self) -> bool:
        """Apply a requested seek (owner only); True if one was applied."""
        offset = self.pending_seek
        if offset is None:
            return False
        self.pending_seek = None
        self.fetch_offset = self.position = offset
        self.buffer, self.index, self.attempts = [], 0, 0
        self.resync_floor = self.last_corrupt = -1
        self.delay_ms = 0.0
        self.reset_pending = True
        self.check_end = True
        return True

    def consume_head(self) -> None:
        """Mark ``buffer[index]`` processed and advance (see :meth:`consumed_through`)."""
        self.consumed_through(self.index)

    def consumed_through(self, k: int) -> None:
        """Mark ``buffer[:k + 1]`` processed: the index moves to ``k + 1``.

        The position moves past message ``k``, except inside an lz4 batch (its inner messages
        share one record): there it stays at the record until the batch's last message.
        """
        buf = self.buffer
        self.index = k + 1
        self.attempts = 0
        here = offset_at(buf, k)
        inside = k + 1 < len(buf) and offset_at(buf, k + 1) == here
        self.position = here if inside else next_offset_at(buf, k)
        self.last_msg_id = id_at(buf, k)


def backoff(delay_ms: float, max_delay_ms: int) -> float:
    """MetaQ's empty-fetch backoff: ``delay += max/10``, capped at max."""
    return min(delay_ms + max_delay_ms / 10, float(max_delay_ms))


def grown_size(max_size: int, need: int, cap: int) -> int:
    """Double ``max_size`` until ``need`` fits, capped at ``cap``."""
    size = max_size
    while size < need and size < cap:
        size *= 2
    return min(size, cap)


class Step(enum.Enum):
    """What one fetch led to (the caller schedules the partition accordingly)."""

    PROGRESS = "progress"  # messages buffered
    EMPTY = "empty"  # nothing new: back off
    GROW = "grow"  # a record did not fit: refetch at once with a bigger max size
    TOO_LARGE = "too_large"  # a record exceeds the cap: stuck, back off at max
    RESYNC = "resync"  # corrupt record: ask the broker for the segment start
    SKIPPED = "skipped"  # records below the resync floor were dropped; refetch at once


def apply_scan(st: PartitionState, sc: Scan, fetched: int, config: ConsumerConfig) -> Step:
    """Fold one scanned reply into the partition's state (pure logic, no I/O)."""
    msgs = sc.messages
    floor = st.resync_floor
    if floor >= 0 and msgs:
        kept = [m for m in msgs if m.offset >= floor]
        if not kept:
            st.fetch_offset = sc.next_offset
            return Step.SKIPPED
        msgs = kept
        st.resync_floor = -1
    if sc.corrupt_at >= 0 and not msgs:
        st.crc_errors += 1
        st.fetch_offset = sc.corrupt_at
        return Step.RESYNC
    if msgs:
        st.buffer, st.index, st.attempts = msgs, 0, 0
        st.fetch_offset = sc.next_offset
        st.delay_ms = 0.0
        st.last_corrupt = -1
        if st.max_size > config.fetch_max_size and fetched < st.max_size // 2:
            st.max_size = max(st.max_size // 2, config.fetch_max_size)
        return Step.PROGRESS
    if sc.need > 0:
        if sc.need > config.fetch_max_size_cap or st.max_size >= config.fetch_max_size_cap:
            st.delay_ms = float(config.max_delay_fetch_ms)
            return Step.TOO_LARGE
        st.max_size = grown_size(st.max_size, sc.need, config.fetch_max_size_cap)
        return Step.GROW
    st.delay_ms = backoff(st.delay_ms, config.max_delay_fetch_ms)
    return Step.EMPTY
