"""Where ``deletePolicy=consumed`` reads the consumer groups' committed offsets, and the
``stats retention`` item.

The offset store is the one the consumers commit to ([system] keys):

| key                  | default                            | meaning                          |
|----------------------|------------------------------------|----------------------------------|
| ``offsetStorage``    | ``zk``                             | ``zk``: MetaQ's ZooKeeper layout |
|                      |                                    | under the broker's ``zk.zkRoot`` |
|                      |                                    | (needs ``zk.zkEnable=true``);    |
|                      |                                    | ``sql``: a table                 |
| ``offsetStorageUrl`` | (empty)                            | ``sql``: the SQLAlchemy URL      |
|                      |                                    | (``postgresql+psycopg://...``,   |
|                      |                                    | ``sqlite:///...``)               |
| ``offsetStorageTable`` | ``meta_topic_partition_group_offset`` | ``sql``: the table         |

ZooKeeper: ``<zkRoot>/consumers/<group>/offsets/<topic>/<brokerId>-<partition>`` holding
``"<msgId>-<offset>"`` (or a bare ``"<offset>"``), read through the broker's registry session
(a broker that does not register, a gregor slave, opens its own).  SQL: the columns
``group_id``, ``topic``, ``partition`` (``"<brokerId>-<partition>"``) and ``offset`` of the
table :mod:`pymetaq.offsets.sql` writes.  ``*`` means the groups with at least one offset of
the topic (a ZooKeeper node ``consumers/<group>/offsets/<topic>``, a row of the topic).

Any failure to read (ZooKeeper disconnected, database down, table missing, a value that does
not parse) raises: retention then logs it and deletes nothing for consumption.

``stats retention``: one line per (topic, group) the ``maxRetention`` cap took unconsumed data
from: ``<topic> <group> unconsumed_segments N unconsumed_bytes N unconsumed_messages N`` (the
segments it removed before the group passed their end; the bytes and messages of them from
the group's committed offset, or all of them when it had none).

Thread-safety: ``committed`` runs on the store's retention thread; kazoo clients and
SQLAlchemy engines are thread-safe.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pymetaq.client.protocol import zk as layout
from pymetaq.server.config import BrokerConfig
from pymetaq.server.errors import StartupError

log = logging.getLogger(__name__)

STATS_HELP = "Returns what maxRetention removed before a group consumed it (pymetaq)."


class ZkProgress:
    """Committed offsets in MetaQ's ZooKeeper layout (see the module doc)."""

    def __init__(self, config: BrokerConfig, registry_fn: Any) -> None:
        self._paths = layout.ZkPaths(config.zookeeper.root)
        self._zk = config.zookeeper
        self._broker_id = config.system.broker_id
        self._registry_fn = registry_fn  # () -> the broker's BrokerRegistry, or None
        self._own: Any = None
        self._lock = threading.Lock()

    def _client(self) -> Any:
        registry = self._registry_fn()
        if registry is not None:
            return registry.client
        with self._lock:  # no registration (a gregor slave): a session of our own
            if self._own is None:
                from pymetaq.client.cluster.session import kazoo_client

                client = kazoo_client(self._zk.connect)
                client.start(timeout=self._zk.connection_timeout_ms / 1000)
                self._own = client
            return self._own

    def close(self) -> None:
        with self._lock:
            if self._own is not None:
                self._own.stop()
                self._own.close()
                self._own = None

    def committed(
        self, topic: str, partition: int, groups: tuple[str, ...] | None
    ) -> dict[str, int | None]:
        from kazoo.exceptions import NoNodeError

        client = self._client()
        if not client.connected:
            raise ConnectionError("not connected to ZooKeeper")
        key = layout.partition_name(self._broker_id, partition)
        if groups is None:
            try:
                everyone = client.get_children(self._paths.consumers)
            except NoNodeError:
                return {}
            groups = tuple(g for g in sorted(everyone) if client.exists(self._topic(g, topic)))
        out: dict[str, int | None] = {}
        for group in groups:
            try:
                raw, _stat = client.get(self._paths.offset(group, topic, key))
            except NoNodeError:
                out[group] = None
                continue
            out[group] = layout.decode_offset(raw)[1]
        return out

    def _topic(self, group: str, topic: str) -> str:
        return self._paths.offsets(group, topic)


class SqlProgress:
    """Committed offsets in the SQL offset table (see the module doc)."""

    def __init__(self, url: str, table: str, broker_id: int) -> None:
        try:
            import sqlalchemy as sa
        except ImportError as exc:
            raise StartupError(
                "offsetStorage=sql needs SQLAlchemy: pip install 'pymetaq[pg]' (or [sql])"
            ) from exc
        self._sa = sa
        self._url = url
        self._broker_id = broker_id
        self._table = sa.Table(
            table,
            sa.MetaData(),
            sa.Column("topic", sa.String(255)),
            sa.Column("partition", sa.String(64)),
            sa.Column("group_id", sa.String(255)),
            sa.Column("offset", sa.BigInteger),
        )
        self._engine: Any = None
        self._lock = threading.Lock()

    def _connect(self) -> Any:
        with self._lock:
            if self._engine is None:
                args = {"connect_timeout": 10} if self._url.startswith("postgresql") else {}
                self._engine = self._sa.create_engine(
                    self._url, connect_args=args, pool_pre_ping=True
                )
            return self._engine

    def committed(
        self, topic: str, partition: int, groups: tuple[str, ...] | None
    ) -> dict[str, int | None]:
        t = self._table
        key = layout.partition_name(self._broker_id, partition)
        q = self._sa.select(t.c.group_id, t.c.partition, t.c.offset).where(t.c.topic == topic)
        if groups is not None:
            q = q.where(t.c.group_id.in_(groups))
        with self._connect().connect() as conn:
            rows = conn.execute(q).all()
        out: dict[str, int | None] = dict.fromkeys(groups or sorted({r[0] for r in rows}))
        for group, part, offset in rows:
            if part == key:
                out[group] = int(offset)
        return out

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


def open_progress(broker: Any) -> ZkProgress | SqlProgress | None:
    """The offset source for the broker's config (None when no topic needs one)."""
    config: BrokerConfig = broker.config
    system = config.system
    if system.offset_storage == "sql":
        if not system.offset_storage_url:
            return None
        return SqlProgress(system.offset_storage_url, system.offset_storage_table, system.broker_id)
    if not config.zookeeper.enabled:
        return None
    return ZkProgress(config, lambda: broker.registry)


def stats_lines(broker: Any) -> list[str]:
    """``stats retention``: see the module doc."""
    lost = broker.store.metrics.snapshot().unconsumed_removed
    return [
        f"{topic} {group} unconsumed_segments {n} unconsumed_bytes {b} unconsumed_messages {m}"
        for (topic, group), (n, b, m) in sorted(lost.items())
    ]
