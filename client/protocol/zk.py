"""MetaQ's ZooKeeper layout as pure functions: paths, node names, values, ``zk://`` URLs.

Stdlib only, no I/O: the broker registry, producer discovery, the consumer-group coordinator
and the ZooKeeper offset store all build their paths and values here, so the layout lives in
one place.  The table (root ``/meta`` by default, MetaQ 1.4 ``MetaZookeeper``,
``BrokerZooKeeper``, ``ConsumerZooKeeper``):

| path (under the root)                         | kind                     | value                  |
|-----------------------------------------------|--------------------------|------------------------|
| ``brokers/ids/<id>``                          | persistent, data by      | ``meta://host:port``   |
|                                               | the master (blank: stop) |                        |
| ``brokers/ids/<id>/master``                   | ephemeral                | ``meta://host:port``   |
| ``brokers/ids/<id>/slave<n>``                 | ephemeral                | ``meta://host:port``   |
| ``brokers/ids/<id>/master_config_checksum``   | ephemeral                | CRC32 of server.ini    |
| ``brokers/ids/<id>/master_tls`` (pymetaq)     | ephemeral                | ``meta+tls://host:port`` |
| ``brokers/topics/<topic>/<id>-m`` (``-s<n>``) | ephemeral (legacy)       | partition count text   |
| ``brokers/topics-pub/<topic>/<id>-m``         | ephemeral, acceptPublish | TopicBroker JSON       |
| ``brokers/topics-sub/<topic>/<id>-m``         | ephemeral, acceptSubscr. | TopicBroker JSON       |
| ``consumers/<group>/ids/<consumerId>``        | ephemeral                | ``topic1,topic2``      |
| ``consumers/<group>/owners/<topic>/<b>-<p>``  | ephemeral                | consumerId             |
| ``consumers/<group>/offsets/<topic>/<b>-<p>`` | persistent               | ``<msgId>-<offset>``   |

TopicBroker JSON is exactly ``{"numParts":N,"broker":"<id>-m"}`` (Jackson's field order, no
spaces).  A partition is named ``"<brokerId>-<partition>"``; a broker's entry under a topic is
``"<brokerId>-m"`` (master) or ``"<brokerId>-s<slaveId>"`` (slave).  All values are UTF-8.

``zk://host:port[,host:port...][/root]``: the path is the registry root (MetaQ's
``zk.zkRoot``), ``/meta`` when absent; ``zk://h:2181/`` means the ZooKeeper root itself.

Names that become path components (topics, groups, consumer ids) are checked by
:func:`check_name` / :func:`check_group`; values read from ZooKeeper are parsed strictly and a
malformed one raises ``ValueError`` (callers skip the node and log it).

Ordering: MetaQ sorts consumer ids and partition names with Java's ``String.compareTo`` (UTF-16
code units); :func:`java_sort_key` reproduces it (it differs from Python's code-point order only
for characters outside the BMP).

Thread-safety: constants, frozen dataclasses and pure functions.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import NamedTuple

DEFAULT_ROOT = "/meta"
DEFAULT_PORT = 2181
ZK_SCHEME = "zk://"
META_SCHEME = "meta://"
META_TLS_SCHEME = "meta+tls://"
MASTER_SUFFIX = "m"
CHECKSUM_NODE = "master_config_checksum"
MAX_NAME_LENGTH = 255

#: characters MetaQ's ConsumerConfig rejects in a group name (plus space).
GROUP_FORBIDDEN = frozenset("~!#$%^&*()+=`'\",;/?[]<>.: ")

# ZooKeeper's PathUtils.validatePath rejects these code points in a path.
_ZK_BAD_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")
_BROKER_NODE = re.compile(r"(0|[1-9]\d{0,9})-(m|s(0|[1-9]\d{0,9}))")
_PARTITION = re.compile(r"(0|[1-9]\d{0,9})-(0|[1-9]\d{0,9})")


# --------------------------------------------------------------------------- names


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it can be one ZooKeeper path component, else raise ValueError."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"{kind} name longer than {MAX_NAME_LENGTH} characters: {name[:40]!r}...")
    if "/" in name or name in (".", "..") or _ZK_BAD_CHARS.search(name):
        raise ValueError(
            f"{kind} name {name!r} cannot be a ZooKeeper node name "
            "(no '/', not '.' or '..', no control characters)"
        )
    return name


def check_group(group: str) -> str:
    """A consumer group name as MetaQ accepts it (``ConsumerConfig.setGroup``)."""
    check_name("group", group)
    bad = sorted(set(group) & GROUP_FORBIDDEN)
    if bad:
        raise ValueError(
            f"group name {group!r} contains {''.join(bad)!r}; MetaQ forbids "
            f"{''.join(sorted(GROUP_FORBIDDEN))!r} and spaces in group names"
        )
    return group


def java_sort_key(s: str) -> bytes:
    """Sort key equal to Java's ``String.compareTo`` order (UTF-16 code units, unsigned)."""
    return s.encode("utf-16-be", "surrogatepass")


