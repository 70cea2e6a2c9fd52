"""The broker set of a ``zk://`` cluster: brokers and partition lists from MetaQ's ZooKeeper.

:func:`open_broker_set` is what the producer and consumer engines call with their ``servers``
string: a ``meta://host:port[,...]`` list gives a static :class:`BrokerSet`,
``zk://host:port[,host:port][/root]`` a :class:`ZkBrokerSet`.

A :class:`ZkBrokerSet` is a ``BrokerSet`` whose brokers are not configured but discovered:

* ``start()`` connects to ZooKeeper (``ClusterUnavailable`` naming the hosts if it does not
  answer within the connect timeout) and starts a
  :class:`~pymetaq.client.cluster.discovery.BrokerDiscovery` on one side of the registry:
  ``"pub"`` (producers: ``brokers/topics-pub``, masters only) or ``"sub"`` (consumers:
  ``brokers/topics-sub``).
* A topic's partition list is its registry view, sorted by (brokerId, partition) as MetaQ's
  producer sorts it, without the partitions of brokers marked *down*.  The set's brokers are
  the union of the views' brokers, each with the address ZooKeeper gives: a broker that
  appears is connected on first use; one that vanishes is *retired* — no new request goes to
  it, and its connection is closed after the request timeout, so requests already in flight
  are still answered (a broker that stops cleanly unregisters first and keeps serving for
  ``zkSyncTimeMs``).
* A broker whose connection cannot be opened is marked down at once (a SIGKILLed broker stays
  registered until its ZooKeeper session expires): its partitions leave the lists, and a probe
  reconnects every :data:`PROBE_INTERVAL_S` (doubling up to the metadata age) until it answers
  or registers again at a new address.  A request to a broker that is down or no longer
  registered fails at once with ``NoBrokerAvailable`` (nothing written), so the producer's
  sender can move an unpinned batch to a live partition (:attr:`ZkBrokerSet.reroutes`).
* ``partitions(topic)`` waits for the topic's first read.  A topic nobody registered yet may be
  one of a broker's ``[topic=pattern-*]`` sections (registered at its first put): the set then
  asks the registered masters with ``stats <topic>``, as a ``meta://`` list would; otherwise it
  raises ``UnknownTopicOrPartition`` naming the registry path.
* ``close()`` stops the discovery and, if the set created it, the kazoo client.

Thread-safety: as a ``BrokerSet``, it belongs to one event loop; the discovery thread's changes
reach it through ``call_soon_threadsafe``.  ``zk`` (the kazoo client) is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from pymetaq.client.cluster.discovery import BrokerDiscovery, Side, TopicView, read_masters
from pymetaq.client.cluster.errors import ClusterUnavailable
from pymetaq.client.cluster.session import (
    DEFAULT_SESSION_TIMEOUT_S,
    kazoo_client,
    start_client,
)
from pymetaq.client.errors import MetaClientError, NoBrokerAvailable, UnknownTopicOrPartition
from pymetaq.client.protocol.zk import ZkUrl, parse_meta_url, parse_zk_url
from pymetaq.client.transport.brokers import BrokerSet, _Broker
from pymetaq.client.transport.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    BrokerConnection,
)
from pymetaq.client.transport.security import (
    NO_SECURITY,
    TLS_SCHEME,
    ClientSecurity,
    client_security,
    split_options,
)
from pymetaq.client.transport.servers import zk_servers
from pymetaq.client.types import TopicPartition

log = logging.getLogger(__name__)

#: first delay between reconnect probes of a broker marked down (doubles up to the metadata age)
PROBE_INTERVAL_S = 0.5


def open_broker_set(
    servers: str | list[str],
    *,
    side: Side,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    metadata_max_age_s: float = 30.0,
    zk_session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
    prefer_slaves: bool = False,
) -> BrokerSet:
    """A :class:`ZkBrokerSet` for a ``zk://`` URL, else a static :class:`BrokerSet`
    (``prefer_slaves``: a ``zk://`` consumer reads from a broker's slave when one is registered)."""
    zk = zk_servers(servers)
    if zk is not None:
        head, query = split_options(zk)
        # options on a zk:// URL (ca=, cert=, user=...) select the brokers' TLS listeners
        security = client_security(f"{TLS_SCHEME}zk:1?{query}") if query else NO_SECURITY
        return ZkBrokerSet(
            parse_zk_url(head),
            side=side,
            security=security,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            metadata_max_age_s=metadata_max_age_s,
            session_timeout_s=zk_session_timeout_s,
            prefer_slaves=prefer_slaves,
        )
    return BrokerSet(
        servers,
        connect_timeout_s=connect_timeout_s,
        request_timeout_s=request_timeout_s,
        metadata_max_age_s=metadata_max_age_s,
    )


class ZkBrokerSet(BrokerSet):
    """A broker set discovered through ZooKeeper (see the module docstring)."""

    #: the producer may move a failed batch that nobody pinned to another live partition
    reroutes = True
    _source = "registered"

    def __init__(
        self,
        url: ZkUrl,
        *,
        side: Side,
        client: Any = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        metadata_max_age_s: float = 30.0,
        session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
        prefer_slaves: bool = False,
        security: ClientSecurity = NO_SECURITY,
    ) -> None:
        super().__init__(
            None,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            metadata_max_age_s=metadata_max_age_s,
        )
        self.url = url
        self.security = security
        self.side: Side = side
        self.prefer_slaves = prefer_slaves
        self._owns_client = client is None
        #: the kazoo client (not started until :meth:`start`); consumers share it
        self.zk = (
            client
            if client is not None
            else kazoo_client(url.hosts, session_timeout_s=session_timeout_s)
        )
        self._discovery: BrokerDiscovery | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._views: dict[str, TopicView] = {}
        #: topics nobody registered yet (pattern topics): the masters asked, the partitions
        #: they reported
        self._unregistered: dict[str, dict[int, str]] = {}
        self._fallback: dict[str, list[TopicPartition]] = {}
        #: brokers looked up by id for a partition of a topic not followed (tools asking for a
        #: committed partition's bounds): ``brokers/ids/<id>/master``, read once
        self._looked_up: dict[int, str] = {}
        self._seen: set[int] = set()  # every broker id a view or a lookup has shown
        self._down: dict[int, float] = {}  # broker id -> probe delay while it is down
        self._probes: dict[int, asyncio.TimerHandle] = {}
        #: connections of retired brokers still answering requests in flight
        self._retired: set[BrokerConnection] = set()
        self._changed: asyncio.Event | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect to ZooKeeper and start following the registry (no broker is contacted)."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        await asyncio.to_thread(self._connect_zk)
        self._discovery = BrokerDiscovery(
            self.zk,
            root=self.url.root,
            side=self.side,
            on_change=self._on_change_threadsafe,
            prefer_slaves=self.prefer_slaves,
        )

    def _connect_zk(self) -> None:
        if not self.zk.connected:
            start_client(self.zk, self.url.hosts, self.connect_timeout_s)

    def close(self) -> None:
        super().close()
        for conn in list(self._retired):
            self._close_retired(conn)
        for probe in self._probes.values():
            probe.cancel()
        self._probes.clear()
        disc, self._discovery = self._discovery, None
        if disc is not None:
            disc.close()
        if self._owns_client:
            try:
                self.zk.stop()
                self.zk.close()
            except Exception as e:  # closing must not fail the caller's close
                log.warning("closing the ZooKeeper client failed: %r", e)

    # -- registry changes (loop thread) -------------------------------------------------------
    def _tls_addresses(self, brokers: dict[int, str]) -> dict[int, str]:
        """(ZooKeeper thread) With TLS, each broker's ``master_tls`` address instead of its
        plain one; a broker without a TLS listener is left out (logged)."""
        if not self.security.tls:
            return brokers
        out: dict[int, str] = {}
        for bid, url in brokers.items():
            raw = None
            with contextlib.suppress(Exception):  # no node, or the session is down
                raw = self.zk.get(self.url.paths.broker_master_tls(bid))[0]
            if raw:
                out[bid] = raw.decode().strip()
            else:
                log.warning("broker %d (%s) registered no TLS listener: not used", bid, url)
        return out

    def _masters(self) -> dict[int, str]:
        return self._tls_addresses(read_masters(self.zk, self.url.paths))

    def _on_change_threadsafe(self, view: TopicView) -> None:
        loop = self._loop
        if loop is None or self._closed:
            return
        if self.security.tls:
            view = dataclasses.replace(view, brokers=self._tls_addresses(dict(view.brokers)))
        try:
            loop.call_soon_threadsafe(self._apply_view, view)
        except RuntimeError:  # the loop is closed: the client is closing
            log.debug("registry change after the client's loop closed (ignored)")

    def _apply_view(self, view: TopicView) -> None:
        if self._closed:
            return
        self._views[view.topic] = view
        if view.partitions:
            self._unregistered.pop(view.topic, None)
            self._fallback.pop(view.topic, None)
        self._reconcile()
        assert self._changed is not None
        self._changed.set()
        self._changed = asyncio.Event()

    def _wanted(self) -> dict[int, str]:
        wanted: dict[int, str] = dict(self._looked_up)
        for mapping in (*self._unregistered.values(), *(v.brokers for v in self._views.values())):
            wanted.update(mapping)
        self._seen.update(wanted)
        return wanted

    async def connection(self, broker_id: int) -> BrokerConnection:
        """The connection to ``broker_id``; an id no followed topic has shown is looked up in
        ``brokers/ids`` once (a retired or unknown broker fails at once)."""
        if broker_id not in self._seen and self._discovery is not None:
            self._seen.add(broker_id)
            masters = await asyncio.to_thread(self._masters)
            if broker_id in masters:
                self._looked_up[broker_id] = masters[broker_id]
                self._reconcile()
        return await super().connection(broker_id)

    def _reconcile(self) -> None:
        """Make the broker set and every partition list match the views."""
        wanted = self._wanted()
        for b in list(self._brokers):
            url = wanted.get(b.broker_id) if b.broker_id is not None else None
            if url is None or parse_meta_url(url) != (b.host, b.port):
                self._retire(b)
        known = {b.broker_id for b in self._brokers}
        for bid, url in sorted(wanted.items()):
            if bid not in known:
                host, port = parse_meta_url(url)
                self._brokers.append(_Broker(host, port, bid, registered=True))
                self._set_up(bid)  # a new address: a restarted broker gets a fresh chance
        for topic in set(self._views) | set(self._fallback) | set(self._topics):
            self._rebuild(topic)

    def _rebuild(self, topic: str) -> None:
        view = self._views.get(topic)
        if view is not None and view.partitions:
            parts: list[TopicPartition] = list(view.partitions)
        else:
            parts = self._fallback.get(topic, [])
        registered = [tp for tp in parts if tp.broker_id in {b.broker_id for b in self._brokers}]
        usable = [tp for tp in registered if tp.broker_id not in self._down]
        if usable:
            self._topics[topic] = usable
        elif registered:  # every broker of the topic is down: a send fails at once and the
            self._topics[topic] = registered  # producer waits (delivery timeout) for one
        else:
            self._topics.pop(topic, None)  # nothing registered: senders learn it again

    def _retire(self, b: _Broker) -> None:
        """Stop using ``b``; close its connection once requests in flight had their time."""
        self._brokers.remove(b)
        if b.broker_id is not None:
            self._set_up(b.broker_id)
        conn = b.conn
        if conn is not None and not conn.closed:
            if conn.pending and self._loop is not None:
                self._retired.add(conn)
                self._loop.call_later(self.request_timeout_s + 1.0, self._close_retired, conn)
            else:
                conn.close()
        log.info("broker %s at %s is no longer registered", b.broker_id, b.address)

    def _close_retired(self, conn: BrokerConnection) -> None:
        self._retired.discard(conn)
        conn.close()

    # -- brokers that do not answer -----------------------------------------------------------
    async def _ensure(self, b: _Broker) -> BrokerConnection:
        try:
            return await super()._ensure(b)
        except NoBrokerAvailable:
            if b.broker_id is not None and b in self._brokers:
                self._set_down(b.broker_id)
            raise

    def _set_down(self, bid: int) -> None:
        if bid in self._down or self._closed:
            return
        self._down[bid] = PROBE_INTERVAL_S
        log.warning("broker %s does not answer: its partitions are not used until it does", bid)
        for topic in list(self._topics):
            self._rebuild(topic)
        self._arm_probe(bid)

    def _set_up(self, bid: int) -> None:
        probe = self._probes.pop(bid, None)
        if probe is not None:
            probe.cancel()
        if self._down.pop(bid, None) is not None:
            for topic in set(self._views) | set(self._fallback):
                self._rebuild(topic)

    def _arm_probe(self, bid: int) -> None:
        loop = self._loop
        if loop is None or self._closed:
            return
        delay = self._down[bid]
        self._down[bid] = min(delay * 2, max(self.metadata_max_age_s, PROBE_INTERVAL_S))
        self._probes[bid] = loop.call_later(delay, self._probe, bid)

    def _probe(self, bid: int) -> None:
        self._probes.pop(bid, None)
        if self._closed or bid not in self._down:
            return
        task = asyncio.ensure_future(self._probe_once(bid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe_once(self, bid: int) -> None:
        b = next((x for x in self._brokers if x.broker_id == bid), None)
        if b is None:
            self._down.pop(bid, None)
            return
        try:
            await BrokerSet._ensure(self, b)
        except MetaClientError:
            if bid in self._down:
                self._arm_probe(bid)
            return
        log.info("broker %s answers again", bid)
        self._set_up(bid)

    def follow(self, topic: str) -> None:
        """Start following ``topic``'s registry entries now (any thread; no waiting): a group
        member's partitions come from its coordinator, but their brokers' addresses from
        here."""
        if self._discovery is None:
            raise NoBrokerAvailable("the broker set is not started")
        self._discovery.add_topic(topic)

    # -- partition lists ----------------------------------------------------------------------
    def invalidate(self, topic: str | None = None) -> None:
        """Nothing to refresh: ZooKeeper's watches keep the lists current (brokers that do not
        answer are dropped by the failed connect itself)."""

    def _arm_refresh(self, topic: str, delay: float) -> None:
        """No periodic refresh: the lists follow the registry."""

    async def partitions(self, topic: str, *, refresh: bool = False) -> list[TopicPartition]:
        """The topic's live partitions, sorted by (broker_id, partition) (see the module doc)."""
        cached = self._topics.get(topic)
        if cached and not refresh:
            return cached
        disc = self._discovery
        if disc is None or self._changed is None:
            raise NoBrokerAvailable("the broker set is not started")
        disc.add_topic(topic)
        deadline = time.monotonic() + max(self.connect_timeout_s, 1.0)
        while topic not in self._views:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterUnavailable(
                    f"no answer from ZooKeeper at {self.url.hosts} about topic {topic!r} "
                    f"within {self.connect_timeout_s:g} s"
                )
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                continue
        view = self._views[topic]
        if not view.partitions:
            return await self._unregistered_topic(topic)
        parts = self._topics.get(topic)
        if not parts:
            down = sorted({tp.broker_id for tp in view.partitions})
            raise NoBrokerAvailable(f"no broker of topic {topic!r} answers (brokers {down})")
        return parts

    async def _unregistered_topic(self, topic: str) -> list[TopicPartition]:
        """A topic with no registry entry: ask the registered masters (pattern topics)."""
        paths = self.url.paths
        path = paths.topic_pub(topic) if self.side == "pub" else paths.topic_sub(topic)
        masters = await asyncio.to_thread(self._masters)
        self._unregistered[topic] = masters
        self._reconcile()
        try:
            parts = await BrokerSet.partitions(self, topic, refresh=True)
        except (UnknownTopicOrPartition, NoBrokerAvailable):
            parts = []
        if not parts:
            self._unregistered.pop(topic, None)
            self._fallback.pop(topic, None)
            self._topics.pop(topic, None)
            self._reconcile()
            raise UnknownTopicOrPartition(
                f"no broker serves topic {topic!r}: nothing registered under {path}"
            )
        self._fallback[topic] = list(parts)
        self._rebuild(topic)
        log.info("topic %s is not registered yet: %d partition(s) from stats", topic, len(parts))
        live = self._topics.get(topic)
        if not live:
            raise NoBrokerAvailable(f"no broker of topic {topic!r} answers")
        return live
