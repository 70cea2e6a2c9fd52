"""The capture side: a PostgreSQL logical replication slot (``test_decoding``) published into a
topic in commit order with the ordered producer, the slot advanced only after the broker
acknowledged.

```python
cap = Capture(CaptureConfig(source="postgresql+psycopg://u@db/shop", slot="shop",
                            topic="cdc-shop", spool_dir="/var/spool/cdc"), "meta://127.0.0.1:8123")
cap.run()      # until cap.stop(); cap.run(once=True) returns when the slot is drained
```

One round: ``pg_logical_slot_peek_changes`` (reads without consuming; whole transactions, at
least ``batch_changes`` rows), each transaction encoded (:mod:`pymetaq.client.cdc.message`) and
sent in commit order through :class:`~pymetaq.client.producer.OrderedProducer`; then — only
once every message of the round is acknowledged by the broker (a spooled message is waited for
until the spool has drained it) — ``pg_replication_slot_advance(slot, last commit LSN)``. A
crash anywhere re-reads from the slot's confirmed position: transactions are published again,
never skipped (at-least-once; the apply side drops the replays by LSN).

Partitioning: ``total`` (default) sends everything to partition 0 — one total commit order,
transactions whole. ``key`` sends each change to ``crc32("<table>:<primary key JSON>") % n``;
a transaction becomes one message per partition it touches (same ``xid``/``lsn``), so order is
kept per row but a transaction is no longer applied atomically across partitions.

Thread-safety: ``run`` on one thread; ``stop`` from any thread or a signal handler.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymetaq.client.cdc.decoding import Change, Transaction, format_lsn, transactions
from pymetaq.client.cdc.message import MAX_BYTES, batch, encode
from pymetaq.client.errors import MetaClientError

log = logging.getLogger("pymetaq.cdc")

PLUGIN = "test_decoding"
PARTITIONING = ("total", "key")


class CaptureError(MetaClientError):
    """The slot cannot be read or the broker refused a message (the slot is not advanced)."""


@dataclass(frozen=True)
class CaptureConfig:
    source: str  # SQLAlchemy URL of the source database (postgresql+psycopg://...)
    slot: str
    topic: str
    spool_dir: str
    partitioning: str = "total"
    create_slot: bool = True
    batch_changes: int = 1000
    poll_interval_s: float = 0.05
    max_message_bytes: int = MAX_BYTES


@dataclass
class CaptureStats:
    transactions: int = 0
    changes: int = 0
    messages: int = 0
    confirmed_lsn: str = ""


def _engine(url: str) -> Any:
    from pymetaq.client.errors import MissingDependency

    try:
        import sqlalchemy as sa

        return sa.create_engine(url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    except ModuleNotFoundError as e:  # SQLAlchemy or the driver (psycopg)
        raise MissingDependency("pymetaq cdc capture", e.name or "psycopg", "pg") from e


class Capture:
    """Slot -> topic (see the module docstring)."""

    def __init__(self, config: CaptureConfig, servers: str, **producer_overrides: Any) -> None:
        if config.partitioning not in PARTITIONING:
            raise ValueError(f"partitioning must be one of {PARTITIONING}")
        self.config = config
        self.servers = servers
        self.stats = CaptureStats()
        self._overrides = producer_overrides
        self._stop = threading.Event()
        self._keys: dict[str, list[str]] = {}
        self._engine = _engine(config.source)
        #: called with each transaction after the slot was advanced past it (tests, metrics)
        self.on_confirmed: Callable[[Transaction], None] | None = None

    # -- the slot -----------------------------------------------------------------------

    def ensure_slot(self) -> None:
        """Check the slot (exists, logical, ``test_decoding``); create it when allowed."""
        import sqlalchemy as sa

        with self._engine.connect() as c:
            row = c.execute(
                sa.text(
                    "SELECT plugin, slot_type, database = current_database() "
                    "FROM pg_replication_slots WHERE slot_name = :s"
                ),
                {"s": self.config.slot},
            ).first()
            if row is None:
                if not self.config.create_slot:
                    raise CaptureError(f"replication slot {self.config.slot!r} does not exist")
                lsn = c.execute(
                    sa.text("SELECT lsn::text FROM pg_create_logical_replication_slot(:s, :p)"),
                    {"s": self.config.slot, "p": PLUGIN},
                ).scalar_one()
                log.info("created slot %s (%s) at %s", self.config.slot, PLUGIN, lsn)
                return
            plugin, kind, same_db = row
            if kind != "logical" or plugin != PLUGIN or not same_db:
                raise CaptureError(
                    f"slot {self.config.slot!r} is a {kind} slot of plugin {plugin!r} "
                    f"{'in this' if same_db else 'in another'} database; "
                    f"pymetaq cdc capture reads logical {PLUGIN} slots of the source database"
                )

    def _peek(self) -> list[Transaction]:
        import sqlalchemy as sa

        q = sa.text(
            "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes("
            ":s, NULL, :n, 'include-xids', '1', 'include-timestamp', '1')"
        )
        with self._engine.connect() as c:
            rows = c.execute(q, {"s": self.config.slot, "n": self.config.batch_changes}).all()
        return list(transactions((r[0], r[1], r[2]) for r in rows))

    def _advance(self, lsn: int) -> None:
        import sqlalchemy as sa

        with self._engine.connect() as c:
            c.execute(
                sa.text("SELECT pg_replication_slot_advance(:s, CAST(:l AS pg_lsn))"),
                {"s": self.config.slot, "l": format_lsn(lsn)},
            )
        self.stats.confirmed_lsn = format_lsn(lsn)

    def _flush_wal(self) -> None:
        """Make every commit so far decodable: the slot reads flushed WAL only, and commits
        under ``synchronous_commit=off`` are flushed late. A transaction that commits
        synchronously (its only content a logical message, which decodes to no change) flushes
        the WAL up to itself."""
        import sqlalchemy as sa

        with self._engine.connect() as c:
            c.exec_driver_sql("BEGIN")
            c.exec_driver_sql("SET LOCAL synchronous_commit = on")
            c.execute(sa.text("SELECT pg_logical_emit_message(true, 'pymetaq-cdc', 'flush')"))
            c.exec_driver_sql("COMMIT")

    def _primary_key(self, table: str) -> list[str]:
        cols = self._keys.get(table)
        if cols is None:
            import sqlalchemy as sa

            with self._engine.connect() as c:
                cols = list(
                    c.execute(
                        sa.text(
                            "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
                            "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                            "WHERE i.indrelid = CAST(:t AS regclass) AND i.indisprimary "
                            "ORDER BY a.attnum"
                        ),
                        {"t": table},
                    ).scalars()
                )
            self._keys[table] = cols
        return cols

    # -- publishing ---------------------------------------------------------------------

    def _routing_key(self, c: Change) -> str:
        if c.op == "truncate":
            return c.table
        values = c.key if c.key is not None else c.row or {}
        pk = self._primary_key(c.table) or sorted(values)
        return f"{c.table}:{json.dumps([values.get(k) for k in pk], separators=(',', ':'))}"

    def _messages(self, tx: Transaction, producer: Any) -> list[tuple[int, bytes]]:
        """``(partition index, bytes)`` for one transaction, in send order."""
        cap = self.config.max_message_bytes
        if self.config.partitioning == "total" or not tx.changes:
            return [(0, m) for m in encode(tx, cap)]
        from pymetaq.client.producer.partitioner import key_hash_index

        n = len(producer.partitions(self.config.topic))
        split: dict[int, list[Change]] = {}
        for c in tx.changes:
            split.setdefault(key_hash_index(self._routing_key(c).encode(), n), []).append(c)
        out = []
        for idx, changes in sorted(split.items()):
            out += [
                (idx, m) for m in encode(Transaction(tx.xid, tx.lsn, tx.commit_time, changes), cap)
            ]
        return out

    def _batched(self, txs: list[Transaction], producer: Any) -> list[tuple[int, bytes]]:
        """The round's messages in send order: per partition, consecutive whole transactions
        share a message up to ``max_message_bytes`` (a part of a larger one travels alone)."""
        out: list[tuple[int, bytes]] = []
        pending: dict[int, list[bytes]] = {}
        sizes: dict[int, int] = {}

        def flush(idx: int) -> None:
            msgs = pending.pop(idx, [])
            sizes.pop(idx, None)
            if msgs:
                out.append((idx, msgs[0] if len(msgs) == 1 else batch(msgs)))

        for tx in txs:
            if not tx.changes:
                continue  # nothing to replicate (e.g. only a logical message)
            messages = self._messages(tx, producer)
            whole = len({idx for idx, _ in messages}) == len(messages)
            for idx, value in messages:
                if not whole or sizes.get(idx, 0) + len(value) > self.config.max_message_bytes:
                    flush(idx)
                if not whole:
                    out.append((idx, value))
                    continue
                pending.setdefault(idx, []).append(value)
                sizes[idx] = sizes.get(idx, 0) + len(value) + 1
        for idx in sorted(pending):
            flush(idx)
        return out

    def _publish(self, txs: list[Transaction], producer: Any) -> bool:
        """Send the round's transactions in order; True when all are acknowledged."""
        spooled = False
        for idx, value in self._batched(txs, producer):
            r = producer.send(self.config.topic, value, partition=idx)
            if not r.success:
                raise CaptureError(f"the broker refused a message: {r.error}")
            spooled |= r.spooled
            self.stats.messages += 1
        while spooled and not producer.flush(1.0):
            if self._stop.is_set():
                return False  # still spooled: the slot stays, the next run sends them again
            log.info("waiting for %d spooled messages to reach the broker", producer.backlog())
        return True

    def run_round(self, producer: Any) -> int:
        """One peek-publish-advance round; the number of transactions it confirmed."""
        txs = self._peek()
        if not txs:
            return 0
        if not self._publish(txs, producer):
            return 0
        self._advance(txs[-1].lsn)
        self.stats.transactions += sum(1 for t in txs if t.changes)
        self.stats.changes += sum(len(t.changes) for t in txs)
        if self.on_confirmed is not None:
            for tx in txs:
                self.on_confirmed(tx)
        return len(txs)

    def run(self, *, once: bool = False) -> CaptureStats:
        """Capture until :meth:`stop` (``once``: until the slot has nothing committed left)."""
        from pymetaq.client.producer import OrderedProducer

        self.ensure_slot()
        Path(self.config.spool_dir).mkdir(parents=True, exist_ok=True)
        with OrderedProducer(
            self.servers, spool_dir=self.config.spool_dir, **self._overrides
        ) as producer:
            producer.partitions(self.config.topic)  # an unknown topic fails here, at start
            marked = False
            while not self._stop.is_set():
                if self.run_round(producer):
                    continue
                if once and not producer.backlog():
                    if marked:
                        break  # a peek after the marker's flush found nothing
                    self._flush_wal()
                    marked = True
                    continue
                self._stop.wait(self.config.poll_interval_s)
        self._engine.dispose()
        return self.stats

    def stop(self) -> None:
        self._stop.set()
