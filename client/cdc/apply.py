"""The apply side: CDC messages from a topic applied to a replica database through SQLAlchemy,
exactly once.

```python
app = Applier(ApplyConfig(target="sqlite:///replica.db", topic="cdc-shop", group="replica"),
              "meta://127.0.0.1:8123")
app.run()      # until app.stop(); run(idle_timeout_s=5) returns after 5 s without messages
```

* **Whole transactions.** The messages of a source transaction (its parts) are applied in one
  replica transaction, together with — in that same transaction — the consumer offset
  (``SqlOffsetStore.commit_in``, table ``meta_topic_partition_group_offset`` in the replica)
  and the partition's LSN watermark (table ``pymetaq_cdc_applied``). Several whole source
  transactions may share one replica transaction (up to ``batch_transactions``); a reader of
  the replica only ever sees the state after some source commit.
* **Exactly once.** A crash before the replica commit leaves offset and rows as they were
  (the messages come again); after it, both moved. A transaction the capture published twice
  (it crashed after the ack, before the slot advanced) has an LSN at or below the watermark and
  is skipped.
* **Rows.** Tables are matched by name in the replica's default schema (the source schema is
  dropped); they must exist (logical decoding carries no DDL). INSERT inserts, UPDATE and
  DELETE address the row by the key the change carries, else by the replica table's primary
  key. A change the replica cannot take (a row that is missing or already there, a column it
  lacks) raises :class:`ReplicaDiverged` and nothing of that batch is committed.
* Values are converted to the replica column's Python type (``Decimal``, dates and times,
  ``bytes`` from ``\\x..`` hex, JSON) from the text PostgreSQL printed.

Thread-safety: ``run`` on one thread; ``stop`` from any thread or a signal handler.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymetaq.client.cdc.decoding import Change, Transaction
from pymetaq.client.cdc.message import Part, decode_all, join
from pymetaq.client.errors import MetaClientError, MissingDependency

try:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection, Engine
except ImportError as exc:  # pragma: no cover - depends on the install
    raise MissingDependency("pymetaq cdc apply", "SQLAlchemy", "sql") from exc

log = logging.getLogger("pymetaq.cdc")

WATERMARK_TABLE = "pymetaq_cdc_applied"
_meta = sa.MetaData()
watermarks = sa.Table(
    WATERMARK_TABLE,
    _meta,
    sa.Column("topic", sa.String(255), primary_key=True),
    sa.Column("partition", sa.String(64), primary_key=True),
    sa.Column("lsn", sa.BigInteger, nullable=False),
    sa.Column("xid", sa.BigInteger, nullable=False),
)


class ReplicaDiverged(MetaClientError):
    """A change does not fit the replica (see the module docstring); nothing was applied."""


@dataclass(frozen=True)
class ApplyConfig:
    target: str  # SQLAlchemy URL of the replica (sqlite:///replica.db, postgresql+psycopg://...)
    topic: str
    group: str
    batch_transactions: int = 500


@dataclass
class ApplyStats:
    transactions: int = 0
    changes: int = 0
    duplicates: int = 0
    #: seconds from each applied transaction's source commit to its replica commit
    delays: list[float] = field(default_factory=list)


def target_engine(url: str) -> Engine:
    """The replica's engine; SQLite as the offset store sets it up (WAL, BEGIN IMMEDIATE),
    with foreign keys enforced."""
    if url.startswith("sqlite"):
        from pymetaq.offsets.sql import create_sqlite_engine

        engine = create_sqlite_engine(url)

        @sa.event.listens_for(engine, "connect")
        def _fk_on(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA foreign_keys=ON")

        return engine
    try:
        return sa.create_engine(url)
    except ModuleNotFoundError as e:  # the driver (psycopg for postgresql+psycopg://)
        raise MissingDependency("pymetaq cdc apply", e.name or "its driver", "pg") from e


def _coerce(value: Any, column: sa.Column[Any]) -> Any:
    if value is None or not isinstance(value, str):
        return value
    try:
        kind = column.type.python_type
    except NotImplementedError:
        return value
    if kind is str:
        return value
    if kind is decimal.Decimal:
        return decimal.Decimal(value)
    if kind is dt.datetime:
        return dt.datetime.fromisoformat(value)
    if kind is dt.date:
        return dt.date.fromisoformat(value)
    if kind is dt.time:
        return dt.time.fromisoformat(value)
    if kind is bytes and value.startswith("\\x"):
        return bytes.fromhex(value[2:])
    if kind in (dict, list):
        return json.loads(value)
    if kind in (int, float):
        return kind(value)
    return value


def _commit_seconds(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class _Tables:
    """The replica's tables, reflected once each."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._md = sa.MetaData()
        self._cache: dict[str, sa.Table] = {}

    def get(self, conn: Connection, qualified: str) -> sa.Table:
        name = qualified.rpartition(".")[2]
        t = self._cache.get(name)
        if t is None:
            try:
                t = sa.Table(name, self._md, autoload_with=conn)
            except sa.exc.NoSuchTableError:
                raise ReplicaDiverged(
                    f"the replica has no table {name!r} (source {qualified}): create it first"
                ) from None
            self._cache[name] = t
        return t


