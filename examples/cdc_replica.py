"""Ordered binlog replication with ``pymetaq cdc``: a PostgreSQL database replicated into a
SQLite file (the embedded default) through the topic ``cdc-shop``, checked row for row.

Start the broker on the shipped configuration (its ``cdc-*`` topics have one partition: one
total commit order) and point the example at a PostgreSQL database with ``wal_level=logical``::

    .venv/bin/pymetaq server &
    .venv/bin/python examples/cdc_replica.py --source postgresql://postgres@127.0.0.1:5432/shop

It (re)creates ``customers`` and ``orders`` (a foreign key) on the source — use a database of
its own — and in ``replica.db`` (in a fresh temporary directory), runs ``pymetaq cdc capture
--once`` (which creates the slot), commits random transactions of inserts, updates and deletes,
runs capture again and ``pymetaq cdc apply`` until the topic is idle, and compares the two
databases: exit code 0 when the replica equals the source row for row. Each run uses a topic
and a slot of its own (``cdc-example-<hex>``); the slot is dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa

DDL = (
    "CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, balance bigint NOT NULL)",
    "CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer NOT NULL"
    " REFERENCES customers(id), amount bigint NOT NULL, note text)",
)


def cdc(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "pymetaq.server.cli", "cdc", *args],
                       capture_output=True, text=True, check=False)  # fmt: skip
    if r.returncode != 0:
        sys.exit(r.stderr)
    return r.stderr.strip().splitlines()[-1]


def workload(engine: sa.Engine, rng: random.Random, n: int) -> None:
    customers: list[int] = []
    orders: dict[int, int] = {}
    next_id = 1
    for _ in range(n):
        with engine.begin() as c:
            kind = rng.random()
            if kind < 0.25 or not customers:
                customers.append(next_id)
                c.execute(sa.text("INSERT INTO customers VALUES (:i, :n, 100)"),
                          {"i": next_id, "n": f"customer {next_id}"})  # fmt: skip
            elif kind < 0.65:
                cid = rng.choice(customers)
                orders[next_id] = cid
                c.execute(sa.text("INSERT INTO orders VALUES (:i, :c, :a, :t)"),
                          {"i": next_id, "c": cid, "a": rng.randrange(1, 99), "t": "it's new"})  # fmt: skip
                c.execute(sa.text("UPDATE customers SET balance = balance - 1 WHERE id = :c"),
                          {"c": cid})  # fmt: skip
            elif kind < 0.85 and orders:
                oid = rng.choice(sorted(orders))
                c.execute(sa.text("UPDATE orders SET note = 'shipped', amount = amount + 1 "
                                  "WHERE id = :o"), {"o": oid})  # fmt: skip
            elif orders:
                oid = rng.choice(sorted(orders))
                del orders[oid]
                c.execute(sa.text("DELETE FROM orders WHERE id = :o"), {"o": oid})
            next_id += 1


def rows(engine_or_path: sa.Engine | Path, table: str) -> list[tuple[object, ...]]:
    q = f"SELECT * FROM {table} ORDER BY id"
    if isinstance(engine_or_path, Path):
        with sqlite3.connect(engine_or_path) as con:
            return [tuple(r) for r in con.execute(q)]
    with engine_or_path.connect() as c:
        return [tuple(r) for r in c.exec_driver_sql(q)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True, help="postgresql://user@host:port/db")
    ap.add_argument("--servers", default=os.environ.get("PYMETAQ_SERVERS", "meta://127.0.0.1:8123"))
    ap.add_argument("--transactions", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    url = args.source.replace("postgresql://", "postgresql+psycopg://", 1)
    work = Path(tempfile.mkdtemp(prefix="cdc-replica-"))
    run = uuid.uuid4().hex[:8]
    topic, slot = f"cdc-example-{run}", f"example_{run}"
    replica = work / "replica.db"
    source = sa.create_engine(url)
    target = sa.create_engine(f"sqlite:///{replica}")
    with source.begin() as c:
        c.exec_driver_sql("DROP TABLE IF EXISTS orders, customers")
    for engine in (source, target):
        with engine.begin() as c:
            for ddl in DDL:
                c.exec_driver_sql(ddl)
    target.dispose()
    common = ["--servers", args.servers, "--topic", topic]
    capture = ["capture", *common, "--source", args.source, "--slot", slot,
               "--spool-dir", str(work / "spool"), "--once", "--quiet"]  # fmt: skip
    cdc(*capture)  # the slot: changes from now on are captured
    try:
        workload(source, random.Random(args.seed), args.transactions)
        print(cdc(*capture).replace(slot, "<slot>"))
        print(cdc("apply", *common, "--target", f"sqlite:///{replica}", "--group", "example",
                  "--idle-timeout", "1", "--quiet").replace(str(replica), "<replica.db>"))  # fmt: skip
        same = all(rows(source, t) == rows(replica, t) for t in ("customers", "orders"))
        counts = ", ".join(f"{t} {len(rows(replica, t))}" for t in ("customers", "orders"))
        verdict = "equals" if same else "DIFFERS FROM"
        print(f"replica {verdict} the source row for row ({counts} rows)")
    finally:
        with source.connect() as c:
            c.exec_driver_sql(f"SELECT pg_drop_replication_slot('{slot}')")
            c.commit()
        source.dispose()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
