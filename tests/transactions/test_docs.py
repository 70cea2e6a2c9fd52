"""The client examples of docs/transactions.md, the transaction examples of docs/client.md
and README.md, and ``examples/orders_xa.py`` run as written, against a real broker and a real
PostgreSQL."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.client._helpers import produce
from tests.transactions._helpers import values

pytestmark = [pytest.mark.integration, pytest.mark.pg]

ROOT = Path(__file__).resolve().parents[2]
DOC_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/shop"
TOPICS = {"test": {"numPartitions": 4}, "log-orders": {"numPartitions": 2}}


def blocks(doc: str, start: str, end: str | None = None) -> list[str]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    section = text[text.index(start) : text.index(end) if end else None]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def run(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code] if code else [sys.executable, *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_transaction_examples_run(tmp_path: Path, pg_url: str) -> None:
    examples = blocks("docs/transactions.md", "## Local transactions from the client", "## How it")
    examples += blocks("docs/client.md", "### Transactions", "### CLI")
    examples += blocks("README.md", "## Transactions", "## What is here")
    assert len(examples) == 7
    with BrokerProcess.start(tmp_path, topics=TOPICS) as b:
        produce(b, "log-orders", 0, [b"order-1", b"order-2"])
        server = f"meta://{b.host}:{b.port}"
        outputs = []
        for i, code in enumerate(examples):
            code = code.replace("meta://127.0.0.1:8123", server).replace(DOC_DB, pg_url)
            r = run(code, tmp_path)
            assert r.returncode == 0, f"example {i} failed:\n{code}\n{r.stderr}"
            outputs.append(r.stdout)
        assert re.fullmatch(r"committed 2 TX:[0-9.]+-\d+-\d+:1\n", outputs[0])
        assert outputs[1] == "committed 3\n"
        assert outputs[2] == "billing-1 0 []\n"
        assert outputs[3] == "committed\n"
        assert re.fullmatch(
            r"\[OffsetEntry\(topic='log-orders', partition='0-0', offset=54, msg_id=\d+\)\]\n",
            outputs[4],
        )  # past both orders (27 bytes each)
        assert outputs[5] == "both stored\n" and outputs[6] == ""
        wanted = {b"ship order-1", b"ship order-2", b"order 1 created", b"invoice 7 issued"}
        wanted |= {b"debit account 7", b"credit account 9"}
        wait_for(lambda: wanted <= set(values(b.address, "test", 4)), what="the examples' sends")
    engine = sa.create_engine(pg_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        assert list(conn.exec_driver_sql("SELECT id FROM orders").scalars()) == [1]
    engine.dispose()


def test_the_orders_example(tmp_path: Path, pg_url: str) -> None:
    with BrokerProcess.start(tmp_path, topics=TOPICS) as b:
        args = ["examples/orders_xa.py", "--db", pg_url, "--server", f"meta://{b.host}:{b.port}"]
        args += ["--log", str(tmp_path / "orders.log")]
        ok = run("", ROOT, *args)
        assert ok.returncode == 0, ok.stderr
        assert re.fullmatch(
            r"order 1: committed \(message id \d+\)\norders in the database: 1\n", ok.stdout
        )
        failed = run("", ROOT, *args, "--fail")
        assert failed.returncode == 0, failed.stderr
        assert failed.stdout == (
            "rolled back: failing on purpose (--fail)\norders in the database: 1\n"
        )
        wait_for(lambda: values(b.address, "test", 4) == [b"order 1 created"], what="the send")
        assert b"order 2 created" not in values(b.address, "test", 4)
