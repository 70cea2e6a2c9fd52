"""pytest fixtures for real services, loaded by ``pytest_plugins = ["tests._fixtures"]``.

- ``pg_server`` (session): a :class:`tests._services.PostgresServer`.
- ``pg_url`` (function): a SQLAlchemy URL of a fresh database, dropped at teardown after its
  in-doubt prepared transactions are rolled back.
- ``zk_server`` (session): a :class:`tests._services.ZooKeeperServer`.
- ``zk_hosts`` (function): a kazoo hosts string chrooted to a fresh ``/t-<uuid>`` path.

A missing binary skips the test on a developer box and fails it with ``CI=true`` or
``REQUIRE_SERVICES=1`` (an all-skipped CI run would otherwise pass silently).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests._services import PostgresServer, ServiceUnavailable, ZooKeeperServer, service_status

REQUIRE = os.environ.get("REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true"


def _unavailable(msg: str) -> None:
    if REQUIRE:
        pytest.fail(f"required service unavailable: {msg}", pytrace=False)
    pytest.skip(msg)


def pytest_report_header(config: pytest.Config) -> str:
    found = ", ".join(f"{k}: {v}" for k, v in service_status().items())
    return f"services ({'required' if REQUIRE else 'optional'}): {found}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    error = None
    try:
        server = PostgresServer()
    except ServiceUnavailable as e:
        error = str(e)
    if error is not None:
        _unavailable(error)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    name = pg_server.create_database()
    try:
        yield pg_server.url_for(name)
    finally:
        pg_server.drop_database(name)


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    error = None
    try:
        server = ZooKeeperServer()
    except ServiceUnavailable as e:
        error = str(e)
    if error is not None:
        _unavailable(error)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_hosts(zk_server: ZooKeeperServer) -> Iterator[str]:
    """Hosts string chrooted to a fresh path; the path is deleted afterwards."""
    from kazoo.client import KazooClient

    root = f"/t-{uuid.uuid4().hex}"
    admin = KazooClient(hosts=zk_server.hosts)
    admin.start(timeout=10)
    try:
        admin.ensure_path(root)
        yield zk_server.hosts + root
        admin.delete(root, recursive=True)
    finally:
        admin.stop()
        admin.close()
