"""``pymetaq tx list|commit|rollback|forget`` against a real broker, as an operator runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests._broker import BrokerProcess
from tests.transactions._txwire import Wire, log_when, ok, put_ok, read_log, tx_line

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess.start(tmp_path_factory.mktemp("txcli"), topics={"orders": {}}) as b:
        yield b


def tx(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    server = f"meta://{broker.host}:{broker.port}"
    cmd = [sys.executable, "-m", "pymetaq.server.cli", "tx", *args, "--server", server]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def prepare(broker: BrokerProcess, key: str, payload: bytes) -> None:
    with Wire(broker.address) as w:
        ok(w, tx_line(key, "s", "BEGIN", "app", 1), 1)
        put_ok(w, "orders", 0, payload, key, 2)
        ok(w, tx_line(key, "s", "PREPARE", "app", 3), 3, b"0")


def test_list_commit_forget(broker: BrokerProcess) -> None:
    assert tx(broker, "list").stdout == "no open transactions\n"
    key = "XID:1:0a0b:0c:app"
    prepare(broker, key, b"order-created")
    out = tx(broker, "list")
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == [
        "KEY",
        "STATE",
        "XA",
        "MESSAGES",
        "BYTES",
        "AGE",
        "TIMEOUT",
        "PARTITIONS",
    ]
    fields = row.split()
    assert fields[:5] == [key, "PREPARED", "yes", "1", "33"] and fields[6:] == ["-", "orders-0"]
    (doc,) = json.loads(tx(broker, "list", "--json").stdout)
    assert {k: v for k, v in doc.items() if k != "age"} == {
        "key": key,
        "state": "PREPARED",
        "xa": "yes",
        "messages": 1,
        "bytes": 33,
        "timeout": "-",
        "partitions": "orders-0",
    }
    done = tx(broker, "commit", key)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"{key}: committed heuristically\n",
        "",
    )
    assert [r.data for r in log_when(broker.address, "orders", 0, 1)] == [b"order-created"]
    assert tx(broker, "list").stdout.splitlines()[1].split()[:2] == [key, "HEURISTIC_COMMIT"]
    assert tx(broker, "forget", key).stdout == f"{key}: forgotten\n"
    assert tx(broker, "list").stdout == "no open transactions\n"


def test_rollback_and_errors(broker: BrokerProcess) -> None:
    key = "XID:1:0d0e:0f:app"
    prepare(broker, key, b"cancelled")
    assert tx(broker, "rollback", key).stdout == f"{key}: rolled back heuristically\n"
    again = tx(broker, "rollback", key)
    assert again.returncode == 1
    assert again.stderr == (
        f"pymetaq tx rollback: XA_HEURRB (6): XA transaction '{key}' has been heuristically rolled back.\n"
    )
    assert tx(broker, "forget", key).returncode == 0
    unknown = tx(broker, "commit", "XID:1:ff:ff:app")
    assert unknown.returncode == 1
    assert unknown.stderr == (
        "pymetaq tx commit: XAER_NOTA (-4): XA transaction 'XID:1:ff:ff:app' has not been started.\n"
    )
    assert b"cancelled" not in [r.data for r in read_log(broker.address, "orders", 0)]


def test_usage_errors_have_no_traceback(broker: BrokerProcess) -> None:
    bad_key = tx(broker, "commit", "nonsense")
    assert bad_key.returncode == 1 and "Traceback" not in bad_key.stderr
    assert "illegal transaction key 'nonsense'" in bad_key.stderr
    missing = tx(broker, "commit")
    assert missing.returncode == 2 and "give the XA key" in missing.stderr
    two = "meta://127.0.0.1:1,meta://127.0.0.1:2"
    cmd = [sys.executable, "-m", "pymetaq.server.cli", "tx", "list", "--servers", two]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--servers names 2 brokers" in proc.stderr
    assert "Traceback" not in proc.stderr
