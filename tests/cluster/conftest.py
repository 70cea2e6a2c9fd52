"""Fixtures for the cluster tests: kazoo clients on a fresh chroot of the session ZooKeeper,
a private ZooKeeper that a test may restart, and small tree helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests._services import ZooKeeperServer, expire_session


def new_client(hosts: str, session_timeout_s: float = 4.0) -> Any:
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    retry = KazooRetry(max_tries=-1, delay=0.05, backoff=1.5, max_delay=0.5)
    client = KazooClient(hosts=hosts, timeout=session_timeout_s, connection_retry=retry)
    client.start(timeout=15)
    return client


@pytest.fixture
def zk(zk_hosts: str) -> Iterator[Any]:
    """An admin kazoo client on this test's chroot (``zk_hosts``)."""
    client = new_client(zk_hosts)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def clients(zk_hosts: str) -> Iterator[Callable[..., Any]]:
    """A factory of extra kazoo clients on this test's chroot, closed at teardown."""
    made: list[Any] = []

    def make(session_timeout_s: float = 4.0) -> Any:
        c = new_client(zk_hosts, session_timeout_s)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()
        c.close()


@pytest.fixture
def private_zk() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this test's own (it may be stopped and restarted)."""
    server = ZooKeeperServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def tree(client: Any, path: str) -> dict[str, bytes]:
    """Every node under ``path`` (inclusive) -> its data."""
    from kazoo.exceptions import NoNodeError

    out: dict[str, bytes] = {}
    try:
        data, _ = client.get(path)
        children = sorted(client.get_children(path))
    except NoNodeError:  # deleted meanwhile
        return out
    out[path] = data
    for child in children:
        out.update(tree(client, f"{path}/{child}"))
    return out


def ephemerals(client: Any, path: str) -> dict[str, bytes]:
    """The ephemeral nodes under ``path`` -> data."""
    from kazoo.exceptions import NoNodeError

    out: dict[str, bytes] = {}
    for p, data in tree(client, path).items():
        try:
            stat = client.exists(p)
        except NoNodeError:
            continue
        if stat is not None and stat.ephemeralOwner:
            out[p] = data
    return out


__all__ = ["ephemerals", "expire_session", "new_client", "tree"]