def java_utf8(s: str) -> bytes:
    """``String.getBytes("UTF-8")``: an unpaired surrogate becomes ``?`` as in Java."""
    return s.encode("utf-8", "replace")


class BrokerNode(NamedTuple):
    """A broker's entry under a topic: ``<id>-m`` (slave_id None) or ``<id>-s<n>``."""

    broker_id: int
    slave_id: int | None = None

    @property
    def name(self) -> str:
        return broker_node_name(self.broker_id, self.slave_id)

    @property
    def is_master(self) -> bool:
        return self.slave_id is None


def broker_node_name(broker_id: int, slave_id: int | None = None) -> str:
    """``"<id>-m"`` or ``"<id>-s<slaveId>"``."""
    if broker_id < 0 or (slave_id is not None and slave_id < 0):
        raise ValueError(f"negative broker or slave id: {broker_id}, {slave_id}")
    return f"{broker_id}-m" if slave_id is None else f"{broker_id}-s{slave_id}"


def parse_broker_node(name: str) -> BrokerNode:
    """``"3-m"`` -> BrokerNode(3, None); ``"3-s1"`` -> BrokerNode(3, 1); else ValueError."""
    m = _BROKER_NODE.fullmatch(name)
    if m is None:
        raise ValueError(f"not a broker node name ('<id>-m' or '<id>-s<n>'): {name!r}")
    slave = m.group(3)
    return BrokerNode(int(m.group(1)), None if slave is None else int(slave))


def partition_name(broker_id: int, partition: int) -> str:
    """MetaQ's partition string ``"<brokerId>-<partition>"``."""
    if broker_id < 0 or partition < 0:
        raise ValueError(f"negative broker id or partition: {broker_id}-{partition}")
    return f"{broker_id}-{partition}"


def parse_partition_name(name: str) -> tuple[int, int]:
    """``"<brokerId>-<partition>"`` -> (brokerId, partition); ValueError if malformed."""
    m = _PARTITION.fullmatch(name)
    if m is None:
        raise ValueError(f"partition must be '<brokerId>-<partition>', got {name!r}")
    return int(m.group(1)), int(m.group(2))


# --------------------------------------------------------------------------- values


def meta_url(host: str, port: int) -> str:
    """A broker's address as MetaQ registers it: ``meta://host:port``."""
    if not host or not 0 < port < 65536:
        raise ValueError(f"bad broker address {host!r}:{port}")
    return f"{META_SCHEME}{host}:{port}"


def parse_meta_url(value: str | bytes) -> tuple[str, int]:
    """``meta://host:port`` (or pymetaq's ``meta+tls://host:port``) -> (host, port); ValueError
    otherwise."""
    text = value.decode("utf-8") if isinstance(value, bytes) else value
    text = text.strip()
    scheme = META_TLS_SCHEME if text.startswith(META_TLS_SCHEME) else META_SCHEME
    if not text.startswith(scheme):
        raise ValueError(f"not a meta:// address: {text!r}")
    host, sep, port = text[len(scheme) :].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad meta:// address: {text!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class TopicBroker:
    """The value of a ``topics-pub``/``topics-sub`` entry."""

    num_parts: int
    broker: str  # "<id>-m" / "<id>-s<n>"

    def encode(self) -> bytes:
        """Exactly ``{"numParts":N,"broker":"<id>-m"}`` (MetaQ's TopicBroker.toJson)."""
        return json.dumps(
            {"numParts": self.num_parts, "broker": self.broker}, separators=(",", ":")
        ).encode()

    @property
    def node(self) -> BrokerNode:
        return parse_broker_node(self.broker)


