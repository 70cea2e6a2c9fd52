"""Helpers of the CDC tests (no tests here): the schema, a seeded random workload on the source
with an exact Python model of every state it committed, and readers of both databases.

``Workload`` runs random transactions (inserts, updates, deletes over three tables with foreign
keys, plus ``txcount`` bumped by every transaction) at a fixed rate on a thread; after the k-th
commit the model's state is ``state_after(k)``, and ``txcount.n == k`` in that state. A reader
that sees ``txcount.n == k`` and anything but ``state_after(k)`` saw a state the source never
committed: a transaction boundary was violated.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from typing import Any

import sqlalchemy as sa

TABLES = ("customers", "orders", "items", "txcount")
DDL = (
    "CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, balance bigint NOT NULL,"
    " n_orders integer NOT NULL, vip boolean)",
    "CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer NOT NULL"
    " REFERENCES customers(id), amount bigint NOT NULL, note text)",
    "CREATE TABLE items (id integer PRIMARY KEY, order_id integer NOT NULL REFERENCES orders(id),"
    " qty integer NOT NULL)",
    "CREATE TABLE txcount (id integer PRIMARY KEY, n bigint NOT NULL)",
)
COLUMNS = {
    "customers": ("id", "name", "balance", "n_orders", "vip"),
    "orders": ("id", "customer_id", "amount", "note"),
    "items": ("id", "order_id", "qty"),
    "txcount": ("id", "n"),
}
NOTES = ("it's", 'a "b" c', "x]: y [z]", "héllo wörld", "", None, "null", "'quoted'", "a\nb")

State = dict[str, dict[int, tuple[Any, ...]]]
Op = tuple[str, str, int, tuple[Any, ...] | None]  # table, "put" | "del", id, row


def create_schema(engine: sa.Engine) -> None:
    with engine.begin() as c:
        for ddl in DDL:
            c.exec_driver_sql(ddl)


class Workload(threading.Thread):
    """Random transactions at ``rate`` per second until ``stop`` is set (see the module doc)."""

    def __init__(self, url: str, rng: random.Random, rate: float) -> None:
        super().__init__(daemon=True, name="cdc-workload")
        self.engine = sa.create_engine(url)
        self.rng = rng
        self.rate = rate
        self.stop = threading.Event()
        self.log: list[list[Op]] = []
        self.state: State = {t: {} for t in TABLES}
        self.next_id = 1
        self.error: BaseException | None = None

    # -- the model ---------------------------------------------------------------------

    def state_after(self, k: int) -> State:
        state: State = {t: {} for t in TABLES}
        for ops in self.log[:k]:
            for table, op, key, row in ops:
                if op == "put":
                    assert row is not None
                    state[table][key] = row
                else:
                    del state[table][key]
        return state

    # -- one random transaction --------------------------------------------------------

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _put_row(self, c: Any, ops: list[Op], table: str, row: tuple[Any, ...], new: bool) -> None:
        cols = COLUMNS[table]
        params = dict(zip(cols, row))
        if new:
            sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(':' + x for x in cols)})"
        else:
            sets = ", ".join(f"{x} = :{x}" for x in cols[1:])
            sql = f"UPDATE {table} SET {sets} WHERE id = :id"
        c.execute(sa.text(sql), params)
        ops.append((table, "put", row[0], row))
        self.state[table][row[0]] = row

    def _remove_row(self, c: Any, ops: list[Op], table: str, key: int) -> None:
        c.execute(sa.text(f"DELETE FROM {table} WHERE id = :id"), {"id": key})
        ops.append((table, "del", key, None))
        del self.state[table][key]

    def _one(self, c: Any, ops: list[Op]) -> None:
        rng, st = self.rng, self.state
        customers, orders = sorted(st["customers"]), sorted(st["orders"])
        kind = rng.choice(("customer", "order", "order", "transfer", "edit", "cancel", "drop"))
        if kind == "customer" or not customers:
            row = (
                self._new_id(),
                f"cust {rng.randrange(1000)}",
                1000,
                0,
                rng.choice((True, False, None)),
            )
            self._put_row(c, ops, "customers", row, True)
        elif kind == "order":
            cid = rng.choice(customers)
            oid = self._new_id()
            self._put_row(
                c, ops, "orders", (oid, cid, rng.randrange(1, 500), rng.choice(NOTES)), True
            )
            for _ in range(rng.randint(1, 3)):
                self._put_row(c, ops, "items", (self._new_id(), oid, rng.randint(1, 9)), True)
            cu = st["customers"][cid]
            self._put_row(c, ops, "customers", (*cu[:3], cu[3] + 1, cu[4]), False)
        elif kind == "transfer" and len(customers) > 1:
            a, b = rng.sample(customers, 2)
            x = rng.randrange(1, 100)
            ra, rb = st["customers"][a], st["customers"][b]
            self._put_row(c, ops, "customers", (a, ra[1], ra[2] - x, ra[3], ra[4]), False)
            self._put_row(c, ops, "customers", (b, rb[1], rb[2] + x, rb[3], rb[4]), False)
        elif kind == "edit" and orders:
            o = st["orders"][rng.choice(orders)]
            self._put_row(c, ops, "orders", (o[0], o[1], o[2] + 1, rng.choice(NOTES)), False)
        elif kind == "cancel" and orders:
            o = st["orders"][rng.choice(orders)]
            for iid in [i for i, r in st["items"].items() if r[1] == o[0]]:
                self._remove_row(c, ops, "items", iid)
            self._remove_row(c, ops, "orders", o[0])
            cu = st["customers"][o[1]]
            self._put_row(c, ops, "customers", (*cu[:3], cu[3] - 1, cu[4]), False)
        else:
            idle = [k for k, r in st["customers"].items() if r[3] == 0]
            if idle:
                self._remove_row(c, ops, "customers", rng.choice(idle))
        k = len(self.log) + 1
        self._put_row(c, ops, "txcount", (1, k), k == 1)

    def transaction(self) -> None:
        ops: list[Op] = []
        before = {t: dict(rows) for t, rows in self.state.items()}
        try:
            with self.engine.begin() as c:
                self._one(c, ops)
        except BaseException:
            self.state = before
            raise
        self.log.append(ops)

    def run(self) -> None:
        try:
            next_at = time.monotonic()
            while not self.stop.is_set():
                self.transaction()
                next_at += 1.0 / self.rate
                self.stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.engine.dispose()


def normalise(table: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """SQLite gives booleans back as 0/1."""
    if table == "customers" and row[4] is not None:
        return (*row[:4], bool(row[4]))
    return tuple(row)


def read_sqlite(path: str) -> tuple[int, State]:
    """One consistent snapshot of a SQLite replica: (txcount.n, rows)."""
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        con.execute("BEGIN")
        state: State = {}
        for t in TABLES:
            cols = ", ".join(COLUMNS[t])
            state[t] = {r[0]: normalise(t, r) for r in con.execute(f"SELECT {cols} FROM {t}")}
        con.execute("COMMIT")
    finally:
        con.close()
    n = state["txcount"].get(1, (1, 0))[1]
    return int(n), state


def read_sql(url: str) -> tuple[int, State]:
    """One consistent snapshot of a PostgreSQL database (REPEATABLE READ)."""
    engine = sa.create_engine(url, isolation_level="REPEATABLE READ", poolclass=sa.NullPool)
    try:
        with engine.begin() as c:
            state: State = {}
            for t in TABLES:
                cols = ", ".join(COLUMNS[t])
                rows = c.exec_driver_sql(f"SELECT {cols} FROM {t}")
                state[t] = {r[0]: normalise(t, tuple(r)) for r in rows}
    finally:
        engine.dispose()
    n = state["txcount"].get(1, (1, 0))[1]
    return int(n), state
