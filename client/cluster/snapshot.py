"""Everything registered in a MetaQ ZooKeeper tree, read once (for ``pymetaq cluster``).

:func:`read_cluster` walks ``brokers/ids``, ``brokers/topics-pub``/``topics-sub`` and
``consumers`` under a root and returns a :class:`ClusterSnapshot` of plain frozen dataclasses
(:meth:`ClusterSnapshot.to_dict` is JSON-ready).  Malformed values are kept as None rather than
failing the whole read: this is a diagnostic view.  Consumer lag needs each broker's max offset
and is computed by the caller from ``committed`` here and an ``offset``/``stats offsets`` query.

Nodes may change while they are read; each node is read once and a node deleted meanwhile is
skipped, so the snapshot is consistent per node, not across nodes.

Thread-safety: a pure read through a (thread-safe) kazoo client.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pymetaq.client.protocol.zk import (
    CHECKSUM_NODE,
    ZkPaths,
    decode_offset,
    decode_topic_broker,
    decode_topics,
    java_sort_key,
    parse_broker_node,
)


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: int
    master: str | None  # meta://host:port of the live master, None if none is registered
    slaves: dict[int, str] = field(default_factory=dict)
    config_checksum: str | None = None


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    #: broker id -> partitions published ("pub") / subscribable ("sub"), masters only
    publish: dict[int, int] = field(default_factory=dict)
    subscribe: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionState:
    topic: str
    partition: str  # "<brokerId>-<partition>"
    owner: str | None = None
    committed: int | None = None  # next byte offset to read
    msg_id: int | None = None


@dataclass(frozen=True)
class GroupInfo:
    group: str
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)  # consumerId -> topics
    partitions: tuple[PartitionState, ...] = ()


@dataclass(frozen=True)
class ClusterSnapshot:
    root: str
    brokers: tuple[BrokerInfo, ...] = ()
    topics: tuple[TopicInfo, ...] = ()
    groups: tuple[GroupInfo, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_cluster(client: Any, root: str = "/meta") -> ClusterSnapshot:
    """Read the whole registry under ``root`` now."""
    paths = ZkPaths(root)
    return ClusterSnapshot(
        root=paths.root or "/",
        brokers=tuple(_brokers(client, paths)),
        topics=tuple(_topics(client, paths)),
        groups=tuple(_group(client, paths, g) for g in _children(client, paths.consumers)),
    )


def _children(client: Any, path: str) -> list[str]:
    from kazoo.exceptions import NoNodeError

    try:
        return sorted(client.get_children(path), key=java_sort_key)
    except NoNodeError:
        return []


def _get(client: Any, path: str) -> bytes | None:
    from kazoo.exceptions import NoNodeError

    try:
        return bytes(client.get(path)[0])
    except NoNodeError:
        return None


def _brokers(client: Any, paths: ZkPaths) -> list[BrokerInfo]:
    out = []
    for name in _children(client, paths.broker_ids):
        if not name.isdigit():
            continue
        bid = int(name)
        master, slaves, checksum = None, {}, None
        for child in _children(client, paths.broker(bid)):
            raw = _get(client, f"{paths.broker(bid)}/{child}")
            if raw is None:
                continue
            value = raw.decode("utf-8", "replace")
            if child == "master":
                master = value
            elif child == CHECKSUM_NODE:
                checksum = value
            elif child.startswith("slave") and child[5:].isdigit():
                slaves[int(child[5:])] = value
        if master is not None or slaves:
            out.append(BrokerInfo(bid, master, slaves, checksum))
    return sorted(out, key=lambda b: b.broker_id)


def _side(client: Any, base: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for name in _children(client, base):
        try:
            node = parse_broker_node(name)
            raw = _get(client, f"{base}/{name}")
            if raw is None or not node.is_master:
                continue
            counts[node.broker_id] = decode_topic_broker(raw).num_parts
        except ValueError:
            continue
    return dict(sorted(counts.items()))


def _topics(client: Any, paths: ZkPaths) -> list[TopicInfo]:
    names = set(_children(client, paths.topics_pub_root))
    names |= set(_children(client, paths.topics_sub_root))
    out = []
    for t in sorted(names, key=java_sort_key):
        info = TopicInfo(t, _side(client, paths.topic_pub(t)), _side(client, paths.topic_sub(t)))
        if info.publish or info.subscribe:
            out.append(info)
    return out


def _group(client: Any, paths: ZkPaths, group: str) -> GroupInfo:
    ids = paths.consumer_ids(group)
    members = {c: decode_topics(_get(client, f"{ids}/{c}")) for c in _children(client, ids)}
    states: dict[tuple[str, str], dict[str, Any]] = {}
    for topic in _children(client, paths.owners(group)):
        for part in _children(client, paths.owners(group, topic)):
            raw = _get(client, f"{paths.owners(group, topic)}/{part}")
            if raw is not None:
                states.setdefault((topic, part), {})["owner"] = raw.decode("utf-8", "replace")
    for topic in _children(client, paths.offsets(group)):
        for part in _children(client, paths.offsets(group, topic)):
            raw = _get(client, f"{paths.offsets(group, topic)}/{part}")
            try:
                msg_id, offset = decode_offset(raw) if raw is not None else (None, None)
            except ValueError:
                msg_id, offset = None, None
            states.setdefault((topic, part), {}).update(committed=offset, msg_id=msg_id)
    parts = tuple(
        PartitionState(t, p, **v)
        for (t, p), v in sorted(states.items(), key=lambda kv: _part_key(*kv[0]))
    )
    return GroupInfo(group, members, parts)


def _part_key(topic: str, part: str) -> tuple[bytes, int, int]:
    b, _, p = part.partition("-")
    return (java_sort_key(topic), int(b) if b.isdigit() else -1, int(p) if p.isdigit() else -1)
