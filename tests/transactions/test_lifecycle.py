"""A clean stop (SIGTERM) with transactions open: local ones roll back, prepared XA branches
survive the restart, committed ones stay, and the broker logs no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._broker import BrokerProcess
from tests.transactions._txwire import (
    Wire,
    log_when,
    ok,
    put_ok,
    read_log,
    result,
    tx_line,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_clean_stop_keeps_prepared_and_drops_open(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics={"life": {"numPartitions": 2}}) as b:
        xa, local, done = "XID:1:01:01:life", "TX:life-1:1", "TX:life-2:1"
        with Wire(b.address) as w:
            ok(w, tx_line(done, "s", "BEGIN", 1), 1)
            put_ok(w, "life", 0, b"committed", done, 2)
            ok(w, tx_line(done, "s", "COMMIT_ONE_PHASE", 3), 3)
            ok(w, tx_line(xa, "s", "BEGIN", "life", 4), 4)
            put_ok(w, "life", 1, b"prepared", xa, 5)
            ok(w, tx_line(xa, "s", "PREPARE", "life", 6), 6, b"0")
            with Wire(b.address) as open_conn:  # still connected when the broker stops
                ok(open_conn, tx_line(local, "s", "BEGIN", 7), 7)
                put_ok(open_conn, "life", 0, b"open", local, 8)
                assert b.terminate() == 0
        first_run = b.log_text()
        b.restart()
        with Wire(b.address) as w:
            w.exact(tx_line("null", "s", "RECOVER", "life", 9), result(200, xa.encode(), 9))
            assert [r.data for r in read_log(b.address, "life", 0)] == [b"committed"]
            ok(w, tx_line(xa, "s", "COMMIT_TWO_PHASE", "life", 10), 10)
            assert [r.data for r in log_when(b.address, "life", 1, 1)] == [b"prepared"]
        assert b.terminate() == 0
        for text in (first_run, b.log_text()):
            assert "Traceback" not in text and "ERROR" not in text, text


def test_the_journal_stays_small_while_a_branch_stays_prepared(tmp_path: Path) -> None:
    system = {"txJournalFileSize": 65536, "checkpointInterval": 3600000}
    with BrokerProcess.start(tmp_path, topics={"roll": {}}, system=system) as b:
        journal = b.data_path / "transactions"
        xa = "XID:1:02:02:roll"
        with Wire(b.address) as w:
            ok(w, tx_line(xa, "s", "BEGIN", "roll", 1), 1)
            put_ok(w, "roll", 0, b"waiting", xa, 2)
            ok(w, tx_line(xa, "s", "PREPARE", "roll", 3), 3, b"0")
            for n in range(120):  # ~480 KiB of journal: several files
                key = f"TX:roll-{n}:1"
                ok(w, tx_line(key, "s", "BEGIN", 10), 10)
                put_ok(w, "roll", 0, b"x" * 4000, key, 11)
                ok(w, tx_line(key, "s", "COMMIT_ONE_PHASE", 12), 12)
        wait_for(lambda: len(list(journal.glob("redo.*"))) <= 2, what="old journal files deleted")
        assert max(int(p.suffix[1:]) for p in journal.glob("redo.*")) >= 5  # it did roll
        b.kill()
        b.restart()
        with Wire(b.address) as w:
            w.exact(tx_line("null", "s", "RECOVER", "roll", 4), result(200, xa.encode(), 4))
            ok(w, tx_line(xa, "s", "ROLLBACK", "roll", 5), 5)
        assert len(log_when(b.address, "roll", 0, 120)) == 120
