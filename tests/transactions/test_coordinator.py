"""The two-phase-commit coordinator with a real broker and a real PostgreSQL: both or
neither, the psycopg traps, clear refusals, recovery beside running transactions, pending
commits, heuristic outcomes, concurrency."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pymetaq.client import Producer
from pymetaq.client.transaction import (
    Coordinator,
    HeuristicMixed,
    TransactionRolledBack,
    TwoPhaseUnsupported,
)
from pymetaq.client.transaction.coordinator import FORMAT_ID
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import PostgresServer, free_port
from tests.transactions._helpers import (
    assert_agree,
    open_transactions,
    order_messages,
    order_rows,
    prepared_gids,
)
from tests.transactions._txwire import Wire

pytestmark = [pytest.mark.integration, pytest.mark.pg]

TOPICS = {"orders": {"numPartitions": 2}}
ORDERS = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("note", sa.String(40)),
)


class Crash(BaseException):
    """Stands for the coordinator process dying at a step (the branches stay as they are)."""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    system = {"serverPort": free_port()}  # a restart comes back on the same port
    with BrokerProcess.start(tmp_path, topics=TOPICS, system=system) as b:
        yield b


@pytest.fixture
def engine(pg_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(pg_url)
    ORDERS.metadata.create_all(eng)
    yield eng
    eng.dispose()


class Shop:
    """A producer, an engine and a coordinator; ``order(id, k)`` is one global transaction."""

    def __init__(self, b: BrokerProcess, engine: sa.Engine, log: Path, **kw: object) -> None:
        self.broker = b
        self.producer = Producer(f"meta://{b.host}:{b.port}")
        self.producer.partitions("orders")
        self.engine = engine
        self.coordinator = Coordinator("shop-1", log, self.producer, engine, **kw)  # type: ignore[arg-type]
        self.k: dict[int, int] = {}

    def order(self, oid: int, k: int = 2, fail: Callable[[], object] | None = None) -> str:
        self.k[oid] = k
        with self.coordinator.transaction() as g:
            g.connection.execute(ORDERS.insert().values(id=oid, note="new"))
            for i in range(k):
                self.producer.send("orders", b"order-%d#%d" % (oid, i))
            if fail is not None:
                fail()
        return g.outcome

    def check(self, url: str) -> tuple[set[int], dict[int, list[int]]]:
        rows = order_rows(url)
        wait_for(
            lambda: all(
                len(order_messages(self.broker.address, "orders", 2).get(o, [])) == self.k[o]
                for o in rows
            ),
            what="committed messages to become readable",
        )
        msgs = order_messages(self.broker.address, "orders", 2)
        assert_agree(rows, msgs, self.k)
        return rows, msgs

    def close(self) -> None:
        self.coordinator.close()
        self.producer.close()


@pytest.fixture
def shop(broker: BrokerProcess, engine: sa.Engine, tmp_path: Path) -> Iterator[Shop]:
    s = Shop(broker, engine, tmp_path / "decisions.log")
    yield s
    s.close()


def test_both_or_neither(shop: Shop, pg_url: str) -> None:
    assert shop.order(1) == "committed"
    with pytest.raises(ZeroDivisionError):
        shop.order(2, fail=lambda: 1 / 0)
    with pytest.raises(sa.exc.IntegrityError):
        shop.order(1)  # duplicate key, raised in the block
    rows, msgs = shop.check(pg_url)
    assert rows == {1} and set(msgs) == {1}
    assert shop.coordinator.pending == {} and prepared_gids(pg_url) == []
    assert open_transactions(shop.broker.address) == {}


def test_a_caught_sql_error_votes_no(shop: Shop, pg_url: str) -> None:
    """PostgreSQL answers PREPARE in an aborted transaction with a silent ROLLBACK; the
    coordinator must not go on to commit the messages."""
    shop.k[5] = 1
    failed = pytest.raises(TransactionRolledBack, match="a statement of the database branch")
    with failed, shop.coordinator.transaction() as g:
        g.connection.execute(ORDERS.insert().values(id=5))
        shop.producer.send("orders", b"order-5#0")
        try:
            g.connection.execute(sa.text("SELECT 1/0"))
        except sa.exc.DataError:
            pass  # the application swallowed it
    rows, msgs = shop.check(pg_url)
    assert 5 not in rows and 5 not in msgs
    assert prepared_gids(pg_url) == []


def test_committing_the_connection_inside_the_block_is_refused(shop: Shop, pg_url: str) -> None:
    refused = pytest.raises(TransactionRolledBack, match="committed or rolled back inside")
    with refused, shop.coordinator.transaction() as g:
        g.connection.execute(ORDERS.insert().values(id=6))
        shop.producer.send("orders", b"order-6#0")
        g.connection.commit()
    assert 6 not in order_messages(shop.broker.address, "orders", 2)


def test_no_message_commits_the_database_in_one_phase(shop: Shop, pg_url: str) -> None:
    assert shop.order(7, k=0) == "committed"
    assert order_rows(pg_url) == {7}
    log_lines = shop.coordinator.log.path.read_text().splitlines()
    assert len(log_lines) == 1  # the header: no decision needed, none written


def test_databases_that_cannot_prepare_are_refused(tmp_path: Path, broker: BrokerProcess) -> None:
    with Producer(f"meta://{broker.host}:{broker.port}") as p:
        with pytest.raises(TwoPhaseUnsupported, match="SQLite cannot prepare a transaction"):
            Coordinator("x", tmp_path / "a.log", p, sa.create_engine("sqlite://"))
        with PostgresServer(max_prepared_transactions=0) as pg:
            eng = sa.create_engine(pg.url, poolclass=sa.NullPool)
            with pytest.raises(TwoPhaseUnsupported, match="max_prepared_transactions = 0"):
                Coordinator("x", tmp_path / "b.log", p, eng)
            eng.dispose()
    with pytest.raises(ValueError, match="coordinator name"):
        Coordinator("bad name", tmp_path / "c.log", p, sa.create_engine("sqlite://"))


def test_recovery_leaves_running_transactions_alone(
    broker: BrokerProcess, engine: sa.Engine, tmp_path: Path, pg_url: str
) -> None:
    at_prepared, go_on = threading.Event(), threading.Event()

    def step(name: str) -> None:
        if name == "db-prepared" and threading.current_thread().name == "gtx":
            at_prepared.set()
            assert go_on.wait(30)

    shop = Shop(broker, engine, tmp_path / "d.log", on_step=step)
    try:
        outcome: list[str] = []
        t = threading.Thread(target=lambda: outcome.append(shop.order(11)), name="gtx")
        t.start()
        assert at_prepared.wait(30)
        report = shop.coordinator.recover()  # both branches prepared, no decision yet
        assert report.rolled_back == [] and report.complete
        assert len(prepared_gids(pg_url)) == 1
        go_on.set()
        t.join(30)
        assert outcome == ["committed"]
        rows, _ = shop.check(pg_url)
        assert rows == {11}
    finally:
        go_on.set()
        shop.close()


def test_a_commit_the_broker_missed_is_finished_by_recover(
    broker: BrokerProcess, engine: sa.Engine, tmp_path: Path, pg_url: str
) -> None:
    def step(name: str) -> None:
        if name == "decided":
            broker.kill()

    shop = Shop(broker, engine, tmp_path / "d.log", on_step=step)
    try:
        outcome = shop.order(21, k=3)
        assert outcome.startswith("committed (pending: broker")
        assert order_rows(pg_url) == {21}  # the database committed; the decision stands
        assert len(shop.coordinator.pending) == 1
        report = shop.coordinator.recover()
        assert not report.complete and shop.coordinator.pending  # broker still down
        broker.launch()
        report = shop.coordinator.recover()
        assert len(report.committed) == 1 and report.complete
        assert shop.coordinator.pending == {}
        rows, msgs = shop.check(pg_url)
        assert rows == {21} and sorted(msgs[21]) == [0, 1, 2]
    finally:
        shop.close()


def test_an_operator_rolling_back_a_decided_branch_is_heuristic_mixed(
    broker: BrokerProcess, engine: sa.Engine, tmp_path: Path, pg_url: str
) -> None:
    def step(name: str) -> None:
        if name == "decided":
            (key,) = open_transactions(broker.address)
            with Wire(broker.address) as w:
                assert w.call(f"txadmin rollback {key} 1\r\n".encode()).code == 200

    shop = Shop(broker, engine, tmp_path / "d.log", on_step=step)
    try:
        with pytest.raises(HeuristicMixed, match="an operator rolled back its broker branch"):
            shop.order(31)
        assert order_rows(pg_url) == {31}  # the database part committed as decided
        assert shop.coordinator.log.state.heuristics[0][1:] == ("broker", "rollback")
        assert open_transactions(broker.address) == {}  # forgotten
        assert shop.coordinator.pending == {}
    finally:
        shop.close()


def test_an_undecided_branch_committed_by_an_operator_is_recorded(
    broker: BrokerProcess, engine: sa.Engine, tmp_path: Path, pg_url: str
) -> None:
    def step(name: str) -> None:
        if name == "db-prepared":
            raise Crash

    shop = Shop(broker, engine, tmp_path / "d.log", on_step=step)
    try:
        with pytest.raises(Crash):
            shop.order(41)
        (key,) = open_transactions(broker.address)
        assert key.startswith(f"XID:{FORMAT_ID}:") and key.endswith(":01:shop-1")
        assert len(prepared_gids(pg_url)) == 1
        with Wire(broker.address) as w:
            assert w.call(f"txadmin commit {key} 1\r\n".encode()).code == 200
        report = shop.coordinator.recover()
        assert len(report.heuristic) == 1 and len(report.rolled_back) == 1
        assert prepared_gids(pg_url) == [] and order_rows(pg_url) == set()
        assert open_transactions(broker.address) == {}
    finally:
        shop.close()


def test_concurrent_global_transactions(shop: Shop, pg_url: str, seed: int) -> None:
    def worker(t: int) -> None:
        for i in range(15):
            shop.order(1000 * t + i, k=1 + (seed + i) % 3)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    rows, _ = shop.check(pg_url)
    assert len(rows) == 60 and shop.coordinator.pending == {}
