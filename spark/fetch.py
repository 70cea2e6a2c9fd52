"""The broker side of format ``pymetaq``: partition metadata for the driver and the fetch loop
the executors run (:func:`read_range`), yielding ``pyarrow.RecordBatch``es.

:class:`Brokers` is a synchronous face over the client's ``BrokerTransport`` (its own event
loop, run in the calling thread): the topics matching a subscription, each partition's bounds
(``offset`` requests), raw ``get``s. A ``subscribePattern`` is matched against the topics
registered in ZooKeeper (``zk://`` servers) or those the brokers list (``meta://``). Each Spark task opens its own (executors are separate
processes); the driver-side readers open one lazily and drop it when pickled.

:func:`read_range` reads ``[start, end)`` of one partition: ``get`` from ``start``, check the
records (``scan``: lengths, CRCs, attributes, lz4 batches), stop exactly at ``end`` (an end is
always a record boundary: the end of a log, or a boundary found by :func:`next_boundary`), so a
replayed task yields the same rows. An offset the broker moved past (``301``: retention) is a
data loss: :class:`~pymetaq.spark.offsets.DataLoss` or a skip, per ``failOnDataLoss``.

Thread-safety: a :class:`Brokers` belongs to one thread; the functions are re-entrant.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from pymetaq.client.cli.positions import bounds as partition_bounds
from pymetaq.client.consumer.config import ConsumerConfig
from pymetaq.client.consumer.scan import scan
from pymetaq.client.consumer.transport import BrokerTransport, FetchReply, FetchStatus
from pymetaq.client.errors import CorruptMessage, MetaClientError
from pymetaq.client.transport.servers import parse_servers
from pymetaq.client.transport.zkbrokers import ZkBrokerSet
from pymetaq.client.types import ID_EPOCH_MS, ID_TIME_SHIFT, Message, TopicPartition
from pymetaq.spark.offsets import DataLoss, walk_records
from pymetaq.spark.options import SparkOptionError, Subscription

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
#: a single record may be up to a broker's maxTransferSize; the fetch grows up to this
_MAX_FETCH = 64 << 20
#: rows per Arrow batch yielded to Spark
_ROWS_PER_BATCH = 8192


class Brokers:
    """A synchronous client for planning and fetching (see the module docstring)."""

    def __init__(self, servers: str, group: str, timeout_s: float = 10.0) -> None:
        self.servers = servers
        self.group = group
        self._loop = asyncio.new_event_loop()
        ms = int(timeout_s * 1000)
        config = ConsumerConfig(request_timeout_ms=ms, connect_timeout_ms=ms)
        self._tr = BrokerTransport(servers, config)
        try:
            self._run(self._tr.start())
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._tr.close()
            self._loop.run_until_complete(asyncio.sleep(0))
        finally:
            self._loop.close()

    def __enter__(self) -> Brokers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def registry(self) -> ZkBrokerSet | None:
        """The broker set of ``zk://`` servers (its ``zk`` client, its root); None for
        ``meta://`` servers."""
        brokers = self._tr.brokers
        return brokers if isinstance(brokers, ZkBrokerSet) else None

    def partitions(self, topic: str) -> list[TopicPartition]:
        return self._run(self._tr.partitions(topic))

    def bounds(self, tp: TopicPartition) -> tuple[int, int]:
        """``(first stored offset, end of the log)``."""
        return self._run(partition_bounds(self._tr, tp))

    def nearest(self, tp: TopicPartition, offset: int) -> int:
        """The start of the segment holding ``offset`` (MetaQ's ``offset`` request)."""
        return self._run(self._tr.nearest_offset(tp, self.group, offset))

    def fetch(self, tp: TopicPartition, offset: int, size: int) -> FetchReply:
        return self._run(self._tr.fetch(tp, self.group, offset, size, 0))

    def topics(self, sub: Subscription) -> list[str]:
        """The topics of a subscription. A pattern is matched against the topics the cluster
        serves: with ``zk://`` servers, the topics registered in ZooKeeper for subscribers
        (``brokers/topics-sub``); with ``meta://`` servers, the topics each broker lists."""
        if sub.pattern is None:
            return list(sub.topics) or [t for t, _ in sub.assigned]
        names = self._broker_topics() if self.registry is None else self._registered_topics()
        return sorted(t for t in names if re.fullmatch(sub.pattern, t))

    def _registered_topics(self) -> set[str]:
        from kazoo.exceptions import NoNodeError  # a started ZkBrokerSet has kazoo

        registry = self.registry
        assert registry is not None
        try:
            return set(registry.zk.get_children(registry.url.paths.topics_sub_root))
        except NoNodeError:  # no broker registered a topic yet
            return set()

    def _broker_topics(self) -> set[str]:
        from pymetaq.client.cli.topics import broker_topics

        names = set()
        for host, port in parse_servers(self.servers):
            for row in broker_topics(host, port, 10.0):
                if not row["pattern"]:
                    names.add(row["topic"])
        return names

    def subscribed(self, sub: Subscription) -> list[TopicPartition]:
        """Every partition a subscription covers, sorted."""
        out: list[TopicPartition] = []
        wanted = dict(sub.assigned)
        for topic in self.topics(sub):
            parts = self.partitions(topic)
            if topic in wanted:
                known = {tp.key for tp in parts}
                missing = [k for k in wanted[topic] if k not in known]
                if missing:
                    raise SparkOptionError(
                        f"option 'assign': topic {topic!r} has no partition {', '.join(missing)}"
                        f" (it has {', '.join(sorted(known)) or 'none'})"
                    )
                parts = [tp for tp in parts if tp.key in wanted[topic]]
            out.extend(parts)
        return sorted(out)


