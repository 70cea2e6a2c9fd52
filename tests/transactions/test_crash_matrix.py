"""The broker crash matrix: SIGKILL a real broker at every step of a transaction, restart it,
and check the logs with a raw-socket client.

Steps: after BEGIN, in the middle of the puts, after END, after PREPARE, inside COMMIT (three
points, below), at a random moment of a COMMIT, after the COMMIT's acknowledgement.  The three
points inside COMMIT last microseconds, so SIGKILL timing from outside cannot hit them: the
broker is started with ``PYMETAQ_TX_CRASHPOINT`` (``pymetaq.storage.txjournal.crashpoint``) and
kills itself there — after the COMMIT record is durable and before any append
(``commit-intent``), after the first of two partition appends (``commit-mid-append``), and after
every append is durable but before the APPLIED record (``commit-appended``); ``<name>:2`` makes
the second commit of the round (the victim's) the one that dies.

One data directory serves every round, so each restart re-checks every earlier round:
committed transactions are in the log exactly once, contiguous and in order per partition;
transactions never committed are absent; nothing appears twice; prepared XA branches are listed
by RECOVER and the test, as their coordinator, commits or rolls them back.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pymetaq.server.stats import VERSION
from tests._broker import BrokerProcess, write_server_ini
from tests.transactions._txwire import Wire, put_ok, read_log, result, tx_line

pytestmark = pytest.mark.integration

Q = "crashq"
INSIDE_COMMIT = ("commit-intent", "commit-mid-append", "commit-appended")
STEPS = (
    "after-begin",
    "mid-puts",
    "after-end",
    "after-prepare",
    *INSIDE_COMMIT,
    "during-commit",
    "after-commit-ack",
)


@dataclass
class Tx:
    key: str
    xa: bool
    msgs: list[tuple[int, bytes, int]] = field(default_factory=list)  # (partition, data, msg id)
    status: str = "absent"  # absent | committed | prepared | either


class Matrix:
    def __init__(self, tmp_path: Path, rng: random.Random) -> None:
        base = tmp_path / "broker"
        base.mkdir()
        config = write_server_ini(
            base / "server.ini", data_path=base / "data", topics={"cm": {"numPartitions": 2}}
        )
        self.broker = BrokerProcess(config, base)
        self.rng = rng
        self.ledger: list[Tx] = []
        self.n = 0

    def launch(self, crashpoint: str | None = None) -> None:
        self.broker.env = {"PYMETAQ_TX_CRASHPOINT": crashpoint} if crashpoint else {}
        self.broker.launch()

    def new(self, xa: bool) -> Tx:
        self.n += 1
        key = f"XID:1:{self.n:04x}:01:{Q}" if xa else f"TX:crash-{self.n}:1"
        tx = Tx(key, xa)
        self.ledger.append(tx)
        return tx

    def committed_baseline(self, w: Wire) -> None:
        tx = self.new(False)
        w.exact(tx_line(tx.key, "s", "BEGIN", 1), result(200, b"", 1))
        self.puts(w, tx, 3)
        w.exact(tx_line(tx.key, "s", "COMMIT_ONE_PHASE", 2), result(200, b"", 2))
        tx.status = "committed"

    def puts(self, w: Wire, tx: Tx, count: int) -> None:
        for i in range(count):
            p = i if i < 2 else self.rng.randrange(2)
            data = b"%s#%d" % (tx.key.encode(), i)
            tx.msgs.append((p, data, put_ok(w, "cm", p, data, tx.key, 100 + i)))

    def prepare(self, w: Wire, tx: Tx) -> None:
        w.exact(tx_line(tx.key, "s", "PREPARE", Q, 3), result(200, b"0", 3))
        tx.status = "prepared"

    # -- one round -----------------------------------------------------------------------------
    def round(self, step: str) -> None:
        # the baseline commit below passes the crash point once; the victim's commit is 2nd
        self.launch(f"{step}:2" if step in INSIDE_COMMIT else None)
        self.check(decide=False)  # the last round's check decided every in-doubt branch
        with Wire(self.broker.address) as w:
            self.committed_baseline(w)
            base_xa = self.new(True)
            w.exact(tx_line(base_xa.key, "s", "BEGIN", Q, 4), result(200, b"", 4))
            self.puts(w, base_xa, 1)
            self.prepare(w, base_xa)
            xa = step in ("after-end", "after-prepare") or self.rng.random() < 0.5
            self.victim(w, self.new(xa), step)
        self.broker.kill()
        self.launch()
        self.check()
        self.broker.terminate()

    def victim(self, w: Wire, tx: Tx, step: str) -> None:
        w.exact(tx_line(tx.key, "s", "BEGIN", *([Q] if tx.xa else []), 5), result(200, b"", 5))
        if step == "after-begin":
            return
        self.puts(w, tx, self.rng.randrange(2, 6))
        if step == "mid-puts":
            return
        if tx.xa:
            w.send(tx_line(tx.key, "s", "END", Q, 6))
            w.exact(b"version 7\r\n", result(200, VERSION.encode(), 7))  # END: no reply
            if step == "after-end":
                return
            if step == "after-prepare" or self.rng.random() < 0.5:
                self.prepare(w, tx)
                if step == "after-prepare":
                    return
        kind = "COMMIT_TWO_PHASE" if tx.status == "prepared" else "COMMIT_ONE_PHASE"
        w.send(tx_line(tx.key, "s", kind, *([Q] if tx.xa else []), 8))
        if step in INSIDE_COMMIT:
            assert self.broker.proc is not None and self.broker.proc.wait(30) == -9
            tx.status = "committed"  # the COMMIT record was durable: replay must finish it
        elif step == "during-commit":
            tx.status = "either"
        else:
            assert w.read_exact(len(result(200, b"", 8))) == result(200, b"", 8)
            tx.status = "committed"

    # -- checks --------------------------------------------------------------------------------
    def check(self, *, decide: bool = True) -> None:
        where: dict[int, tuple[int, int, int]] = {}
        for p in (0, 1):
            for r in read_log(self.broker.address, "cm", p):
                assert r.msg_id not in where, f"message {r.msg_id} appears twice"
                where[r.msg_id] = (p, r.offset, r.size)
        with Wire(self.broker.address) as w:
            recovered = set(
                w.call(tx_line("null", "s", "RECOVER", Q, 9)).body.decode().split("\r\n")
            ) - {""}
            assert decide or not recovered
            for tx in self.ledger:
                present = [m[2] in where for m in tx.msgs]
                if tx.status == "committed" or (tx.status == "either" and present and all(present)):
                    assert present and all(present), f"{tx.key}: committed, not in the log"
                    _contiguous(tx, where)
                    tx.status = "committed"
                    continue
                assert not any(present), f"{tx.key} ({tx.status}) is applied (partly)"
                if tx.status == "prepared":
                    assert tx.key in recovered, f"{tx.key}: prepared, not recovered"
                if tx.key in recovered:
                    assert tx.xa and tx.status in ("prepared", "either")
                    self.decide(w, tx)
                else:
                    tx.status = "absent"
            assert recovered <= {tx.key for tx in self.ledger}

    def decide(self, w: Wire, tx: Tx) -> None:
        """The coordinator finishes an in-doubt branch after the crash."""
        if self.rng.random() < 0.5:
            w.exact(tx_line(tx.key, "s2", "COMMIT_TWO_PHASE", Q, 10), result(200, b"", 10))
            tx.status = "committed"
        else:
            w.exact(tx_line(tx.key, "s2", "ROLLBACK", Q, 11), result(200, b"", 11))
            tx.status = "absent"


def _contiguous(tx: Tx, where: dict[int, tuple[int, int, int]]) -> None:
    for p in (0, 1):
        spots = [where[m[2]] for m in tx.msgs if m[0] == p]
        assert all(s[0] == p for s in spots)
        for a, b in itertools.pairwise(spots):
            assert b[1] == a[1] + a[2], f"{tx.key}: partition {p} is not one contiguous range"


@pytest.fixture
def matrix(tmp_path: Path, seed: int) -> Iterator[Matrix]:
    m = Matrix(tmp_path, random.Random(seed))
    with m.broker:  # stops the broker and closes its log pipe
        yield m


@pytest.mark.crash
def test_sigkill_at_every_step(matrix: Matrix) -> None:
    for step in STEPS:
        matrix.round(step)
    assert sum(tx.status == "committed" for tx in matrix.ledger) >= len(STEPS)


@pytest.mark.crash
@pytest.mark.slow
def test_sigkill_many_seeded_rounds(matrix: Matrix) -> None:
    for _ in range(2):  # 18 rounds in random step order, one data directory
        for step in matrix.rng.sample(STEPS, len(STEPS)):
            matrix.round(step)