class Applier:
    """Topic -> replica (see the module docstring)."""

    def __init__(self, config: ApplyConfig, servers: str, **consumer_overrides: Any) -> None:
        from pymetaq.offsets.sql import SqlOffsetStore

        self.config = config
        self.servers = servers
        self.engine = target_engine(config.target)
        _meta.create_all(self.engine, checkfirst=True)
        self.store = SqlOffsetStore(engine=self.engine)
        self.stats = ApplyStats()
        self._tables = _Tables(self.engine)
        self._parts: dict[str, list[Part]] = {}
        self._overrides = consumer_overrides
        self._stop = threading.Event()
        #: called after each replica commit with the source transactions it applied
        self.on_applied: Callable[[list[Transaction]], None] | None = None

    # -- rows ---------------------------------------------------------------------------

    def _where(self, t: sa.Table, change: Change) -> Any:
        key = change.key
        if key is None:
            pk = [c.name for c in t.primary_key.columns]
            if not pk or change.row is None:
                raise ReplicaDiverged(f"{t.name} has no primary key to address {change.op}s by")
            key = {k: change.row.get(k) for k in pk}
        return sa.and_(*(t.c[k] == _coerce(v, t.c[k]) for k, v in key.items()))

    def _values(self, t: sa.Table, row: dict[str, Any]) -> dict[str, Any]:
        missing = [k for k in row if k not in t.c]
        if missing:
            raise ReplicaDiverged(f"the replica table {t.name} has no column {missing[0]!r}")
        return {k: _coerce(v, t.c[k]) for k, v in row.items()}

    def _apply_changes(self, conn: Connection, changes: Sequence[Change]) -> None:
        """In order; a run of inserts into one table with the same columns is one
        ``executemany`` (one round trip on PostgreSQL)."""
        run: list[Change] = []
        for c in changes:
            if run and not (
                c.op == "insert" and c.table == run[0].table and c.row.keys() == run[0].row.keys()  # type: ignore[union-attr]
            ):
                self._insert_many(conn, run)
                run = []
            if c.op == "insert":
                run.append(c)
            else:
                self._apply_change(conn, c)
        if run:
            self._insert_many(conn, run)

    def _insert_many(self, conn: Connection, run: list[Change]) -> None:
        if len(run) == 1:
            self._apply_change(conn, run[0])
            return
        t = self._tables.get(conn, run[0].table)
        rows = [self._values(t, c.row) for c in run if c.row is not None]
        try:
            conn.execute(t.insert(), rows)
        except sa.exc.IntegrityError as e:
            raise ReplicaDiverged(f"insert of {t.name} refused: {e.orig}") from None

    def _apply_change(self, conn: Connection, c: Change) -> None:
        if c.op == "truncate":
            for name in c.tables:
                conn.execute(self._tables.get(conn, name).delete())
            return
        t = self._tables.get(conn, c.table)
        try:
            self._write_row(conn, t, c)
        except sa.exc.IntegrityError as e:
            raise ReplicaDiverged(f"{c.op} of {t.name} refused: {e.orig}") from None

    def _write_row(self, conn: Connection, t: sa.Table, c: Change) -> None:
        if c.op == "insert":
            assert c.row is not None
            conn.execute(t.insert().values(self._values(t, c.row)))
            return
        stmt: sa.Update | sa.Delete
        if c.op == "update":
            assert c.row is not None
            stmt = t.update().where(self._where(t, c)).values(self._values(t, c.row))
        elif c.op == "delete":
            stmt = t.delete().where(self._where(t, c))
        else:
            raise ReplicaDiverged(f"unknown change {c.op!r}")
        n = conn.execute(stmt).rowcount
        if n != 1:
            raise ReplicaDiverged(f"{c.op} of {t.name} {c.key or c.row} matched {n} rows")

    # -- transactions --------------------------------------------------------------------

    def _watermark(self, conn: Connection, partition: str) -> int:
        w = watermarks
        q = sa.select(w.c.lsn).where(w.c.topic == self.config.topic, w.c.partition == partition)
        lsn = conn.execute(q).scalar()
        return -1 if lsn is None else int(lsn)

    def _set_watermark(self, conn: Connection, partition: str, tx: Transaction, old: int) -> None:
        w = watermarks
        row = {"lsn": tx.lsn, "xid": tx.xid}
        if old < 0:
            conn.execute(w.insert().values(topic=self.config.topic, partition=partition, **row))
        else:
            cond = sa.and_(w.c.topic == self.config.topic, w.c.partition == partition)
            conn.execute(w.update().where(cond).values(**row))

    def apply(self, ready: Sequence[tuple[str, Transaction, Any]]) -> list[Transaction]:
        """Apply whole transactions ``(partition key, tx, last message)`` in one replica
        transaction with their offsets; the ones applied (duplicates left out)."""
        from pymetaq.client.consumer import offset_entry

        applied: list[Transaction] = []
        with self.engine.begin() as conn:
            marks: dict[str, tuple[int, Transaction | None]] = {}
            for pkey, tx, _ in ready:
                if pkey not in marks:
                    marks[pkey] = (self._watermark(conn, pkey), None)
                stored, top = marks[pkey]
                if tx.lsn <= (stored if top is None else top.lsn):
                    self.stats.duplicates += 1
                    continue
                self._apply_changes(conn, tx.changes)
                marks[pkey] = (stored, tx)
                applied.append(tx)
            for pkey, (stored, top) in marks.items():
                if top is not None:
                    self._set_watermark(conn, pkey, top, stored)
            self.store.commit_in(
                conn, self.config.group, [offset_entry(m) for _, _, m in ready if m is not None]
            )
        now = time.time()
        for tx in applied:
            t0 = _commit_seconds(tx.commit_time)
            if t0 is not None:
                self.stats.delays.append(now - t0)
        self.stats.transactions += len(applied)
        self.stats.changes += sum(len(tx.changes) for tx in applied)
        if self.on_applied is not None and applied:
            self.on_applied(applied)
        return applied

    def _collect(self, messages: Sequence[Any]) -> list[tuple[str, Transaction, Any]]:
        """Messages -> the whole transactions they complete (parts are kept until the last),
        each with its message if it is the message's last transaction (else None: the offset
        moves past a message only with its last transaction)."""
        ready: list[tuple[str, Transaction, Any]] = []
        for m in messages:
            try:
                parts = decode_all(m.value)
            except ValueError as e:
                raise ReplicaDiverged(
                    f"{m.topic}/{m.partition_key} offset {m.offset}: {e}"
                ) from None
            pending = self._parts.setdefault(m.partition_key, [])
            for i, part in enumerate(parts):
                if part.part == 1:
                    pending.clear()  # a replay restarts the transaction
                pending.append(part)
                if part.part == part.parts:
                    last = m if i == len(parts) - 1 else None
                    ready.append((m.partition_key, join(pending), last))
                    pending.clear()
        return ready

    def run(self, *, idle_timeout_s: float | None = None) -> ApplyStats:
        """Apply until :meth:`stop` (or ``idle_timeout_s`` without a message)."""
        from pymetaq.client.consumer import Consumer

        with Consumer(
            self.servers,
            self.config.group,
            self.store,
            enable_auto_commit=False,
            initial_position="earliest",
            **self._overrides,
        ) as consumer:
            consumer.subscribe(self.config.topic)
            idle_since = time.monotonic()
            while not self._stop.is_set():
                batch = consumer.poll(0.2)
                if not len(batch):
                    if (
                        idle_timeout_s is not None
                        and time.monotonic() - idle_since > idle_timeout_s
                    ):
                        break
                    continue
                idle_since = time.monotonic()
                ready = self._collect(list(batch))
                n = self.config.batch_transactions
                for i in range(0, len(ready), n):
                    self.apply(ready[i : i + n])
        return self.stats

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.store.close()
        self.engine.dispose()
