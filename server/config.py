"""The broker's configuration: MetaQ's ``server.ini`` as frozen dataclasses.

Sections (MetaQ 1.4, ``MetaConfig``/``TopicConfig``/``ZKConfig``): ``[system]``,
``[zookeeper]`` and one ``[topic=NAME]`` per topic.  NAME is a valid topic name
(:mod:`pymetaq.client.protocol.names`: ``[A-Za-z0-9._-]``, not ``.``/``..``, at most 200
characters) and may contain ``*``: any run of those characters (MetaQ's ``.*``, restricted so a
pattern never matches ``/`` or ``..``).  A topic is looked up by exact name first, then by the
first matching pattern in file order; unset topic keys inherit ``[system]``.

Validated at load, so a mistake stops startup with the file, line and key instead of failing
later: ``deleteWhen`` must parse (Quartz cron or ``every N[s|m|h|d]``) and fire at least once
(before, a bad one started and retention silently never ran); ``hostName`` must be empty, an IP
address or a host name that resolves (it is the listen address).

Every MetaQ key is accepted.  Keys that pymetaq reads today are *live*; the others are parsed,
validated and kept but *inert* until the feature that uses them lands (see ``INERT_KEYS``):
getProcessThreadCount, putProcessThreadCount, quartzThreadCount and
loadMessageStoresInParallel.  ``appClassPath`` and a topic's ``group.<name>=module:function``
are live: the server-side filters (:mod:`pymetaq.server.filters`).  The ``[zookeeper]``
keys are live: with
``zk.zkEnable=true`` the broker registers in ZooKeeper (:mod:`pymetaq.server.registry`).
hostName is used as the listen address (empty = 127.0.0.1 for the standalone broker).
``dashboardHttpPort`` (MetaQ's, default 8120) is the HTTP port of ``/metrics`` and the dashboard
(:mod:`pymetaq.server.http`); 0 turns it off.

pymetaq's own ``[system]`` keys (limits; units in the names):

| key                      | default   | meaning                                             |
|--------------------------|-----------|-----------------------------------------------------|
| maxConnections           | 1024      | connections beyond this are closed at accept        |
| maxConnectionsPerIp      | 256       | connections from one source IP beyond this are      |
|                          |           | closed at accept                                    |
| idleTimeoutMs            | 600000    | a connection silent this long is closed (0 = never) |
| requestTimeoutMs         | 30000     | a request whose line and body have not all arrived  |
|                          |           | this long after its first byte, or replies left     |
|                          |           | unread this long: the connection is closed (0 =     |
|                          |           | never)                                              |
| maxBufferedBodyBytes     | 268435456 | request bodies over 64 KiB being received, all      |
|                          |           | connections together; a connection waits (stops     |
|                          |           | reading) until there is room                        |
| maxAutoCreatedPartitions | 1000      | partitions that ``[topic=...*...]`` patterns may    |
|                          |           | create; a put that would create one more is         |
|                          |           | answered ``result 500``                             |
| maxLineLength            | 4096      | longest command line in bytes (else 400 and close)  |
| maxBatchSize             | 16777216  | largest ``bput`` body; a ``put`` body is bounded by |
|                          |           | ``maxTransferSize - 20`` so every record can be     |
|                          |           | fetched (a body over its limit: 400, discarded)     |
| minFreeDiskBytes         | 67108864  | puts are refused (500, nothing stored) while a data |
|                          |           | directory's filesystem has less free space (0 =     |
|                          |           | off); reads go on, puts resume once space is freed  |
| segmentWrites            | pwrite    | how appended bytes reach the active segment:        |
|                          |           | ``pwrite``, or ``mmap`` (stores through a shared    |
|                          |           | map of the segment); the same bytes on disk either  |
|                          |           | way, ``pwrite`` costs about half the CPU per stored |
|                          |           | message (:mod:`pymetaq.storage.disk`)               |
| producersSync            | auto      | how an idempotent producer's ``producers.idem``     |
|                          |           | entry is made durable before its ack (group         |
|                          |           | commit): ``auto`` writes it in place ahead of the   |
|                          |           | log's own flush on ext4 and XFS (one device flush   |
|                          |           | per round), ``fdatasync`` syncs the file beside the |
|                          |           | log (:mod:`pymetaq.storage.producers`)              |
| dashboardHttpHost        | 127.0.0.1 | the address ``dashboardHttpPort`` listens on        |
|                          |           | (loopback: only this host can scrape or browse; the |
|                          |           | reload button works only from loopback whatever it  |
|                          |           | is)                                                 |
| maxLagEntries            | 10000     | (group, topic, partition) positions the broker      |
|                          |           | tracks for ``stats lag``; past it the longest-idle  |
|                          |           | one is forgotten                                    |
| maxTxPerConnection       | 256       | open local transactions one connection may hold     |
| maxTxHeldBytes           | 67108864  | bytes of messages all open transactions may hold    |
| txJournalFileSize        | 67108864  | transaction journal file size (MetaQ's              |
|                          |           | ``-Dmeta.tx_journal_file_size``)                    |
| filterErrorPolicy        | skip      | a server-side filter that raises: ``skip`` the      |
|                          |           | message (MetaQ) or ``keep`` it (also per topic)     |
| filterTimeoutMs          | 1000      | bound on one get's filtering (also per topic); see  |
|                          |           | :mod:`pymetaq.server.filters`                       |
| maxRetention             | 168       | ``deletePolicy=consumed,...`` only: a closed segment|
|                          |           | older than this goes even if a group has not        |
|                          |           | consumed it (N[s|m|h], no unit = hours; 0 = no cap; |
|                          |           | also per topic)                                     |
| offsetStorage            | zk        | where consumed policies read committed offsets:     |
|                          |           | ``zk`` (the [zookeeper] ensemble and zkRoot) or     |
|                          |           | ``sql``; see :mod:`pymetaq.server.retention`        |
| offsetStorageUrl         | (empty)   | ``sql``: the SQLAlchemy URL                         |
| offsetStorageTable       | meta_topic_partition_group_offset | ``sql``: the table          |

``deletePolicy`` also takes ``consumed,<group>[+<group>...]|*[,min-age]`` (retention by
consumer progress, :mod:`pymetaq.storage.consumed`); a topic with it needs an offset store the
broker can read (``zk.zkEnable=true`` for ``zk``, ``offsetStorageUrl`` for ``sql``), checked
at load.

Transactions (MetaQ's keys, live): ``dataLogPath`` (the journal goes to
``<dataLogPath>/transactions``; default ``dataPath``), ``flushTxLogAtCommit`` (0/1/2),
``maxCheckpoints``, ``checkpointInterval`` (ms), ``maxTxTimeoutInSeconds`` (cap and default of
a transaction's timeout; 0 = none) and ``maxTxTimeoutTimerCapacity`` (open transactions per
broker); see docs/transactions.md.

Paths: a relative ``dataPath`` (and per-topic ``dataPath``) is resolved against the working
directory of the process that loads the file, ``~`` is expanded; the shipped
``conf/server.ini`` uses ``dataPath=data``.

Thread-safe: immutable values; loading is a pure function of the file.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import socket
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pymetaq.client.protocol.names import InvalidTopicName, topic_pattern
from pymetaq.client.protocol.zk import check_group
from pymetaq.server.errors import ConfigError
from pymetaq.server.ini import IniEntry, IniSection, did_you_mean, eval_int, parse_bool, parse_ini
from pymetaq.server.security.config import SecurityConfig, parse_security
from pymetaq.storage.config import WRITE_MODES, parse_delete_policy, parse_duration
from pymetaq.storage.cron import next_fire
from pymetaq.storage.producers import SYNC_MODES

_CPUS = os.cpu_count() or 1

# ini key -> (dataclass field, kind, default).  kind: "int" | "bool" | "str".
SYSTEM_KEYS: dict[str, tuple[str, str, Any]] = {
    "brokerId": ("broker_id", "int", 0),
    "hostName": ("host_name", "str", ""),
    "serverPort": ("server_port", "int", 8123),
    "dashboardHttpPort": ("dashboard_http_port", "int", 8120),
    "dataPath": ("data_path", "str", "~/meta"),
    "dataLogPath": ("data_log_path", "str", ""),
    "appClassPath": ("app_class_path", "str", ""),
    "numPartitions": ("num_partitions", "int", 1),
    "unflushThreshold": ("unflush_threshold", "int", 1000),
    "unflushInterval": ("unflush_interval_ms", "int", 10000),
    "maxSegmentSize": ("max_segment_size", "int", 1024 * 1024 * 1024),
    "maxTransferSize": ("max_transfer_size", "int", 1024 * 1024),
    "getProcessThreadCount": ("get_process_thread_count", "int", 10 * _CPUS),
    "putProcessThreadCount": ("put_process_thread_count", "int", 10 * _CPUS),
    "deletePolicy": ("delete_policy", "str", "delete,168"),
    "deleteWhen": ("delete_when", "str", "0 0 6,18 * * ?"),
    "quartzThreadCount": ("quartz_thread_count", "int", 5),
    "maxCheckpoints": ("max_checkpoints", "int", 3),
    "checkpointInterval": ("checkpoint_interval_ms", "int", 3600000),
    "maxTxTimeoutTimerCapacity": ("max_tx_timeout_timer_capacity", "int", 30000),
    "maxTxTimeoutInSeconds": ("max_tx_timeout_seconds", "int", 60),
    "flushTxLogAtCommit": ("flush_tx_log_at_commit", "int", 1),
    "acceptPublish": ("accept_publish", "bool", True),
    "acceptSubscribe": ("accept_subscribe", "bool", True),
    "stat": ("stat", "bool", False),
    "updateConsumerOffsets": ("update_consumer_offsets", "bool", False),
    "loadMessageStoresInParallel": ("load_message_stores_in_parallel", "bool", False),
    # pymetaq extensions
    "maxConnections": ("max_connections", "int", 1024),
    "idleTimeoutMs": ("idle_timeout_ms", "int", 600_000),
    "maxLineLength": ("max_line_length", "int", 4096),
    "maxBatchSize": ("max_batch_size", "int", 16 * 1024 * 1024),
    "maxConnectionsPerIp": ("max_connections_per_ip", "int", 256),
    "requestTimeoutMs": ("request_timeout_ms", "int", 30_000),
    "maxBufferedBodyBytes": ("max_buffered_body_bytes", "int", 256 * 1024 * 1024),
    "maxAutoCreatedPartitions": ("max_auto_created_partitions", "int", 1000),
    "minFreeDiskBytes": ("min_free_disk_bytes", "int", 64 * 1024 * 1024),
    "segmentWrites": ("segment_writes", "str", "pwrite"),
    "producersSync": ("producers_sync", "str", "auto"),
    "dashboardHttpHost": ("dashboard_http_host", "str", "127.0.0.1"),
    "maxLagEntries": ("max_lag_entries", "int", 10_000),
    "maxTxPerConnection": ("max_tx_per_connection", "int", 256),
    "maxTxHeldBytes": ("max_tx_held_bytes", "int", 64 * 1024 * 1024),
    "txJournalFileSize": ("tx_journal_file_size", "int", 64 * 1024 * 1024),
    "filterErrorPolicy": ("filter_error_policy", "str", "skip"),
    "filterTimeoutMs": ("filter_timeout_ms", "int", 1000),
    "maxRetention": ("max_retention", "str", "168"),
    "offsetStorage": ("offset_storage", "str", "zk"),
    "offsetStorageUrl": ("offset_storage_url", "str", ""),
    "offsetStorageTable": ("offset_storage_table", "str", "meta_topic_partition_group_offset"),
}

ZK_KEYS: dict[str, tuple[str, str, Any]] = {
    "zk.zkEnable": ("enabled", "bool", True),
    "zk.zkConnect": ("connect", "str", "localhost:2181"),
    "zk.zkSessionTimeoutMs": ("session_timeout_ms", "int", 30000),
    "zk.zkConnectionTimeoutMs": ("connection_timeout_ms", "int", 30000),
    "zk.zkSyncTimeMs": ("sync_time_ms", "int", 5000),
    "zk.zkRoot": ("root", "str", "/meta"),
}

#: keys a [topic=...] section may set; each inherits the [system] key of the same name.
TOPIC_KEYS: tuple[str, ...] = (
    "numPartitions",
    "stat",
    "deletePolicy",
    "deleteWhen",
    "dataPath",
    "unflushInterval",
    "unflushThreshold",
    "acceptSubscribe",
    "acceptPublish",
    "filterErrorPolicy",
    "filterTimeoutMs",
    "maxRetention",
)

INERT_KEYS: frozenset[str] = frozenset(
    {
        "getProcessThreadCount",
        "putProcessThreadCount",
        "quartzThreadCount",
        "loadMessageStoresInParallel",
    }
)


@dataclass(frozen=True)
class SystemConfig:
    """The ``[system]`` section (MetaQ's MetaConfig), values resolved."""

    broker_id: int = 0
    host_name: str = ""
    server_port: int = 8123
    dashboard_http_port: int = 8120
    data_path: str = "~/meta"
    data_log_path: str = ""
    app_class_path: str = ""
    num_partitions: int = 1
    unflush_threshold: int = 1000
    unflush_interval_ms: int = 10000
    max_segment_size: int = 1024 * 1024 * 1024
    max_transfer_size: int = 1024 * 1024
    get_process_thread_count: int = 10 * _CPUS
    put_process_thread_count: int = 10 * _CPUS
    delete_policy: str = "delete,168"
    delete_when: str = "0 0 6,18 * * ?"
    quartz_thread_count: int = 5
    max_checkpoints: int = 3
    checkpoint_interval_ms: int = 3600000
    max_tx_timeout_timer_capacity: int = 30000
    max_tx_timeout_seconds: int = 60
    flush_tx_log_at_commit: int = 1
    accept_publish: bool = True
    accept_subscribe: bool = True
    stat: bool = False
    update_consumer_offsets: bool = False
    load_message_stores_in_parallel: bool = False
    max_connections: int = 1024
    idle_timeout_ms: int = 600_000
    max_line_length: int = 4096
    max_batch_size: int = 16 * 1024 * 1024
    max_connections_per_ip: int = 256
    request_timeout_ms: int = 30_000
    max_buffered_body_bytes: int = 256 * 1024 * 1024
    max_auto_created_partitions: int = 1000
    min_free_disk_bytes: int = 64 * 1024 * 1024
    segment_writes: str = "pwrite"
    producers_sync: str = "auto"
    dashboard_http_host: str = "127.0.0.1"
    max_lag_entries: int = 10_000
    max_tx_per_connection: int = 256
    max_tx_held_bytes: int = 64 * 1024 * 1024
    tx_journal_file_size: int = 64 * 1024 * 1024
    filter_error_policy: str = "skip"
    filter_timeout_ms: int = 1000
    max_retention: str = "168"
    offset_storage: str = "zk"
    offset_storage_url: str = ""
    offset_storage_table: str = "meta_topic_partition_group_offset"

    @property
    def max_put_size(self) -> int:
        """The largest ``put`` data section: one record must fit in one transfer."""
        return self.max_transfer_size - 20


@dataclass(frozen=True)
class ZkConfig:
    """The ``[zookeeper]`` section (MetaQ's ZKConfig; see :mod:`pymetaq.server.registry`)."""

    enabled: bool = True
    connect: str = "localhost:2181"
    session_timeout_ms: int = 30000
    connection_timeout_ms: int = 30000
    sync_time_ms: int = 5000
    root: str = "/meta"


@dataclass(frozen=True)
class TopicConfig:
    """One ``[topic=NAME]`` section with [system] inheritance applied."""

    name: str
    num_partitions: int = 1
    stat: bool = False
    delete_policy: str = "delete,168"
    delete_when: str = "0 0 6,18 * * ?"
    data_path: str | None = None
    unflush_interval_ms: int = 10000
    unflush_threshold: int = 1000
    accept_subscribe: bool = True
    accept_publish: bool = True
    group_filters: tuple[tuple[str, str], ...] = ()
    filter_error_policy: str = "skip"
    filter_timeout_ms: int = 1000
    max_retention: str = "168"
    line: int = 0
    pattern: re.Pattern[str] = field(default=re.compile(""), compare=False, repr=False)

    @property
    def is_pattern(self) -> bool:
        return "*" in self.name

    def matches(self, topic: str) -> bool:
        return self.pattern.fullmatch(topic) is not None

    def store_config(self) -> Any:
        """This topic's slice for storage (a ``pymetaq.storage.TopicStoreConfig``)."""
        from pymetaq.storage import TopicStoreConfig

        return TopicStoreConfig(
            num_partitions=self.num_partitions,
            unflush_threshold=self.unflush_threshold,
            unflush_interval_ms=self.unflush_interval_ms,
            delete_policy=self.delete_policy,
            delete_when=self.delete_when,
            data_path=self.data_path,
            max_retention_seconds=parse_duration(self.max_retention),
        )

    @property
    def retains_until_consumed(self) -> bool:
        """``deletePolicy=consumed,...``: deletion waits for consumer groups' offsets."""
        return self.delete_policy.strip().lower().startswith("consumed")


@dataclass(frozen=True)
class BrokerConfig:
    """The whole file: sections, the raw text (``stats config``) and its CRC32 checksum."""

    system: SystemConfig = field(default_factory=SystemConfig)
    zookeeper: ZkConfig = field(default_factory=ZkConfig)
    topics: tuple[TopicConfig, ...] = ()
    path: str = "<string>"
    text: str = ""
    checksum: int = 0
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def topic_config(self, topic: str) -> TopicConfig | None:
        """The effective config of ``topic``: exact section, else first matching pattern."""
        for tc in self.topics:
            if not tc.is_pattern and tc.name == topic:
                return tc
        for tc in self.topics:
            if tc.is_pattern and tc.matches(topic):
                return tc
        return None

    def store_config(self) -> Any:
        """The broker-wide slice for storage (a ``pymetaq.storage.StoreConfig``)."""
        from pymetaq.storage import StoreConfig

        s = self.system
        return StoreConfig(
            data_path=s.data_path,
            broker_id=s.broker_id,
            max_segment_size=s.max_segment_size,
            max_transfer_size=s.max_transfer_size,
            min_free_disk_bytes=s.min_free_disk_bytes,
            segment_writes=s.segment_writes,
        )

    def with_system(self, **changes: Any) -> BrokerConfig:
        """A copy with some [system] fields replaced (tests: ``server_port=0``)."""
        return replace(self, system=replace(self.system, **changes))


def load_config(path: str | os.PathLike[str], *, cwd: str | None = None) -> BrokerConfig:
    """Read and validate a server.ini; raises :class:`ConfigError` naming file, line and key."""
    spath = os.fspath(path)
    try:
        with open(spath, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"{spath}: cannot read config file: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{spath}: config file is not UTF-8: {exc}") from exc
    return parse_config(text, spath, cwd=cwd)


def parse_config(text: str, path: str = "<string>", *, cwd: str | None = None) -> BrokerConfig:
    """Validate server.ini text; relative data paths are resolved against ``cwd`` (default: the
    process's working directory)."""
    base = cwd if cwd is not None else os.getcwd()
    sections = parse_ini(text, path)
    by_name = {s.name: s for s in sections}
    for s in sections:
        if s.name not in ("system", "zookeeper", "security", "anonymous") and not (
            s.name.startswith(("topic=", "user="))
        ):
            known = ["system", "zookeeper", "topic=NAME", "security", "user=NAME", "anonymous"]
            hint = did_you_mean(s.name, known)
            raise ConfigError(f"{path}:{s.line}: unknown section [{s.name}]{hint}")
    sys_values = _section_values(by_name.get("system"), SYSTEM_KEYS, path)
    system = SystemConfig(**sys_values)
    system = replace(system, data_path=_resolve(system.data_path, base))
    if not system.data_log_path:
        system = replace(system, data_log_path=system.data_path)
    else:
        system = replace(system, data_log_path=_resolve(system.data_log_path, base))
    _check_system(system, by_name.get("system"), path)
    zk = ZkConfig(**_section_values(by_name.get("zookeeper"), ZK_KEYS, path))
    if zk.enabled and not zk.connect:
        raise ConfigError(f"{path}: [zookeeper] zk.zkConnect is required when zk.zkEnable=true")
    topics = tuple(_topic(s, system, path, base) for s in sections if s.name.startswith("topic="))
    if not topics:
        raise ConfigError(f"{path}: no [topic=NAME] section; MetaQ requires at least one topic")
    _check_offset_storage(system, zk, topics, by_name.get("system"), path)
    security = parse_security(sections, path, base)
    checksum = zlib.crc32(text.encode("utf-8")) & 0xFFFFFFFF
    return BrokerConfig(system, zk, topics, path, text, checksum, security=security)


def _resolve(p: str, base: str) -> str:
    return os.path.normpath(os.path.join(base, os.path.expanduser(p)))


def _convert(entry: IniEntry, kind: str, section: str, path: str) -> Any:
    try:
        if kind == "int":
            return eval_int(entry.value)
        if kind == "bool":
            return parse_bool(entry.value)
        return entry.value
    except ValueError as exc:
        raise ConfigError(
            f"{path}:{entry.line}: bad value for '{entry.key}' in section [{section}]: {exc}"
        ) from exc


def _section_values(
    section: IniSection | None, keys: dict[str, tuple[str, str, Any]], path: str
) -> dict[str, Any]:
    values: dict[str, Any] = {attr: default for attr, _, default in keys.values()}
    if section is None:
        return values
    for entry in section.entries:
        if entry.key not in keys:
            hint = did_you_mean(entry.key, list(keys))
            raise ConfigError(
                f"{path}:{entry.line}: unknown key '{entry.key}' in section [{section.name}]{hint}"
            )
        attr, kind, _ = keys[entry.key]
        values[attr] = _convert(entry, kind, section.name, path)
    return values


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "brokerId": (lambda v: 0 <= v <= 1023, "must be 0..1023 (10 bits of the message id)"),
    "serverPort": (lambda v: 0 <= v <= 65535, "must be 0..65535 (0 = any free port)"),
    "numPartitions": (lambda v: v >= 1, "must be >= 1"),
    "filterErrorPolicy": (lambda v: v in ("skip", "keep"), "must be skip or keep"),
    "filterTimeoutMs": (lambda v: 1 <= v <= 60_000, "must be 1..60000 ms"),
    "unflushInterval": (lambda v: v >= 0, "must be >= 0 ms"),
    "maxSegmentSize": (lambda v: v >= 4096, "must be >= 4096 bytes"),
    "maxTransferSize": (lambda v: v >= 1024, "must be >= 1024 bytes"),
    "maxConnections": (lambda v: v >= 1, "must be >= 1"),
    "idleTimeoutMs": (lambda v: v >= 0, "must be >= 0 (0 = never)"),
    "maxLineLength": (lambda v: 256 <= v <= 1 << 20, "must be 256..1048576 bytes"),
    "maxBatchSize": (lambda v: v >= 1024, "must be >= 1024 bytes"),
    "maxConnectionsPerIp": (lambda v: v >= 1, "must be >= 1"),
    "requestTimeoutMs": (lambda v: v >= 0, "must be >= 0 (0 = never)"),
    "maxBufferedBodyBytes": (lambda v: v >= 1 << 20, "must be >= 1048576 bytes"),
    "maxAutoCreatedPartitions": (lambda v: v >= 0, "must be >= 0"),
    "minFreeDiskBytes": (lambda v: v >= 0, "must be >= 0 bytes (0 = no reserve)"),
    "segmentWrites": (lambda v: v in WRITE_MODES, "must be " + " or ".join(WRITE_MODES)),
    "producersSync": (lambda v: v in SYNC_MODES, "must be " + " or ".join(SYNC_MODES)),
    "dashboardHttpPort": (lambda v: 0 <= v <= 65535, "must be 0..65535 (0 = off)"),
    "dashboardHttpHost": (
        lambda v: bool(v) and _host_error(v) is None,
        "must be an IP address or a host name",
    ),
    "maxLagEntries": (lambda v: 1 <= v <= 10_000_000, "must be 1..10000000"),
    "deleteWhen": (lambda v: _schedule_error(v) is None, "must be a Quartz cron expression"),
    "hostName": (lambda v: _host_error(v) is None, "must be empty, an IP address or a host name"),
    "flushTxLogAtCommit": (
        lambda v: v in (0, 1, 2),
        "must be 0 (OS), 1 (fsync) or 2 (every second)",
    ),
    "maxCheckpoints": (lambda v: v >= 1, "must be >= 1"),
    "checkpointInterval": (lambda v: v >= 1000, "must be >= 1000 ms"),
    "maxTxTimeoutInSeconds": (lambda v: v >= 0, "must be >= 0 (0 = no timeouts)"),
    "maxTxTimeoutTimerCapacity": (lambda v: v >= 1, "must be >= 1"),
    "maxTxPerConnection": (lambda v: v >= 1, "must be >= 1"),
    "maxTxHeldBytes": (lambda v: v >= 1024, "must be >= 1024 bytes"),
    "txJournalFileSize": (lambda v: v >= 65536, "must be >= 65536 bytes"),
    "deletePolicy": (
        lambda v: _policy_error(v) is None,
        "must look like 'delete,168', 'archive,168,true' or 'consumed,<group>+<group>,1'",
    ),
    "maxRetention": (
        lambda v: _duration_error(v) is None,
        "must be an age N[s|m|h] (no unit: hours; 0 = no cap)",
    ),
    "offsetStorage": (lambda v: v in ("zk", "sql"), "must be zk or sql"),
    "offsetStorageTable": (
        lambda v: re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", v) is not None,
        "must be a SQL table name (letters, digits, '_'; at most 63)",
    ),
}


