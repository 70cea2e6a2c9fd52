"""The options of format ``pymetaq``: parsed and checked once, on the driver, before Spark
plans anything (pure Python: no PySpark import, unit-tested without Spark).

Option names are case-insensitive (Spark's are); every value is a string.

| option | side | meaning | default |
|---|---|---|---|
| ``pymetaq.servers`` | both | ``meta://host:port,...`` or ``zk://hosts/root`` | required |
| ``subscribe`` | read | comma-separated topics | one of three |
| ``subscribePattern`` | read | a regular expression over topic names (``re.fullmatch``) | one of three |
| ``assign`` | read | JSON ``{"topic": ["<brokerId>-<partition>", ...]}`` | one of three |
| ``startingOffsets`` | read | ``earliest``, ``latest`` or JSON per partition key | batch ``earliest``, stream ``latest`` |
| ``endingOffsets`` | batch read | ``latest`` or JSON per partition key (-1 = latest) | ``latest`` |
| ``failOnDataLoss`` | read | ``true``: raise when wanted offsets are gone (retention); ``false``: skip to the first stored one | ``true`` |
| ``minPartitions`` | batch read | split large ranges (at segment starts) into at least this many tasks | one task per partition |
| ``maxBytesPerTrigger`` | stream read | bytes of log per micro-batch (offsets are byte positions) | unlimited |
| ``maxOffsetsPerTrigger`` | stream read | stored records per micro-batch | unlimited |
| ``pymetaq.group`` | read | the group token of the executors' ``get`` requests (nothing is committed under it) | ``groupId``, else ``pymetaq-spark`` |
| ``groupId`` | stream read | a consumer group under which each finished micro-batch's end offsets are committed (advisory: ``pymetaq cluster``, ``pymetaq offsets``, lag monitoring; Spark's checkpoint stays the truth) | none: no commits |
| ``offsetStore`` | stream read | where ``groupId`` commits: ``zk://...``, ``file:<path>``, ``sqlite:///...``, ``postgresql+psycopg://...`` | ``zk://`` servers: their ZooKeeper; ``meta://``: the file store (``~/.pymetaq_offsets``) |
| ``pymetaq.fetchSize`` | read | bytes asked for per ``get`` | 1048576 |
| ``topic`` | write | the topic of rows without a ``topic`` column (or with a null one) | none |
| ``deliveryGuarantee`` | stream write | ``at-least-once`` or ``exactly-once`` (XA branches, see :mod:`pymetaq.spark.exactly_once`) | ``at-least-once`` |
| ``sinkStateDir`` | stream write | exactly-once: where the sink records its decisions | ``<checkpointLocation>/pymetaq-sink`` |

Thread-safety: immutable values and pure functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pymetaq.client.errors import InvalidConfig
from pymetaq.client.protocol.names import topic_name_error
from pymetaq.client.protocol.zk import check_group
from pymetaq.client.transport.servers import parse_servers, zk_servers

#: the group token of the executors' ``get``/``offset`` requests
DEFAULT_GROUP = "pymetaq-spark"
DEFAULT_FETCH_SIZE = 1 << 20
#: a partition key: ``"<brokerId>-<partition>"``
_KEY = re.compile(r"(0|[1-9][0-9]{0,8})-(0|[1-9][0-9]{0,8})")


class SparkOptionError(InvalidConfig):
    """An option of format ``pymetaq`` is missing or has a value it cannot take."""


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def check_key(key: str, what: str) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise SparkOptionError(f"{what}: {key!r} is not a partition key '<brokerId>-<partition>'")
    return key


def _topic(name: str, what: str) -> str:
    error = topic_name_error(name)
    if error is not None:
        raise SparkOptionError(f"{what}: {error}")
    return name


def servers_option(opts: Mapping[str, str]) -> str:
    servers = opts.get("pymetaq.servers", "").strip()
    if not servers:
        raise SparkOptionError(
            "option 'pymetaq.servers' is required: meta://host:port[,...] or zk://hosts/root"
        )
    if zk_servers(servers) is None:
        try:
            parse_servers(servers)
        except ValueError as e:
            raise SparkOptionError(f"option 'pymetaq.servers': {e}") from None
    return servers


def bool_option(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise SparkOptionError(f"option {name!r} must be 'true' or 'false', not {raw!r}")
    return value == "true"


def int_option(opts: Mapping[str, str], name: str, minimum: int = 1) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise SparkOptionError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum or value >= 1 << 63:
        raise SparkOptionError(f"option {name!r} must be >= {minimum}, not {value}")
    return value


@dataclass(frozen=True)
class Subscription:
    """Which partitions a read covers: ``topics`` (subscribe), ``pattern`` (subscribePattern)
    or ``assigned`` (assign: topic -> partition keys)."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assigned:
            return any(t == topic for t, _ in self.assigned)
        return topic in self.topics


