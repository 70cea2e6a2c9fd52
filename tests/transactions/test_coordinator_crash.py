"""The coordinator's crash matrix, with a real broker and a real PostgreSQL
(``max_prepared_transactions > 0``).

**Coordinator killed.** A coordinator process (``_coordchild.py``) runs global transactions —
an ``orders`` row and ``k`` messages ``order-<id>#<i>`` each — and is SIGKILLed at every step
of the two-phase protocol: after BEGIN (``started``), in the middle of the block
(``mid-body``), after END, after the broker's PREPARE, after the database's PREPARE, after the
decision is durable, after the broker's COMMIT, after the database's COMMIT, after "done"; and,
in a random round, by the test at a random moment. The next coordinator process recovers
(its constructor does) and the test checks, before it runs anything else:

* every order's row and all of its messages exist, or none of them (``assert_agree``), and no
  message appears twice;
* an order killed before its decision is absent, one killed after it is present, every order
  that finished is present;
* nothing is left in doubt: no prepared gid of the coordinator in PostgreSQL, no prepared
  branch of its qualifier on the broker.

**Broker killed, coordinator running.** The broker is SIGKILLed at the steps phase 1 covers
(after BEGIN, mid-puts, after END, after PREPARE, three points inside COMMIT reached with
``PYMETAQ_TX_CRASHPOINT``, after the COMMIT's ack) while this test process is the running
coordinator; the broker restarts on the same port, ``recover()`` runs until complete, and the
same checks hold. Before the decision the transaction is rolled back; from PREPARE on, the
coordinator decides commit and finishes the broker's part after its restart.

One broker data directory, one database and one decision log serve every round, so each check
covers all earlier rounds. ``slow`` variants run many seeded rounds in random step order.
"""

from __future__ import annotations

import json
import queue
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pymetaq.client import Producer
from pymetaq.client.transaction import Coordinator, TransactionRolledBack
from tests._broker import BrokerProcess, write_server_ini
from tests._helpers import wait_for
from tests._services import free_port
from tests.transactions._helpers import assert_agree, order_messages, order_rows, prepared_gids
from tests.transactions._txwire import Wire, tx_line

pytestmark = [pytest.mark.integration, pytest.mark.pg, pytest.mark.crash]

ROOT = Path(__file__).resolve().parents[2]
NAME = "crash-1"
UNDECIDED = ("started", "mid-body", "ended", "mq-prepared", "db-prepared")
DECIDED = ("decided", "mq-committed", "db-committed", "done")
INSIDE_COMMIT = ("commit-intent", "commit-mid-append", "commit-appended")
BROKER_STEPS = (
    "after-begin",
    "mid-puts",
    "after-end",
    "after-prepare",
    *INSIDE_COMMIT,
    "after-commit-ack",
)
HOOK = {
    "after-begin": "started",
    "after-end": "ended",
    "after-prepare": "mq-prepared",
    "after-commit-ack": "mq-committed",
}