def _policy_error(text: str) -> str | None:
    """Why ``text`` is not a ``deletePolicy`` (MetaQ's forms or ``consumed,...``), or None."""
    try:
        policy = parse_delete_policy(text)
        for group in policy.groups or ():
            check_group(group)
    except ValueError as exc:
        return str(exc).removeprefix(f"bad deletePolicy {text!r}: ")
    return None


def _duration_error(text: str) -> str | None:
    try:
        parse_duration(text)
    except ValueError as exc:
        return str(exc)
    return None


def _schedule_error(expr: str) -> str | None:
    """Why ``expr`` cannot schedule retention (MetaQ's ``deleteWhen``), or None."""
    try:
        fire = next_fire(expr, dt.datetime.now())
    except ValueError as exc:
        return str(exc)
    return None if fire is not None else "it never fires"


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def _host_error(host: str) -> str | None:
    """Why ``host`` cannot be the listen address (``hostName``), or None."""
    if not host:
        return None
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(p) for p in host.rstrip(".").split(".")):
        return "not an IP address or a host name (RFC 1123)"
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"it does not resolve ({exc})"
    return None


_EXPLAIN: dict[str, Callable[[Any], str | None]] = {
    "deletePolicy": _policy_error,
    "maxRetention": _duration_error,
    "deleteWhen": _schedule_error,
    "hostName": _host_error,
    "dashboardHttpHost": _host_error,
}