def decode_topic_broker(raw: bytes) -> TopicBroker:
    """Parse a TopicBroker JSON value; ValueError if it is not one."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not TopicBroker JSON: {raw[:80]!r}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"not TopicBroker JSON: {raw[:80]!r}")
    n, broker = obj.get("numParts"), obj.get("broker")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(broker, str):
        raise ValueError(f"bad TopicBroker value: {raw[:80]!r}")
    parse_broker_node(broker)
    return TopicBroker(n, broker)


def encode_partition_count(num_parts: int) -> bytes:
    """The legacy ``brokers/topics/<topic>/<id>-m`` value: the count as decimal text."""
    return str(int(num_parts)).encode()


def decode_partition_count(raw: bytes) -> int:
    text = raw.decode("utf-8", "replace").strip()
    if not text.isdigit():
        raise ValueError(f"bad partition count {text!r}")
    return int(text)


def encode_offset(msg_id: int, offset: int) -> bytes:
    """``"<lastMsgId>-<offset>"`` (msgId -1 when unknown: ``"-1-1024"``)."""
    return f"{msg_id}-{offset}".encode()


def decode_offset(raw: bytes) -> tuple[int, int]:
    """``b"<msgId>-<offset>"`` or pre-1.4 ``b"<offset>"`` -> (msg_id, offset), split at the
    last ``-``; ValueError if malformed."""
    text = raw.decode("utf-8").strip()
    head, sep, tail = text.rpartition("-")
    if not sep or not head:  # legacy "<offset>" (or a bare negative number)
        return -1, int(text)
    return int(head), int(tail)


def encode_topics(topics: list[str] | tuple[str, ...]) -> bytes:
    """A consumer's ids-node value: its topics joined by ``,``."""
    return ",".join(topics).encode()


def decode_topics(raw: bytes | None) -> tuple[str, ...]:
    if not raw:
        return ()
    return tuple(t.strip() for t in raw.decode("utf-8", "replace").split(",") if t.strip())


# --------------------------------------------------------------------------- paths


@dataclass(frozen=True)
class ZkPaths:
    """Every path of the layout under one root (``/meta`` unless configured)."""

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", normalize_root(self.root))

    def _p(self, *parts: str) -> str:
        return self.root + "/" + "/".join(parts)

    # brokers
    @property
    def broker_ids(self) -> str:
        return self._p("brokers", "ids")

    def broker(self, broker_id: int) -> str:
        return self._p("brokers", "ids", str(broker_id))

    def broker_master(self, broker_id: int) -> str:
        return self._p("brokers", "ids", str(broker_id), "master")

    def broker_master_tls(self, broker_id: int) -> str:
        """pymetaq: the master's TLS listener, ``meta+tls://host:port`` (MetaQ reads only
        ``master`` and ``slave<n>`` children, so it ignores this node)."""
        return self._p("brokers", "ids", str(broker_id), "master_tls")

    def broker_slave(self, broker_id: int, slave_id: int) -> str:
        return self._p("brokers", "ids", str(broker_id), f"slave{slave_id}")

    def broker_role(self, node: BrokerNode) -> str:
        """The URL node of ``node``'s role: ``.../master`` or ``.../slave<n>``."""
        if node.slave_id is None:
            return self.broker_master(node.broker_id)
        return self.broker_slave(node.broker_id, node.slave_id)

    def broker_checksum(self, broker_id: int) -> str:
        return self._p("brokers", "ids", str(broker_id), CHECKSUM_NODE)

    @property
    def topics_legacy_root(self) -> str:
        return self._p("brokers", "topics")

    @property
    def topics_pub_root(self) -> str:
        return self._p("brokers", "topics-pub")

    @property
    def topics_sub_root(self) -> str:
        return self._p("brokers", "topics-sub")

    def topic_legacy(self, topic: str, node: str = "") -> str:
        return self._join(self.topics_legacy_root, check_name("topic", topic), node)

    def topic_pub(self, topic: str, node: str = "") -> str:
        return self._join(self.topics_pub_root, check_name("topic", topic), node)

    def topic_sub(self, topic: str, node: str = "") -> str:
        return self._join(self.topics_sub_root, check_name("topic", topic), node)

    # consumers
    @property
    def consumers(self) -> str:
        return self._p("consumers")

    def group(self, group: str) -> str:
        return self._p("consumers", check_name("group", group))

    def consumer_ids(self, group: str) -> str:
        return self.group(group) + "/ids"

    def consumer_id(self, group: str, consumer_id: str) -> str:
        return self.consumer_ids(group) + "/" + check_name("consumer id", consumer_id)

    def owners(self, group: str, topic: str = "") -> str:
        return self._join(self.group(group) + "/owners", topic and check_name("topic", topic))

    def owner(self, group: str, topic: str, partition: str) -> str:
        parse_partition_name(partition)
        return self.owners(group, topic) + "/" + partition

    def offsets(self, group: str, topic: str = "") -> str:
        return self._join(self.group(group) + "/offsets", topic and check_name("topic", topic))

    def offset(self, group: str, topic: str, partition: str) -> str:
        return self.offsets(group, topic) + "/" + check_name("partition", partition)

    @staticmethod
    def _join(base: str, *parts: str) -> str:
        return "/".join([base, *(p for p in parts if p)])