class World:
    """The broker, the database and the ledger of every order so far."""

    def __init__(self, tmp_path: Path, pg_url: str, rng: random.Random) -> None:
        base = tmp_path / "broker"
        base.mkdir()
        config = write_server_ini(
            base / "server.ini",
            data_path=base / "data",
            system={"serverPort": free_port()},
            topics={"orders": {"numPartitions": 2}},
        )
        self.broker = BrokerProcess(config, base)
        self.pg_url, self.rng, self.tmp = pg_url, rng, tmp_path
        self.log = tmp_path / "decisions.log"
        self.ledger: dict[int, tuple[int, str]] = {}  # id -> (k, both | neither | either)
        self.next_id = 1
        engine = sa.create_engine(pg_url, poolclass=sa.NullPool)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE orders (id integer PRIMARY KEY)")
        engine.dispose()

    @property
    def server(self) -> str:
        return f"meta://{self.broker.host}:{self.broker.port}"

    def order(self) -> tuple[int, int]:
        """A new order (id, message count); :meth:`expect` enters it in the ledger."""
        oid, k = self.next_id, self.rng.randrange(2, 5)
        self.next_id += 1
        return oid, k

    def expect(self, order: tuple[int, int], outcome: str) -> None:
        self.ledger[order[0]] = (order[1], outcome)

    def check(self) -> None:
        """After recovery: the queue and the database agree, as the ledger expects."""
        rows = order_rows(self.pg_url)
        want = {o: k for o, (k, _) in self.ledger.items()}

        def readable() -> bool:
            msgs = order_messages(self.broker.address, "orders", 2)
            return all(len(msgs.get(o, [])) >= want[o] for o in rows)

        wait_for(readable, what="committed messages to become readable")
        msgs = order_messages(self.broker.address, "orders", 2)
        assert set(rows) | set(msgs) <= set(self.ledger), "rows or messages nobody sent"
        assert_agree(rows, msgs, want)
        for oid, (k, expect) in list(self.ledger.items()):
            if expect == "either":
                self.ledger[oid] = (k, "both" if oid in rows else "neither")
            else:
                assert (oid in rows) == (expect == "both"), f"order {oid}: expected {expect}"
        assert [g for g in prepared_gids(self.pg_url) if g.startswith(f"pmq-{NAME}-")] == []
        with Wire(self.broker.address) as w:
            assert w.call(tx_line("null", "s", "RECOVER", NAME, 1)).body == b""


@pytest.fixture
def world(tmp_path: Path, pg_url: str, seed: int) -> Iterator[World]:
    w = World(tmp_path, pg_url, random.Random(seed))
    with w.broker:
        w.broker.launch()
        yield w