def subscription_option(opts: Mapping[str, str]) -> Subscription:
    given = [n for n in ("subscribe", "subscribepattern", "assign") if n in opts]
    if len(given) != 1:
        raise SparkOptionError(
            "exactly one of the options 'subscribe', 'subscribePattern', 'assign' is required"
            + (f" (given: {', '.join(given)})" if given else "")
        )
    name = given[0]
    raw = opts[name]
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise SparkOptionError("option 'subscribe' names no topic")
        return Subscription(topics=tuple(_topic(t, "option 'subscribe'") for t in topics))
    if name == "subscribepattern":
        try:
            re.compile(raw)
        except re.error as e:
            raise SparkOptionError(f"option 'subscribePattern': bad regex {raw!r}: {e}") from None
        return Subscription(pattern=raw)
    doc = _json(raw, "assign")
    if not isinstance(doc, dict) or not doc:
        raise SparkOptionError('option \'assign\' must be JSON like {"topic": ["0-0", "0-1"]}')
    assigned = []
    for topic, keys in sorted(doc.items()):
        _topic(topic, "option 'assign'")
        if not isinstance(keys, list) or not keys:
            raise SparkOptionError(f"option 'assign': topic {topic!r} needs a list of keys")
        checked = sorted({check_key(k, "option 'assign'") for k in keys}, key=_key_order)
        assigned.append((topic, tuple(checked)))
    return Subscription(assigned=tuple(assigned))


def _key_order(key: str) -> tuple[int, int]:
    b, _, p = key.partition("-")
    return int(b), int(p)


def _json(raw: str, name: str) -> object:
    try:
        return json.loads(raw)
    except ValueError as e:
        raise SparkOptionError(f"option {name!r} is not valid JSON: {e}") from None


@dataclass(frozen=True)
class ReadOptions:
    servers: str
    subscription: Subscription
    #: "earliest" | "latest" | {topic: {key: offset}} (-2 earliest, -1 latest)
    starting: str | dict[str, dict[str, int]]
    ending: str | dict[str, dict[str, int]]
    fail_on_data_loss: bool
    min_partitions: int | None
    max_bytes_per_trigger: int | None
    max_offsets_per_trigger: int | None
    group: str
    fetch_size: int
    #: streaming: the consumer group the reader commits each batch's end under (advisory)
    group_id: str | None = None
    #: streaming: where ``group_id`` commits (None: the servers' ZooKeeper or the file store)
    offset_store: str | None = None


#: the offset stores ``offsetStore`` can name (see :func:`pymetaq.offsets.open_offset_store`)
_STORES = ("zk://", "file:", "sqlite:", "postgresql")