def _check(key: str, value: Any, line: int, section: str, path: str) -> None:
    check = _CHECKS.get(key)
    if check is not None and not check[0](value):
        explain = _EXPLAIN.get(key)
        why = f" ({explain(value)})" if explain is not None else ""
        raise ConfigError(
            f"{path}:{line}: bad value for '{key}' in section [{section}]: {value!r} "
            f"{check[1]}{why}"
        )


def _check_system(system: SystemConfig, section: IniSection | None, path: str) -> None:
    lines = {e.key: e.line for e in section.entries} if section else {}
    for key, (attr, _, _) in SYSTEM_KEYS.items():
        _check(key, getattr(system, attr), lines.get(key, 0), "system", path)


def _check_offset_storage(
    system: SystemConfig,
    zk: ZkConfig,
    topics: tuple[TopicConfig, ...],
    section: IniSection | None,
    path: str,
) -> None:
    """``deletePolicy=consumed`` needs an offset store the broker can read."""
    lines = {e.key: e.line for e in section.entries} if section else {}
    url = system.offset_storage_url
    if url and not url.startswith(("sqlite", "postgresql")):
        raise ConfigError(
            f"{path}:{lines.get('offsetStorageUrl', 0)}: bad value for 'offsetStorageUrl' in "
            f"section [system]: {url!r} must be a SQLAlchemy URL (sqlite:///..., "
            "postgresql+psycopg://...)"
        )
    users = [t for t in topics if t.retains_until_consumed]
    if not users:
        return
    at = users[0].line
    where = f"[topic={users[0].name}] (line {at}) has deletePolicy=consumed"
    if system.delete_policy.strip().lower().startswith("consumed"):
        at = lines.get("deletePolicy", 0)
        where = "[system] has deletePolicy=consumed (every topic's default)"
    if system.offset_storage == "zk" and not zk.enabled:
        raise ConfigError(
            f"{path}:{at}: {where}, which reads the consumers' offsets from ZooKeeper "
            "(offsetStorage=zk), but [zookeeper] zk.zkEnable=false; enable ZooKeeper, or set "
            "offsetStorage=sql and offsetStorageUrl"
        )
    if system.offset_storage == "sql" and not url:
        raise ConfigError(
            f"{path}:{lines.get('offsetStorage', at)}: {where} with offsetStorage=sql, but "
            "offsetStorageUrl is empty; set it to the SQLAlchemy URL the consumers commit to"
        )


