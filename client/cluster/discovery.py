"""Broker discovery through ZooKeeper: which brokers serve which partitions of a topic.

A :class:`BrokerDiscovery` follows a set of topics on one side of the registry:

- ``side="pub"`` (producers): ``brokers/topics-pub/<topic>``; only masters (``<id>-m``)
  count, as in MetaQ's producer; a partition's address is ``brokers/ids/<id>/master``.
- ``side="sub"`` (consumers): ``brokers/topics-sub/<topic>``; master and slave entries
  (``<id>-s<n>``) are merged: a broker's partitions are the union of its entries' counts and
  its address is the master's, else its lowest slave's (MetaQ prefers the master); with
  ``prefer_slaves=True`` (a consumer's ``read_from_slaves``) the lowest slave's, else the
  master's (a slave holds the master's bytes at the master's offsets: positions carry over).

For each topic it keeps a :class:`TopicView`: the partitions sorted by (brokerId, partition)
and the address of every broker in it.  Entries whose value is malformed, or whose broker has
no address registered, are skipped (and logged once per change).  ``on_change(view)`` is
called on the discovery thread whenever a topic's view differs from the previous one,
including the first read; views are compared, events are never counted, so several changes
between two reads produce one call, and a ZooKeeper restart or a new session re-reads
everything.

Thread-safety: ``add_topic``/``view``/``wait_view``/``close`` from any thread; ``on_change``
runs on the discovery thread and must not block for long.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pymetaq.client.cluster.errors import ClusterUnavailable
from pymetaq.client.cluster.session import RefreshLoop
from pymetaq.client.protocol.zk import (
    BrokerNode,
    ZkPaths,
    check_name,
    decode_topic_broker,
    parse_broker_node,
    parse_meta_url,
)
from pymetaq.client.types import TopicPartition

log = logging.getLogger("pymetaq.cluster")

Side = Literal["pub", "sub"]


@dataclass(frozen=True)
class TopicView:
    """What the registry says about one topic (immutable; compared by value)."""

    topic: str
    partitions: tuple[TopicPartition, ...] = ()  # sorted by (broker_id, partition)
    brokers: Mapping[int, str] = field(default_factory=dict)  # id -> meta://host:port

    def url(self, p: TopicPartition) -> str:
        return self.brokers[p.broker_id]

    @property
    def partition_names(self) -> list[str]:
        return [p.key for p in self.partitions]

    def __hash__(self) -> int:
        return hash((self.topic, self.partitions, tuple(sorted(self.brokers.items()))))


def read_topic(
    client: Any,
    paths: ZkPaths,
    topic: str,
    side: Side,
    watch: Any = None,
    *,
    require_address: bool = True,
    prefer_slaves: bool = False,
) -> TopicView:
    """Read one topic's view now (``watch`` is armed on every node read, if given).

    With ``require_address=False`` the partitions of brokers whose address node is missing are
    kept (MetaQ's consumers balance over the ``topics-sub`` entries alone)."""
    base = paths.topic_pub(topic) if side == "pub" else paths.topic_sub(topic)
    children = _children(client, base, watch)
    counts: dict[int, int] = {}
    roles: dict[int, list[BrokerNode]] = {}
    for name in sorted(children):
        try:
            node = parse_broker_node(name)
        except ValueError:
            log.debug("ignoring %s/%s: not a broker entry", base, name)
            continue
        if side == "pub" and not node.is_master:
            continue
        raw = _data(client, f"{base}/{name}", watch)
        if raw is None:
            continue
        try:
            num = decode_topic_broker(raw).num_parts
        except ValueError as e:
            log.warning("ignoring %s/%s: %s", base, name, e)
            continue
        counts[node.broker_id] = max(counts.get(node.broker_id, 0), num)
        roles.setdefault(node.broker_id, []).append(node)
    brokers: dict[int, str] = {}
    for bid, nodes in roles.items():
        url = _broker_url(client, paths, nodes, watch, prefer_slaves)
        if url is not None:
            brokers[bid] = url
    ids = sorted(brokers if require_address else counts)
    parts = tuple(TopicPartition(topic, b, p) for b in ids for p in range(counts[b]))
    return TopicView(topic, parts, brokers)


def read_masters(client: Any, paths: ZkPaths) -> dict[int, str]:
    """Every broker id whose ``brokers/ids/<id>/master`` holds a valid ``meta://`` address."""
    out: dict[int, str] = {}
    for name in _children(client, paths.broker_ids, None):
        if not name.isdigit():
            continue
        raw = _data(client, paths.broker_master(int(name)), None)
        if raw is None:
            continue
        try:
            parse_meta_url(raw)
        except ValueError:
            continue
        out[int(name)] = raw.decode().strip()
    return out


def _broker_url(
    client: Any, paths: ZkPaths, nodes: list[BrokerNode], watch: Any, prefer_slaves: bool = False
) -> str | None:
    """Master first, then slaves by id (``prefer_slaves``: slaves by id, then the master): the
    first role with a valid ``meta://`` address."""
    last = 1 << 62  # the master's rank when slaves come first

    def rank(n: BrokerNode) -> int:
        if n.slave_id is None:
            return last if prefer_slaves else -1
        return n.slave_id

    for node in sorted(nodes, key=rank):
        raw = _data(client, paths.broker_role(node), watch)
        if raw is None:
            continue
        try:
            parse_meta_url(raw)
        except ValueError as e:
            log.warning("ignoring broker %s: %s", node.name, e)
            continue
        return raw.decode().strip()
    return None


def _children(client: Any, path: str, watch: Any) -> list[str]:
    """Children of ``path`` ([] if it does not exist; the watch then fires on its creation)."""
    from kazoo.exceptions import NoNodeError

    for _ in range(3):
        try:
            return list(client.get_children(path, watch=watch))
        except NoNodeError:
            if client.exists(path, watch=watch) is None:
                return []
    return []


def _data(client: Any, path: str, watch: Any) -> bytes | None:
    """The value of ``path`` (None if it does not exist; the watch fires on its creation)."""
    from kazoo.exceptions import NoNodeError

    for _ in range(3):
        try:
            raw, _stat = client.get(path, watch=watch)
            return bytes(raw)
        except NoNodeError:
            if client.exists(path, watch=watch) is None:
                return None
    return None


class BrokerDiscovery:
    """Follows topics in ``topics-pub`` or ``topics-sub`` (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        *,
        root: str = "/meta",
        side: Side = "pub",
        topics: Iterable[str] = (),
        on_change: Callable[[TopicView], None] | None = None,
        retry_delay_s: float = 1.0,
        prefer_slaves: bool = False,
    ) -> None:
        if side not in ("pub", "sub"):
            raise ValueError(f"side must be 'pub' or 'sub', got {side!r}")
        self.client = client
        self.paths = ZkPaths(root)
        self.side: Side = side
        self.prefer_slaves = prefer_slaves
        self.on_change = on_change
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._topics: set[str] = set()
        self._views: dict[str, TopicView] = {}
        self._loop = RefreshLoop(
            f"pymetaq-discovery-{side}", self._refresh, retry_delay_s=retry_delay_s
        )
        client.add_listener(self._on_state)
        for t in topics:
            self.add_topic(t)
        self._loop.start()

    # -- API --------------------------------------------------------------------------------
    def add_topic(self, topic: str) -> None:
        """Start following ``topic`` (idempotent; the first read happens on the thread)."""
        check_name("topic", topic)
        with self._lock:
            if topic in self._topics:
                return
            self._topics.add(topic)
        self._loop.wake()

    def view(self, topic: str) -> TopicView | None:
        """The latest view of ``topic``, or None before its first successful read."""
        with self._lock:
            return self._views.get(topic)

    def views(self) -> dict[str, TopicView]:
        with self._lock:
            return dict(self._views)

    def wait_view(
        self, topic: str, timeout: float, pred: Callable[[TopicView], bool] | None = None
    ) -> TopicView:
        """Block until ``topic`` has a view (satisfying ``pred``, e.g. ``lambda v:
        v.partitions``); :class:`ClusterUnavailable` after ``timeout`` seconds."""
        self.add_topic(topic)
        with self._changed:
            ok = self._changed.wait_for(
                lambda: (v := self._views.get(topic)) is not None and (pred is None or pred(v)),
                timeout,
            )
            if ok:
                return self._views[topic]
        raise ClusterUnavailable(
            f"no usable broker registration for topic {topic!r} under "
            f"{self.paths.topic_pub(topic) if self.side == 'pub' else self.paths.topic_sub(topic)}"
            f" within {timeout:g} s"
        )

    def close(self) -> None:
        self._loop.stop()
        self.client.remove_listener(self._on_state)

    # -- the thread ---------------------------------------------------------------------------
    def _on_state(self, state: str) -> None:
        self._loop.wake()  # re-read (and re-arm every watch) after any state change

    def _refresh(self) -> None:
        with self._lock:
            topics = sorted(self._topics)
        for topic in topics:
            view = read_topic(
                self.client,
                self.paths,
                topic,
                self.side,
                self._loop.wake,
                prefer_slaves=self.prefer_slaves,
            )
            with self._changed:
                old = self._views.get(topic)
                self._views[topic] = view
                self._changed.notify_all()
            if view != old:
                log.info(
                    "topic %s: %d partition(s) on broker(s) %s",
                    topic,
                    len(view.partitions),
                    ", ".join(f"{b}={u}" for b, u in sorted(view.brokers.items())) or "none",
                )
                if self.on_change is not None:
                    try:
                        self.on_change(view)
                    except Exception:
                        log.exception("discovery on_change callback failed for %s", topic)
