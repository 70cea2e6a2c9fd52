"""Child-process bodies for the offset-store tests (importable under multiprocessing spawn)."""

from __future__ import annotations

from multiprocessing.connection import Connection as Pipe
from typing import Any

import sqlalchemy as sa

from pymetaq.offsets import OffsetEntry, SqlOffsetStore, create_sqlite_engine, open_offset_store

GROUP = "g-conc"
SHARED = ("shared", "0-0")

business_md = sa.MetaData()
business = sa.Table(
    "business_rows",
    business_md,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("payload", sa.String(100), nullable=False),
)


def make_engine(url: str) -> sa.Engine:
    return create_sqlite_engine(url) if url.startswith("sqlite") else sa.create_engine(url)


def concurrent_committer(
    spec: str, worker: int, workers: int, rounds: int, start: Any, results: Any
) -> None:
    """Commit rising offsets to a shared partition and to this worker's own partition.

    Waits on the ``start`` barrier so every worker commits at the same time, then puts
    ``(worker, problems)`` on ``results``: problems are offsets read back lower than one this
    worker had already committed.
    """
    problems: list[str] = []
    try:
        store = open_offset_store(spec)
        try:
            store.load(GROUP, *SHARED)  # connect before the barrier
            start.wait(60)
            for r in range(rounds):
                shared = r * workers + worker + 1
                own = OffsetEntry("own", f"{worker}-0", (r + 1) * 10, msg_id=r)
                store.commit(GROUP, [OffsetEntry(*SHARED, shared, msg_id=shared), own])
                got = store.load(GROUP, *SHARED)
                if got is None or got.offset < shared:
                    problems.append(f"worker {worker} round {r}: shared {got} < {shared}")
                mine = store.load(GROUP, "own", f"{worker}-0")
                if mine != own:
                    problems.append(f"worker {worker} round {r}: own {mine} != {own}")
        finally:
            store.close()
    except Exception as e:  # reported to the parent instead of a silent exit code
        problems.append(f"worker {worker}: {e!r}")
    results.put((worker, problems))


def insert_then_block(url: str, group: str, entry: OffsetEntry, ready: Pipe) -> None:
    """Begin a transaction, insert a business row, commit_in the offset, signal, block forever.

    The parent SIGKILLs this process while the transaction is open.
    """
    engine = make_engine(url)
    store = SqlOffsetStore(engine=engine)
    with engine.connect() as conn, conn.begin():
        conn.execute(business.insert().values(payload="row-1"))
        store.commit_in(conn, group, [entry])
        ready.send("inserted")
        ready.recv()  # blocks inside the open transaction until the parent kills us
        raise AssertionError("the parent should have killed this process")