def _topic(section: IniSection, system: SystemConfig, path: str, base: str) -> TopicConfig:
    name = section.name[len("topic=") :].strip()
    try:
        pattern = topic_pattern(name)
    except InvalidTopicName as exc:
        raise ConfigError(
            f"{path}:{section.line}: bad topic name in [{section.name}]: {exc}"
        ) from exc
    values: dict[str, Any] = {}
    filters: list[tuple[str, str]] = []
    for entry in section.entries:
        if entry.key.startswith("group."):
            # kept as written (a MetaQ file names Java classes); checked when first used
            filters.append((entry.key[len("group.") :], entry.value.strip()))
            continue
        if entry.key not in TOPIC_KEYS:
            hint = did_you_mean(entry.key, [*TOPIC_KEYS, "group.<group>"])
            if entry.key in SYSTEM_KEYS:  # a real key in the wrong section: no look-alike
                hint = " (it is a [system]-only key)"
            raise ConfigError(
                f"{path}:{entry.line}: unknown key '{entry.key}' in section [{section.name}]{hint}"
            )
        attr, kind, _ = SYSTEM_KEYS[entry.key]
        value = _convert(entry, kind, section.name, path)
        _check(entry.key, value, entry.line, section.name, path)
        values[attr] = value
    data_path = values.get("data_path")
    return TopicConfig(
        name=name,
        num_partitions=values.get("num_partitions", system.num_partitions),
        stat=values.get("stat", system.stat),
        delete_policy=values.get("delete_policy", system.delete_policy),
        delete_when=values.get("delete_when", system.delete_when),
        data_path=_resolve(data_path, base) if data_path else None,
        unflush_interval_ms=values.get("unflush_interval_ms", system.unflush_interval_ms),
        unflush_threshold=values.get("unflush_threshold", system.unflush_threshold),
        accept_subscribe=values.get("accept_subscribe", system.accept_subscribe),
        accept_publish=values.get("accept_publish", system.accept_publish),
        group_filters=tuple(filters),
        filter_error_policy=values.get("filter_error_policy", system.filter_error_policy),
        filter_timeout_ms=values.get("filter_timeout_ms", system.filter_timeout_ms),
        max_retention=values.get("max_retention", system.max_retention),
        line=section.line,
        pattern=pattern,
    )
