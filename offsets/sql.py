"""Offsets in a SQL table (SQLAlchemy 2 Core): SQLite (embedded default) or PostgreSQL.

The table follows MetaQ's MySQL offset storage, plus a unique key and a timestamp:

| column       | type          | meaning                                         |
|--------------|---------------|-------------------------------------------------|
| `id`         | bigint PK     | surrogate key (auto increment)                  |
| `topic`      | varchar(255)  | topic                                           |
| `partition`  | varchar(64)   | MetaQ's partition key `"<brokerId>-<partition>"`|
| `group_id`   | varchar(255)  | consumer group                                  |
| `offset`     | bigint        | next byte position to fetch                     |
| `msg_id`     | bigint        | id of the last consumed message (-1 unknown)    |
| `updated_at` | timestamp     | time of the last change                         |

UNIQUE (`topic`, `partition`, `group_id`).  A commit is one conditional upsert,
``INSERT … ON CONFLICT (topic, partition, group_id) DO UPDATE … WHERE offset < excluded.offset``,
so an offset never moves backwards and there is no read-modify-write: several processes may
commit to the same table at once.  Rows are written in key order so concurrent batches cannot
deadlock on PostgreSQL.  For SQLite the store's own engine uses WAL, ``synchronous=NORMAL``, a
30 s busy timeout and ``BEGIN IMMEDIATE`` (pysqlite's defaults lose updates across processes).

:meth:`SqlOffsetStore.commit_in` writes offsets inside the caller's own connection and
transaction: a consumer that stores its results in the same database commits the results and
the offsets atomically (exactly-once into the database).

Thread-safety: an SqlOffsetStore may be shared by threads (the engine's pool is thread-safe).
Never carry one across ``fork()``; create it in the child.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pymetaq.client.errors import MissingDependency

try:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection, Engine
except ImportError as exc:  # the ``sql`` extra is not installed
    raise MissingDependency("SqlOffsetStore", "SQLAlchemy", "sql") from exc

from pymetaq.offsets.base import (
    OffsetEntry,
    OffsetStoreError,
    OffsetStoreUnavailable,
    last_wins,
    newest,
)

TABLE_NAME = "meta_topic_partition_group_offset"
SQLITE_BUSY_TIMEOUT_S = 30.0

metadata = sa.MetaData()
offsets_table = sa.Table(
    TABLE_NAME,
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("topic", sa.String(255), nullable=False),
    sa.Column("partition", sa.String(64), nullable=False),
    sa.Column("group_id", sa.String(255), nullable=False),
    sa.Column("offset", sa.BigInteger, nullable=False),
    sa.Column("msg_id", sa.BigInteger, nullable=False, server_default=sa.text("-1")),
    sa.Column(
        "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.UniqueConstraint("topic", "partition", "group_id", name=f"uq_{TABLE_NAME}"),
)


def configure_sqlite(engine: Engine) -> Engine:
    """Make a SQLite engine safe for several processes: WAL, NORMAL sync, BEGIN IMMEDIATE.

    Call it on an engine before its first connection; use the result for business writes that
    share the database with the offsets, too.
    """

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def create_sqlite_engine(url: str) -> Engine:
    """A SQLite engine configured by :func:`configure_sqlite` with a 30 s busy timeout."""
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
    return configure_sqlite(engine)


def _engine_for(url: str) -> Engine:
    """The engine for a URL; a malformed URL is a ``ValueError``, a missing driver a
    :class:`MissingDependency` naming the extra."""
    try:
        return create_sqlite_engine(url) if url.startswith("sqlite") else sa.create_engine(url)
    except ModuleNotFoundError as e:  # the driver (psycopg for postgresql+psycopg://)
        scheme = url.split(":", 1)[0]
        raise MissingDependency(f"SqlOffsetStore on {scheme}", e.name or "its driver", "pg") from e
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as e:
        raise ValueError(f"bad offset store URL {url!r}: {e}") from e


def _insert(dialect: str) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert
    raise OffsetStoreError(f"unsupported SQL dialect {dialect!r} (sqlite, postgresql)")


def _upsert(
    conn: Connection, group: str, batch: dict[tuple[str, str], OffsetEntry], *, forward_only: bool
) -> None:
    if not batch:
        return
    t = offsets_table
    stmt = _insert(conn.dialect.name)(t)
    ex = stmt.excluded
    stmt = stmt.on_conflict_do_update(
        index_elements=[t.c.topic, t.c.partition, t.c.group_id],
        set_={"offset": ex.offset, "msg_id": ex.msg_id, "updated_at": sa.func.now()},
        where=(t.c.offset < ex.offset) if forward_only else None,
    )
    rows = [
        {
            "topic": e.topic,
            "partition": e.partition,
            "group_id": group,
            "offset": e.offset,
            "msg_id": e.msg_id,
        }
        for _key, e in sorted(batch.items())
    ]
    conn.execute(stmt, rows)


class SqlOffsetStore:
    """Offsets of every group in :data:`TABLE_NAME` (see the module docstring)."""

    def __init__(self, url: str | None = None, engine: Engine | None = None) -> None:
        if (url is None) == (engine is None):
            raise ValueError("give exactly one of url or engine")
        self._owns_engine = engine is None
        if engine is None:
            assert url is not None
            engine = _engine_for(url)
        self.engine = engine
        _insert(engine.dialect.name)  # fail early on an unsupported dialect
        self._create_table()

    def _create_table(self) -> None:
        try:
            metadata.create_all(self.engine, checkfirst=True)
        except sa.exc.DBAPIError as e:  # another process created it at the same moment
            if not sa.inspect(self.engine).has_table(TABLE_NAME):
                raise _wrap(e) from e

    def load(self, group: str, topic: str, partition: str) -> OffsetEntry | None:
        t = offsets_table
        q = sa.select(t.c.offset, t.c.msg_id).where(
            t.c.group_id == group, t.c.topic == topic, t.c.partition == partition
        )
        try:
            with self.engine.connect() as conn:
                row = conn.execute(q).first()
        except sa.exc.DBAPIError as e:
            raise _wrap(e) from e
        return None if row is None else OffsetEntry(topic, partition, row[0], row[1])

    def load_all(self, group: str) -> list[OffsetEntry]:
        t = offsets_table
        q = (
            sa.select(t.c.topic, t.c.partition, t.c.offset, t.c.msg_id)
            .where(t.c.group_id == group)
            .order_by(t.c.topic, t.c.partition)
        )
        try:
            with self.engine.connect() as conn:
                return [OffsetEntry(*row) for row in conn.execute(q)]
        except sa.exc.DBAPIError as e:
            raise _wrap(e) from e

    def commit(self, group: str, entries: Iterable[OffsetEntry]) -> None:
        """Store the entries that advance an offset, in one transaction of the store's own."""
        batch = newest(entries)
        try:
            with self.engine.begin() as conn:
                _upsert(conn, group, batch, forward_only=True)
        except sa.exc.DBAPIError as e:
            raise _wrap(e) from e

    def commit_in(self, connection: Connection, group: str, entries: Iterable[OffsetEntry]) -> None:
        """Write the entries inside the caller's connection and its open transaction.

        Nothing is committed here: the offsets become visible when, and only if, the caller
        commits its transaction; a rollback discards them with the caller's other rows.
        """
        _upsert(connection, group, newest(entries), forward_only=True)

    def reset(self, group: str, entries: Iterable[OffsetEntry]) -> None:
        """Set the given offsets exactly (they may move backwards)."""
        batch = last_wins(entries)
        try:
            with self.engine.begin() as conn:
                _upsert(conn, group, batch, forward_only=False)
        except sa.exc.DBAPIError as e:
            raise _wrap(e) from e

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()


def _wrap(e: sa.exc.DBAPIError) -> OffsetStoreError:
    if isinstance(e, sa.exc.OperationalError) or e.connection_invalidated:
        return OffsetStoreUnavailable(str(e))
    return OffsetStoreError(str(e))
