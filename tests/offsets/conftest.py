"""Fixtures for the offset-store tests: a store spec parametrized over every implementation."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pymetaq.offsets import OffsetStore, open_offset_store

BACKENDS = [
    pytest.param("file", id="file"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.pg),
    pytest.param("zk", id="zk", marks=pytest.mark.zk),
]
SQL_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.pg),
]


def _spec(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    kind = request.param
    if kind == "file":
        return "file:" + str(tmp_path_factory.mktemp("off") / "meta_offsets.json")
    if kind == "sqlite":
        return "sqlite:///" + str(tmp_path_factory.mktemp("off") / "offsets.db")
    if kind == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    if kind == "zk":
        return "zk://" + str(request.getfixturevalue("zk_hosts")) + "/meta"
    raise AssertionError(kind)


@pytest.fixture(params=BACKENDS)
def store_spec(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A spec string for :func:`open_offset_store` naming a fresh, empty store."""
    return _spec(request, tmp_path_factory)


@pytest.fixture(params=SQL_BACKENDS)
def sql_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh SQLite file or PostgreSQL database URL."""
    return _spec(request, tmp_path_factory)


@pytest.fixture
def open_store(store_spec: str) -> Iterator[Callable[[], OffsetStore]]:
    """Opens stores on the same backing storage; closes them all at teardown."""
    opened: list[OffsetStore] = []

    def factory() -> OffsetStore:
        store = open_offset_store(store_spec)
        opened.append(store)
        return store

    yield factory
    for s in opened:
        s.close()
