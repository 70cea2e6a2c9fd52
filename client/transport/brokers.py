"""Server lists, broker discovery and topic partition metadata.

``parse_servers("meta://h:p,meta://h2:p2")`` -> ``[("h", p), ("h2", p2)]`` (``meta://`` may be
omitted; IPv6 as ``meta://[::1]:8123``). Raises ``ValueError`` naming the bad entry.

``BrokerSet`` (asyncio) connects to every configured server, learns each broker's ``broker_id``
(``stats`` general item ``broker_id``) and, per topic, its partition count (``stats <topic>`` ->
``partitions N``). A topic's partitions are sorted by (broker_id, partition), as MetaQ's
producer sorts them; MetaQ's partition key is ``"<brokerId>-<partition>"``. Metadata is cached;
``invalidate(topic)`` (after a send failure) refreshes the list in the background, as happens
every ``metadata_max_age_s`` (so a broker that comes back is used again); ``cached_partitions``
keeps returning the old list until the new one is in. And
``connection(broker_id)`` reconnects a broker whose connection died.

The brokers of a ``zk://`` cluster come from ZooKeeper instead: see
:class:`pymetaq.client.transport.zkbrokers.ZkBrokerSet` (a subclass) and
:func:`pymetaq.client.transport.zkbrokers.open_broker_set`, which picks the class for a
``servers`` string.

Thread-safety: a BrokerSet belongs to one event loop; call it only from that loop, except
``cached_partitions`` (any thread: a dict read).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from pymetaq.client.errors import (
    AuthenticationFailed,
    ClientClosed,
    MetaClientError,
    NoBrokerAvailable,
    UnknownTopicOrPartition,
)
from pymetaq.client.protocol import ResultReply, StatsCommand
from pymetaq.client.transport.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    BrokerConnection,
    raise_for_reply,
)
from pymetaq.client.transport.security import NO_SECURITY, client_security
from pymetaq.client.transport.servers import parse_servers, parse_stats
from pymetaq.client.types import TopicPartition

log = logging.getLogger(__name__)


def stats_command(item: str) -> StatsCommand:
    return StatsCommand(item=item, opaque=0)


@dataclass
class _Broker:
    host: str
    port: int
    broker_id: int | None = None
    conn: BrokerConnection | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: the id is known beforehand (ZooKeeper registered this address as that broker): a server
    #: there reporting another ``broker_id`` is refused, never adopted
    registered: bool = False

    @property
    def address(self) -> str:
        return (
            f"meta://{self.host}:{self.port}"  # an id for ZooKeeper/stats: the scheme is the set's
        )


class BrokerSet:
    """Connections to the configured brokers plus per-topic partition metadata."""

    def __init__(
        self,
        servers: str | list[str] | list[tuple[str, int]] | None,
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        metadata_max_age_s: float = 30.0,
    ) -> None:
        pairs: list[tuple[str, int]] = []
        #: TLS and credentials of every connection (``meta+tls://``, ``?user=``: .security)
        self.security = NO_SECURITY
        if servers is None:  # a subclass fills the set (ZooKeeper)
            pass
        elif isinstance(servers, list) and servers and isinstance(servers[0], tuple):
            pairs = [(str(h), int(p)) for h, p in servers]
        else:
            pairs = parse_servers(servers)  # type: ignore[arg-type,unused-ignore]
            self.security = client_security(servers)  # type: ignore[arg-type,unused-ignore]
        self._brokers = [_Broker(h, p) for h, p in pairs]
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.metadata_max_age_s = metadata_max_age_s
        self._topics: dict[str, list[TopicPartition]] = {}
        self._refreshing: set[str] = set()
        self._tasks: set[asyncio.Future[None]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._closed = False

    @property
    def brokers(self) -> dict[int, str]:
        """Known broker ids -> ``meta://host:port``."""
        return {b.broker_id: b.address for b in self._brokers if b.broker_id is not None}

    async def start(self) -> None:
        """Connect to every server and learn broker ids; raises if none answers."""
        results = await asyncio.gather(
            *(self._ensure(b) for b in self._brokers), return_exceptions=True
        )
        if not any(isinstance(r, BrokerConnection) for r in results):
            for r in results:  # refused credentials: say so, retrying cannot help
                if isinstance(r, AuthenticationFailed):
                    raise r
            errors = "; ".join(str(r) for r in results)
            raise NoBrokerAvailable(f"no broker reachable: {errors}")

    async def _ensure(self, b: _Broker) -> BrokerConnection:
        if self._closed:
            raise ClientClosed("broker set is closed")
        if b.conn is not None and not b.conn.closed:
            return b.conn
        async with b.lock:
            if b.conn is not None and not b.conn.closed:
                return b.conn
            conn = await BrokerConnection.open(
                b.host, b.port, connect_timeout_s=self.connect_timeout_s, security=self.security
            )
            try:
                reply = raise_for_reply(
                    await conn.request(stats_command(""), self.request_timeout_s)
                )
                assert isinstance(reply, ResultReply)
                stats = parse_stats(reply.body)
                broker_id = int(stats["broker_id"])
            except (MetaClientError, KeyError, ValueError) as e:
                conn.close()
                raise NoBrokerAvailable(
                    f"{b.address} did not report its broker_id: {e!r}"
                ) from None
            if b.registered and b.broker_id != broker_id:
                conn.close()
                raise NoBrokerAvailable(
                    f"{b.address} reports broker_id {broker_id}, but it is registered as "
                    f"broker {b.broker_id}"
                )
            if b.broker_id is not None and b.broker_id != broker_id:
                log.warning("%s changed broker_id %s -> %s", b.address, b.broker_id, broker_id)
                self._topics.clear()
            b.broker_id, b.conn = broker_id, conn
            return conn

    def _by_id(self, broker_id: int) -> _Broker:
        for b in self._brokers:
            if b.broker_id == broker_id:
                return b
        raise NoBrokerAvailable(f"no {self._source} server has broker_id {broker_id}")

    #: how the servers were given (error messages)
    _source = "configured"
    #: may the producer move a failed batch nobody pinned to another partition? (ZooKeeper
    #: sets only: their lists drop brokers that do not answer)
    reroutes = False

    async def connection(self, broker_id: int) -> BrokerConnection:
        """The live connection to ``broker_id`` (reconnecting if it died).

        Servers whose id is still unknown (down since start) are tried first if no known
        server has that id.
        """
        if not any(b.broker_id == broker_id for b in self._brokers):
            unknown = [b for b in self._brokers if b.broker_id is None]
            await asyncio.gather(*(self._ensure(b) for b in unknown), return_exceptions=True)
        return await self._ensure(self._by_id(broker_id))

    def cached_connection(self, broker_id: int) -> BrokerConnection | None:
        """The connection if it is open, else None (no I/O)."""
        for b in self._brokers:
            if b.broker_id == broker_id and b.conn is not None and not b.conn.closed:
                return b.conn
        return None

    @property
    def partition_cache(self) -> Mapping[str, list[TopicPartition]]:
        """The cached partition lists by topic (a read-only view; any thread, no I/O): the
        producer's hot path reads it with ``.get`` instead of calling :meth:`cached_partitions`."""
        return self._topics

    def cached_partitions(self, topic: str) -> list[TopicPartition] | None:
        """The topic's cached partition list, or None if never fetched (a dict read; any thread).

        Staleness costs nothing here: the loop refreshes a list in the background when it is
        ``metadata_max_age_s`` old or after :meth:`invalidate`, and swaps in the new list.
        """
        return self._topics.get(topic)

    def invalidate(self, topic: str | None = None) -> None:
        """(loop thread) Refresh a topic's (or every topic's) partitions in the background."""
        for t in [topic] if topic is not None else list(self._topics):
            if t in self._topics:
                self._schedule_refresh(t)

    def _schedule_refresh(self, topic: str) -> None:
        if self._closed or topic in self._refreshing:
            return
        self._refreshing.add(topic)
        task = asyncio.ensure_future(self._refresh(topic))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh(self, topic: str) -> None:
        retry_in = None
        try:
            await self.partitions(topic, refresh=True)
        except asyncio.CancelledError:
            return
        except MetaClientError as e:
            log.info("metadata refresh of %r failed (keeping the old list): %s", topic, e)
            retry_in = 1.0
        finally:
            self._refreshing.discard(topic)
        if retry_in is not None and not self._closed:
            self._arm_refresh(topic, retry_in)

    def _arm_refresh(self, topic: str, delay: float) -> None:
        old = self._timers.pop(topic, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[topic] = loop.call_later(delay, self._schedule_refresh, topic)

    async def partitions(self, topic: str, *, refresh: bool = False) -> list[TopicPartition]:
        """The topic's partitions over all reachable brokers, sorted by (broker_id, partition)."""
        if not refresh:
            cached = self._topics.get(topic)
            if cached is not None:
                return cached
        counts = await asyncio.gather(
            *(self._topic_count(b, topic) for b in self._brokers), return_exceptions=True
        )
        parts: list[TopicPartition] = []
        errors: list[str] = []
        for b, n in zip(self._brokers, counts):
            if isinstance(n, BaseException):
                errors.append(f"{b.address}: {n}")
            elif b.broker_id is not None:
                parts.extend(TopicPartition(topic, b.broker_id, p) for p in range(n))
        if not parts:
            if errors and len(errors) == len(self._brokers):
                raise NoBrokerAvailable(
                    f"no broker reachable for topic {topic!r}: {'; '.join(errors)}"
                )
            raise UnknownTopicOrPartition(f"no broker serves topic {topic!r}")
        parts.sort()
        self._topics[topic] = parts
        self._arm_refresh(topic, self.metadata_max_age_s)
        return parts

    async def _topic_count(self, b: _Broker, topic: str) -> int:
        conn = await self._ensure(b)
        reply = raise_for_reply(await conn.request(stats_command(topic), self.request_timeout_s))
        assert isinstance(reply, ResultReply)
        stats = parse_stats(reply.body)
        if "partitions" in stats:
            return int(stats["partitions"].split()[0])
        return 0

    def close(self) -> None:
        """Close every connection and cancel background refreshes (loop thread)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for b in self._brokers:
            if b.conn is not None:
                b.conn.close()  # never raises: fails its pending requests, closes the transport
                b.conn = None
