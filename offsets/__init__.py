"""pymetaq.offsets: where consumer groups keep their positions.

- :class:`FileOffsetStore` — MetaQ's LocalOffsetStorage JSON file (one consumer process per
  group; broadcast consumers, embedded use).
- :class:`SqlOffsetStore` — a SQL table via SQLAlchemy 2 (SQLite embedded default, PostgreSQL),
  with :meth:`SqlOffsetStore.commit_in` for exactly-once writes into the same database.
- :class:`ZkOffsetStore` — MetaQ's ZooKeeper layout (needs the ``zk`` extra: kazoo).

Every store implements :class:`OffsetStore`; ``commit`` never moves an offset backwards,
``reset`` may.  :func:`open_offset_store` builds one from a URL-like string.
"""

from __future__ import annotations

from pymetaq.offsets.base import (
    CorruptOffsetData,
    OffsetEntry,
    OffsetStore,
    OffsetStoreError,
    OffsetStoreUnavailable,
    partition_key,
    split_partition_key,
)
from pymetaq.offsets.file import FileOffsetStore
from pymetaq.offsets.sql import SqlOffsetStore, configure_sqlite, create_sqlite_engine

__all__ = [
    "CorruptOffsetData",
    "FileOffsetStore",
    "OffsetEntry",
    "OffsetStore",
    "OffsetStoreError",
    "OffsetStoreUnavailable",
    "SqlOffsetStore",
    "ZkOffsetStore",
    "configure_sqlite",
    "create_sqlite_engine",
    "open_offset_store",
    "partition_key",
    "split_partition_key",
]


def __getattr__(name: str) -> object:
    if name == "ZkOffsetStore":  # lazy: kazoo is an optional dependency
        from pymetaq.offsets.zk import ZkOffsetStore

        return ZkOffsetStore
    raise AttributeError(name)


def open_offset_store(spec: str) -> OffsetStore:
    """``file:<path>`` | ``sqlite:///<path>`` | ``postgresql+psycopg://…`` |
    ``zk://host:port[,host:port][/root]``.

    A ``zk://`` spec means what it means everywhere else (``servers=``, ``pymetaq cluster``):
    the ZooKeeper servers and the registry root (MetaQ's ``zk.zkRoot``, ``/meta`` when no path
    is given), so offsets live under ``<root>/consumers/<group>/offsets``."""
    if spec.startswith("file:"):
        return FileOffsetStore(spec[len("file:") :])
    if spec.startswith(("sqlite", "postgresql")):
        return SqlOffsetStore(spec)
    if spec.startswith("zk://"):
        from pymetaq.client.protocol.zk import parse_zk_url
        from pymetaq.offsets.zk import ZkOffsetStore

        url = parse_zk_url(spec)
        return ZkOffsetStore(url.hosts, root=url.root)
    raise ValueError(f"unknown offset store {spec!r} (file:, sqlite:, postgresql+psycopg:, zk://)")