# -- the coordinator killed ----------------------------------------------------------------------
class Child:
    """One coordinator process (see ``_coordchild.py``)."""

    def __init__(self, world: World, plan: list[tuple[int, int]], victim: int, step: str) -> None:
        spec = {
            "server": world.server,
            "pg_url": world.pg_url,
            "log": str(world.log),
            "plan": plan,
            "victim": victim,
            "step": step,
        }
        self.stderr = open(world.tmp / "child.err", "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.transactions._coordchild", json.dumps(spec)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []  # every line read so far
        threading.Thread(target=self._read, daemon=True).start()
        first = self.next_line()
        assert first.startswith("recovered "), first

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.put(line.strip())
        self.lines.put("<eof>")

    def next_line(self, timeout: float = 60.0) -> str:
        try:
            line = self.lines.get(timeout=timeout)
            self.seen.append(line)
            return line
        except queue.Empty:
            self.proc.kill()
            raise AssertionError("the coordinator process went silent") from None

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait(self) -> tuple[int, list[str]]:
        try:
            code = self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.stderr.close()
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        while self.seen[-1:] != ["<eof>"]:
            self.next_line()
        return code, self.seen[1:-1]


def coordinator_round(world: World, step: str) -> None:
    plan = [world.order() for _ in range(2)]
    victim = world.order()
    child = Child(world, [*plan, victim], victim[0], step)
    world.check()  # after this process's recovery, before it runs anything
    for o in plan:
        world.expect(o, "both")
    world.expect(victim, "neither" if step in UNDECIDED else "both")
    child.go()
    code, out = child.wait()
    err = (world.tmp / "child.err").read_text()[-3000:]
    assert code == -signal.SIGKILL, f"{step}: exit {code}\n{out}\n{err}"
    assert [x.split()[1] for x in out if x.startswith("done")] == [str(o) for o, _ in plan]


def random_round(world: World) -> None:
    plan = [world.order() for _ in range(6)]
    child = Child(world, plan, -1, "")
    world.check()
    for o in plan:
        world.expect(o, "either")
    child.go()
    for _ in range(world.rng.randrange(1, 12)):  # a random point among begin/done lines
        if child.next_line() == "<eof>":
            break
    threading.Event().wait(world.rng.random() * 0.01)
    child.proc.send_signal(signal.SIGKILL)
    _, out = child.wait()
    done = {int(x.split()[1]) for x in out if x.startswith("done")}
    begun = {int(x.split()[1]) for x in out if x.startswith("begin")}
    for oid, k in plan:
        if oid in done:
            world.ledger[oid] = (k, "both")
        elif oid not in begun:
            world.ledger[oid] = (k, "neither")


def final_check(world: World) -> None:
    child = Child(world, [], -1, "")
    world.check()
    child.go()
    code, _ = child.wait()
    assert code == 0


def test_coordinator_killed_at_every_step(world: World) -> None:
    for step in (*UNDECIDED, *DECIDED):
        coordinator_round(world, step)
    random_round(world)
    final_check(world)
    assert sum(e == "both" for _, e in world.ledger.values()) >= 2 * 10


@pytest.mark.slow
def test_coordinator_killed_many_seeded_rounds(world: World) -> None:
    steps = [*UNDECIDED, *DECIDED, "random"]
    for _ in range(2):  # 20 rounds in random step order
        for step in world.rng.sample(steps, len(steps)):
            if step == "random":
                random_round(world)
            else:
                coordinator_round(world, step)
    final_check(world)


# -- the broker killed, the coordinator running --------------------------------------------------
class Running:
    """This test process as the running coordinator."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.kill_at = ""
        self.engine = sa.create_engine(world.pg_url)
        self.orders = sa.Table(
            "orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True)
        )
        self.producer = Producer(world.server)
        self.producer.partitions("orders")
        self.coordinator = Coordinator(
            NAME, world.log, self.producer, self.engine, timeout_s=10, on_step=self.step
        )

    def step(self, name: str) -> None:
        if name == self.kill_at:
            self.kill_at = ""
            self.world.broker.kill()

    def order(self, oid: int, k: int, kill_at: str = "") -> str:
        self.kill_at = HOOK.get(kill_at, "")
        try:
            with self.coordinator.transaction() as g:
                g.connection.execute(self.orders.insert().values(id=oid))
                for i in range(k):
                    self.producer.send("orders", b"order-%d#%d" % (oid, i), partition=i % 2)
                    if i == 0 and kill_at == "mid-puts":
                        self.world.broker.kill()
        finally:
            self.kill_at = ""
        return g.outcome

    def recover(self) -> None:
        wait_for(lambda: self.coordinator.recover().complete, what="a complete recovery")

    def close(self) -> None:
        self.coordinator.close()
        self.producer.close()
        self.engine.dispose()


def broker_round(world: World, running: Running, step: str) -> None:
    if step in INSIDE_COMMIT:  # the broker kills itself inside the round's second COMMIT
        world.broker.terminate()
        world.broker.env = {"PYMETAQ_TX_CRASHPOINT": f"{step}:2"}
        world.broker.launch()
    good = world.order()
    world.expect(good, "both")
    assert running.order(*good) == "committed"
    before = step in ("after-begin", "mid-puts", "after-end")
    oid, k = world.order()
    world.expect((oid, k), "neither" if before else "both")
    if before:
        with pytest.raises(TransactionRolledBack):
            running.order(oid, k, kill_at=step)
    else:
        outcome = running.order(oid, k, kill_at=step)
        assert outcome.startswith("committed"), outcome
    assert world.broker.proc is not None and world.broker.proc.wait(30) == -signal.SIGKILL
    world.broker.env = {}
    world.broker.launch()
    running.recover()
    world.check()


@pytest.fixture
def running(world: World) -> Iterator[Running]:
    r = Running(world)
    yield r
    r.close()


def test_broker_killed_at_every_step_with_the_coordinator_running(
    world: World, running: Running
) -> None:
    for step in BROKER_STEPS:
        broker_round(world, running, step)
    assert running.coordinator.pending == {}


@pytest.mark.slow
def test_broker_killed_many_seeded_rounds(world: World, running: Running) -> None:
    for _ in range(2):  # 16 rounds in random step order
        for step in world.rng.sample(BROKER_STEPS, len(BROKER_STEPS)):
            broker_round(world, running, step)
