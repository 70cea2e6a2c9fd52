"""SqlOffsetStore.commit_in: business rows and offsets commit (or vanish) together."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pymetaq.offsets import OffsetEntry, SqlOffsetStore
from tests.offsets._workers import business, business_md, insert_then_block, make_engine

READY_DEADLINE_S = 60.0


@pytest.fixture
def engine(sql_url: str) -> Iterator[sa.Engine]:
    eng = make_engine(sql_url)
    business_md.create_all(eng)
    yield eng
    eng.dispose()


def _rows(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(business.c.payload).order_by(business.c.id)).scalars())


def test_commit_in_committed_with_the_business_transaction(engine: sa.Engine) -> None:
    store = SqlOffsetStore(engine=engine)
    with engine.begin() as conn:
        conn.execute(business.insert().values(payload="a"))
        store.commit_in(conn, "g", [OffsetEntry("t", "0-0", 120, 5)])
    assert _rows(engine) == ["a"]
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 120, 5)


def test_commit_in_rolled_back_with_the_business_transaction(engine: sa.Engine) -> None:
    store = SqlOffsetStore(engine=engine)
    store.commit("g", [OffsetEntry("t", "0-0", 100, 4)])
    with engine.connect() as conn:
        trans = conn.begin()
        conn.execute(business.insert().values(payload="b"))
        store.commit_in(conn, "g", [OffsetEntry("t", "0-0", 200, 6)])
        trans.rollback()
    assert _rows(engine) == []
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 100, 4)


def test_commit_in_never_moves_backwards(engine: sa.Engine) -> None:
    store = SqlOffsetStore(engine=engine)
    store.commit("g", [OffsetEntry("t", "0-0", 100, 4)])
    with engine.begin() as conn:
        conn.execute(business.insert().values(payload="c"))
        store.commit_in(conn, "g", [OffsetEntry("t", "0-0", 10, 1)])
    assert _rows(engine) == ["c"]
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 100, 4)


@pytest.mark.crash
@pytest.mark.integration
def test_sigkill_inside_the_transaction_leaves_neither(sql_url: str, engine: sa.Engine) -> None:
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(
        target=insert_then_block,
        args=(sql_url, "g", OffsetEntry("t", "0-0", 777, 9), child_end),
    )
    child.start()
    try:
        assert parent_end.poll(READY_DEADLINE_S), "child never reported its insert"
        assert parent_end.recv() == "inserted"
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(READY_DEADLINE_S)
        assert child.exitcode == -signal.SIGKILL
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    store = SqlOffsetStore(engine=engine)
    assert _rows(engine) == []
    assert store.load("g", "t", "0-0") is None
    # the database is usable afterwards (no lock left behind by the dead writer)
    with engine.begin() as conn:
        conn.execute(business.insert().values(payload="after"))
        store.commit_in(conn, "g", [OffsetEntry("t", "0-0", 778, 10)])
    assert _rows(engine) == ["after"]
    assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", 778, 10)