def group_options(opts: Mapping[str, str], *, streaming: bool) -> tuple[str | None, str | None]:
    """``groupId`` and ``offsetStore``, checked (streaming reads only)."""
    group_id, store = opts.get("groupid"), opts.get("offsetstore")
    if not streaming and (group_id is not None or store is not None):
        raise SparkOptionError(
            "options 'groupId' and 'offsetStore' are for streaming reads (a batch read commits "
            "nothing; 'pymetaq.group' names its gets)"
        )
    if group_id is not None:
        try:
            check_group(group_id.strip())
        except ValueError as e:
            raise SparkOptionError(f"option 'groupId': {e}") from None
        group_id = group_id.strip()
    if store is not None:
        store = store.strip()
        if group_id is None:
            raise SparkOptionError("option 'offsetStore' needs 'groupId' (the group to commit)")
        if not store.lower().startswith(_STORES):
            raise SparkOptionError(
                f"option 'offsetStore' must be zk://..., file:<path>, sqlite:///... or "
                f"postgresql+psycopg://..., not {store!r}"
            )
    return group_id, store


def read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Parse and check the read options (raises :class:`SparkOptionError`)."""
    from pymetaq.spark.offsets import parse_offsets_option

    opts = lower_keys(options)
    default_start = "latest" if streaming else "earliest"
    starting = parse_offsets_option(opts.get("startingoffsets", default_start), "startingOffsets")
    if streaming and "endingoffsets" in opts:
        raise SparkOptionError("option 'endingOffsets' is for batch reads only")
    ending = parse_offsets_option(opts.get("endingoffsets", "latest"), "endingOffsets")
    if ending == "earliest" or (isinstance(ending, dict) and _has(ending, -2)):
        raise SparkOptionError("option 'endingOffsets' cannot be earliest (-2)")
    if not streaming and (
        starting == "latest" or (isinstance(starting, dict) and _has(starting, -1))
    ):
        raise SparkOptionError("option 'startingOffsets' cannot be latest (-1) for a batch read")
    group_id, store = group_options(opts, streaming=streaming)
    group = opts.get("pymetaq.group", group_id or DEFAULT_GROUP).strip()
    if not group or any(c.isspace() for c in group):
        raise SparkOptionError(f"option 'pymetaq.group' {group!r} must be one word")
    fetch_size = int_option(opts, "pymetaq.fetchSize", 1024) or DEFAULT_FETCH_SIZE
    return ReadOptions(
        servers=servers_option(opts),
        subscription=subscription_option(opts),
        starting=starting,
        ending=ending,
        fail_on_data_loss=bool_option(opts, "failOnDataLoss", True),
        min_partitions=int_option(opts, "minPartitions"),
        max_bytes_per_trigger=int_option(opts, "maxBytesPerTrigger"),
        max_offsets_per_trigger=int_option(opts, "maxOffsetsPerTrigger"),
        group=group,
        fetch_size=fetch_size,
        group_id=group_id,
        offset_store=store,
    )


def _has(offsets: dict[str, dict[str, int]], value: int) -> bool:
    return any(v == value for parts in offsets.values() for v in parts.values())


@dataclass(frozen=True)
class WriteOptions:
    servers: str
    topic: str | None
    exactly_once: bool = False
    #: all options, lower-cased (the exactly-once sink reads checkpointLocation/sinkStateDir)
    raw: tuple[tuple[str, str], ...] = ()


GUARANTEES = ("at-least-once", "exactly-once")


def write_options(options: Mapping[str, str], *, streaming: bool = False) -> WriteOptions:
    opts = lower_keys(options)
    topic = opts.get("topic")
    if topic is not None:
        _topic(topic, "option 'topic'")
    guarantee = opts.get("deliveryguarantee", "at-least-once").strip().lower()
    if guarantee not in GUARANTEES:
        raise SparkOptionError(
            f"option 'deliveryGuarantee' must be 'at-least-once' or 'exactly-once', not {guarantee!r}"
        )
    if guarantee == "exactly-once" and not streaming:
        raise SparkOptionError(
            "deliveryGuarantee=exactly-once is for streaming writes (a batch write is one "
            "job: use a streaming query with trigger(availableNow=True) for exactly-once)"
        )
    return WriteOptions(
        servers=servers_option(opts),
        topic=topic,
        exactly_once=guarantee == "exactly-once",
        raw=tuple(sorted(opts.items())),
    )
