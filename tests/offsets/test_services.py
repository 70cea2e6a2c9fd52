"""The service helpers in tests/_services.py behave as the fixtures rely on."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from tests._services import (
    PostgresServer,
    ServiceUnavailable,
    ZooKeeperServer,
    expire_session,
    four_letter,
)

DEADLINE_S = 30.0


def test_forced_missing_binaries_raise_service_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYMETAQ_FORCE_MISSING", "postgresql,zookeeper")
    with pytest.raises(ServiceUnavailable):
        PostgresServer()
    with pytest.raises(ServiceUnavailable):
        ZooKeeperServer()


@pytest.mark.pg
def test_pg_server_has_prepared_transactions_and_drops_in_doubt_databases(
    pg_server: PostgresServer,
) -> None:
    name = pg_server.create_database()
    eng = sa.create_engine(pg_server.url_for(name), poolclass=sa.NullPool)
    try:
        with eng.connect() as c:
            assert int(c.exec_driver_sql("SHOW max_prepared_transactions").scalar_one()) > 0
        conn = eng.connect()
        tx = conn.begin_twophase("pymetaq-test.in-doubt")
        conn.exec_driver_sql("CREATE TABLE x (i int)")
        tx.prepare()
        conn.invalidate()  # leaves the branch in doubt (close() would roll it back)
    finally:
        eng.dispose()
    admin = sa.create_engine(pg_server.url, poolclass=sa.NullPool)
    try:
        with admin.connect() as c:
            dbs = "SELECT database FROM pg_prepared_xacts WHERE gid = 'pymetaq-test.in-doubt'"
            assert c.exec_driver_sql(dbs).scalars().all() == [name]
        pg_server.drop_database(name)
        with admin.connect() as c:
            assert c.exec_driver_sql(dbs).scalars().all() == []
            exists = c.exec_driver_sql(
                "SELECT count(*) FROM pg_database WHERE datname = %(n)s", {"n": name}
            ).scalar_one()
            assert exists == 0
    finally:
        admin.dispose()


@pytest.mark.zk
def test_zk_server_serves_and_expire_session_expires(zk_server: ZooKeeperServer) -> None:
    from kazoo.client import KazooClient, KazooState

    assert "Mode: standalone" in four_letter(zk_server.port, "srvr")
    client = KazooClient(hosts=zk_server.hosts, timeout=4.0)
    lost = threading.Event()
    client.add_listener(lambda state: lost.set() if state == KazooState.LOST else None)
    client.start(timeout=10)
    try:
        client.create("/eph-test", b"x", ephemeral=True)
        old_session = client.client_id[0]
        expire_session(zk_server, client)
        assert lost.wait(DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        while not (client.connected and client.client_id[0] != old_session):
            assert time.monotonic() < deadline, "kazoo did not open a new session"
            time.sleep(0.05)
        assert client.exists("/eph-test") is None  # the ephemeral went with the session
    finally:
        client.stop()
        client.close()