def _check_reply(tp: TopicPartition, offset: int, reply: FetchReply) -> None:
    if reply.status is FetchStatus.ERROR:
        err = reply.error
        raise MetaClientError(f"cannot read {tp} at offset {offset}: {err}") from err


def read_messages(
    brokers: Brokers, tp: TopicPartition, start: int, end: int, fail: bool, fetch_size: int
) -> Iterator[list[Message]]:
    """The messages of ``[start, end)`` of ``tp``, a list per ``get``."""
    offset, size = start, fetch_size
    while offset < end:
        reply = brokers.fetch(tp, offset, min(size, max(end - offset, 1024)))
        _check_reply(tp, offset, reply)
        if reply.status is FetchStatus.MOVED:
            if fail:
                raise DataLoss(
                    f"data loss: {tp} offsets {offset}..{reply.new_offset} are no longer stored "
                    "(retention); set failOnDataLoss=false to skip them"
                )
            offset = reply.new_offset
            continue
        if reply.status is FetchStatus.NO_DATA:
            if fail:
                raise DataLoss(f"data loss: {tp} has no data at {offset} (expected up to {end})")
            return
        found = scan(reply.data, tp, offset)
        if found.undecodable is not None:
            raise found.undecodable
        if found.corrupt_at >= 0 and not len(found.messages):
            raise CorruptMessage(found.corrupt_at, f"{tp}: {found.reason}")
        if found.need:
            if size >= _MAX_FETCH:
                raise CorruptMessage(offset, f"{tp}: a record larger than {_MAX_FETCH} bytes")
            size = min(_MAX_FETCH, max(size * 2, found.need))
            continue
        msgs = [m for m in found.messages if m.offset < end]
        if msgs:
            yield msgs
        offset = found.next_offset


def to_arrow(msgs: list[Message], schema: pa.Schema) -> pa.RecordBatch:
    """One Arrow batch in the source's schema (see :mod:`pymetaq.spark.source`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    topic, _part, offset, ids, value, attribute, _next, _bid, key = zip(*msgs)
    n = len(msgs)
    ids_a = pa.array(ids, pa.int64())
    ms = pc.add(pc.shift_right(ids_a, ID_TIME_SHIFT), ID_EPOCH_MS)
    ts = pc.multiply(ms, 1000).cast(pa.timestamp("us", tz="UTC"))
    pkey = msgs[0].partition_key
    return pa.RecordBatch.from_arrays(
        [
            pa.array(key, pa.binary()),
            pa.array(value, pa.binary()),
            pa.array(topic, pa.string()),
            pa.array([pkey] * n, pa.string()),
            pa.array(offset, pa.int64()),
            ids_a,
            ts,
            pa.array(attribute, pa.string()),
        ],
        schema=schema,
    )


def read_range(
    servers: str,
    group: str,
    tp: TopicPartition,
    start: int,
    end: int,
    fail: bool,
    fetch_size: int,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """Executor side: ``[start, end)`` of ``tp`` as Arrow batches (see the module docstring)."""
    if start >= end:
        return
    with Brokers(servers, group) as brokers:
        first, last = brokers.bounds(tp)
        if start < first and fail:
            raise DataLoss(
                f"data loss: {tp} offsets {start}..{first} are no longer stored (retention); "
                "set failOnDataLoss=false to skip to the first stored offset"
            )
        if end > last and fail:
            raise DataLoss(f"data loss: {tp} ends at {last}, before the planned end {end}")
        pending: list[Message] = []
        for msgs in read_messages(brokers, tp, max(start, first), min(end, last), fail, fetch_size):
            pending.extend(msgs)
            if len(pending) >= _ROWS_PER_BATCH:
                yield to_arrow(pending, schema)
                pending = []
        if pending:
            yield to_arrow(pending, schema)


def next_boundary(
    brokers: Brokers, tp: TopicPartition, start: int, end: int, max_bytes: int, max_records: int
) -> int:
    """The record boundary in ``(start, end]`` reached by taking at most ``max_bytes`` of log
    and ``max_records`` records from ``start`` (at least one record). Reads the headers through
    ``get`` (the driver pays a fetch of up to the budget)."""
    offset, bytes_left, records_left = start, max_bytes, max_records
    size = 1 << 20
    while offset < end and bytes_left > 0 and records_left > 0:
        reply = brokers.fetch(tp, offset, min(size, max(end - offset, 1024)))
        _check_reply(tp, offset, reply)
        if reply.status is FetchStatus.MOVED:
            return end if reply.new_offset >= end else reply.new_offset
        if reply.status is FetchStatus.NO_DATA:
            return offset
        new, n = walk_records(
            reply.data,
            offset,
            max_bytes=bytes_left,
            max_records=records_left,
            at_least_one=offset == start,
        )
        if n == 0:
            if offset > start or size >= _MAX_FETCH:
                return offset if offset > start else end
            size *= 4  # a record larger than the fetch: ask for more
            continue
        bytes_left -= new - offset
        records_left -= n
        offset = new
    return min(offset, end)