def normalize_root(root: str) -> str:
    """``"/meta/"`` -> ``"/meta"``; ``"/"`` or ``""`` -> ``""`` (paths then start ``/brokers``)."""
    r = root.strip()
    if r and not r.startswith("/"):
        raise ValueError(f"ZooKeeper root must start with '/': {root!r}")
    r = r.rstrip("/")
    for part in r.split("/")[1:]:
        check_name("root path", part)
    return r


# --------------------------------------------------------------------------- zk:// URLs


@dataclass(frozen=True)
class ZkUrl:
    """A parsed ``zk://host:port[,host:port][/root]``."""

    hosts: str  # kazoo/ZooKeeper connect string without chroot: "h1:2181,h2:2181"
    root: str = DEFAULT_ROOT  # normalized ("" for the ZooKeeper root)

    @property
    def paths(self) -> ZkPaths:
        return ZkPaths(self.root)

    def __str__(self) -> str:
        return f"{ZK_SCHEME}{self.hosts}{self.root or '/'}"


def is_zk_url(servers: str) -> bool:
    return servers.strip().lower().startswith(ZK_SCHEME)


def parse_zk_url(url: str) -> ZkUrl:
    """Parse and validate a ``zk://`` URL; ValueError names what is wrong."""
    text = url.strip()
    if not text.lower().startswith(ZK_SCHEME):
        raise ValueError(f"not a zk:// URL: {url!r}")
    rest = text[len(ZK_SCHEME) :]
    slash = rest.find("/")
    host_part, root = (rest, None) if slash < 0 else (rest[:slash], rest[slash:])
    if not host_part:
        raise ValueError(f"zk:// URL without hosts: {url!r} (zk://host:port[,host:port][/root])")
    hosts = [_host_port(h.strip(), url) for h in host_part.split(",")]
    return ZkUrl(",".join(hosts), DEFAULT_ROOT if root is None else normalize_root(root))


def _host_port(item: str, url: str) -> str:
    if item.startswith("["):  # [ipv6]:port
        end = item.find("]")
        if end < 0:
            raise ValueError(f"bad IPv6 host {item!r} in {url!r}")
        host, port = item[: end + 1], item[end + 1 :].removeprefix(":")
        if item[end + 1 : end + 2] not in ("", ":"):
            raise ValueError(f"bad host {item!r} in {url!r}")
    else:
        host, _, port = item.partition(":")
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"empty or bad host {item!r} in {url!r}")
    if not port:
        return f"{host}:{DEFAULT_PORT}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port {port!r} in {url!r}")
    return f"{host}:{int(port)}"
