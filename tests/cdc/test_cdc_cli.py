"""``pymetaq cdc capture`` / ``apply`` end to end (real PostgreSQL, real broker, the commands as
processes): key partitioning into a PostgreSQL replica, the order kept per row; a replica that
does not fit stops apply with the reason and commits nothing; user errors are one line and a
hint, never a traceback."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests._broker import BrokerProcess
from tests._services import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.pg]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "cdc", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HOME": str(cwd)},
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def dbs(pg_server: PostgresServer) -> Iterator[tuple[str, str]]:
    """(source URL, replica URL): two fresh databases; the source's slots dropped at the end."""
    names = [pg_server.create_database(), pg_server.create_database()]
    try:
        yield pg_server.url_for(names[0]), pg_server.url_for(names[1])
    finally:
        eng = sa.create_engine(pg_server.url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        with eng.connect() as c:
            c.exec_driver_sql(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %(d)s",
                {"d": names[0]},
            )
        eng.dispose()
        for n in names:
            pg_server.drop_database(n)


def rows(url: str, table: str) -> list[tuple[object, ...]]:
    eng = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with eng.connect() as c:
            return [tuple(r) for r in c.exec_driver_sql(f"SELECT * FROM {table} ORDER BY 1")]
    finally:
        eng.dispose()


def execute(url: str, *statements: str) -> None:
    eng = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with eng.begin() as c:
            for s in statements:
                c.exec_driver_sql(s)
    finally:
        eng.dispose()


def test_key_partitioning_into_postgres_keeps_each_rows_order(
    tmp_path: Path, dbs: tuple[str, str], seed: int
) -> None:
    source, replica = dbs
    ddl = "CREATE TABLE kv (id integer PRIMARY KEY, v integer NOT NULL, s text, d numeric(8,2))"
    execute(source, ddl)
    execute(replica, ddl)
    rng = random.Random(seed)
    with BrokerProcess.start(tmp_path / "b", topics={"kv": {"numPartitions": 3}}) as broker:
        servers = f"meta://{broker.host}:{broker.port}"
        cap = ["capture", "--servers", servers, "--source", source, "--topic", "kv",
               "--partitioning", "key", "--spool-dir", str(tmp_path / "spool")]  # fmt: skip
        assert cli(*cap, "--once", cwd=tmp_path).returncode == 0  # creates the slot
        live: dict[int, int] = {}
        statements: list[str] = []
        for i in range(600):  # every row is inserted, updated many times, some deleted
            k = rng.randrange(40)
            if k not in live:
                live[k] = 0
                statements.append(f"INSERT INTO kv VALUES ({k}, 0, 'it''s {k}', {k}.25)")
            elif rng.random() < 0.1:
                del live[k]
                statements.append(f"DELETE FROM kv WHERE id = {k}")
            else:
                live[k] += 1
                statements.append(f"UPDATE kv SET v = {live[k]}, s = 'v{i}' WHERE id = {k}")
        for i in range(0, len(statements), 7):  # transactions of up to 7 statements
            execute(source, *statements[i : i + 7])
        r = cli(*cap, "--once", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "captured 86 transactions (600 changes" in r.stderr
        a = cli("apply", "--servers", servers, "--target", replica, "--topic", "kv",
                "--idle-timeout", "1", cwd=tmp_path)  # fmt: skip
        assert a.returncode == 0, a.stderr
        assert "applied " in a.stderr
    assert rows(replica, "kv") == rows(source, "kv")
    assert sorted(int(str(r[0])) for r in rows(replica, "kv")) == sorted(live)


def test_a_replica_that_does_not_fit_stops_apply_with_the_reason(
    tmp_path: Path, dbs: tuple[str, str]
) -> None:
    source, replica = dbs
    execute(source, "CREATE TABLE t (id integer PRIMARY KEY, v text)")
    execute(
        replica, "CREATE TABLE t (id integer PRIMARY KEY, v text)", "INSERT INTO t VALUES (2, 'x')"
    )
    with BrokerProcess.start(tmp_path / "b", topics={"t": {}}) as broker:
        servers = f"meta://{broker.host}:{broker.port}"
        cap = ["capture", "--servers", servers, "--source", source, "--topic", "t",
               "--spool-dir", str(tmp_path / "spool")]  # fmt: skip
        assert cli(*cap, "--once", cwd=tmp_path).returncode == 0
        execute(source, "INSERT INTO t VALUES (1, 'a')")
        execute(source, "INSERT INTO t VALUES (2, 'b')", "UPDATE t SET v = 'c' WHERE id = 1")
        assert cli(*cap, "--once", cwd=tmp_path).returncode == 0
        app = ["apply", "--servers", servers, "--target", replica, "--topic", "t",
               "--idle-timeout", "1", "--batch-transactions", "1"]  # fmt: skip
        r = cli(*app, cwd=tmp_path)
        assert r.returncode == 1
        assert r.stderr.startswith("pymetaq cdc: insert of t refused: duplicate key value"), (
            r.stderr
        )
        # the first transaction is in, the second not at all (its update neither)
        assert rows(replica, "t") == [(1, "a"), (2, "x")]
        execute(replica, "DELETE FROM t WHERE id = 2")
        r = cli(*app, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "applied 1 transaction (2 changes" in r.stderr
    assert rows(replica, "t") == rows(source, "t") == [(1, "c"), (2, "b")]


def test_user_errors_are_one_line_and_a_hint(tmp_path: Path, pg_server: PostgresServer) -> None:
    r = cli("capture", "--source", "shop", "--topic", "t", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "pymetaq cdc: --source 'shop' is not a database URL",
        "hint: e.g. postgresql://postgres@127.0.0.1:5432/shop or sqlite:///replica.db",
    ]
    r = cli("capture", "--source", "postgresql://postgres@127.0.0.1:1/x", "--topic", "t",
            cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.startswith("pymetaq cdc: the source database: connection failed"), r.stderr
    assert r.stderr.rstrip().endswith("hint: is it running, and is the URL right?")
    r = cli("apply", "--topic", "a b", cwd=tmp_path)
    assert r.returncode == 2 and "pymetaq cdc: " in r.stderr and "a b" in r.stderr
    r = cli("apply", "--topic", "t", "--batch-transactions", "0", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        2,
        "pymetaq cdc: --batch-transactions must be at least 1, not 0\n",
    )
    # a slot of another plugin is refused, not read
    execute(pg_server.url, "SELECT pg_create_logical_replication_slot('other_plugin', 'pgoutput')")
    try:
        r = cli("capture", "--source", pg_server.url, "--slot", "other_plugin", "--topic", "t",
                "--servers", "meta://127.0.0.1:1", cwd=tmp_path)  # fmt: skip
        assert r.returncode == 1
        assert "slot 'other_plugin' is a logical slot of plugin 'pgoutput'" in r.stderr
    finally:
        execute(pg_server.url, "SELECT pg_drop_replication_slot('other_plugin')")
