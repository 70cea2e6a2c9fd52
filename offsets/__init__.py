"""pymetaq.offsets: where consumer groups keep their positions.

- :class:`FileOffsetStore` — MetaQ's LocalOffsetStorage JSON file (one consumer process per
  group; broadcast consumers, embedded use).
- :class:`SqlOffsetStore` — a SQL table via SQLAlchemy 2 (SQLite embedded default, PostgreSQL),
  with :meth:`SqlOffsetStore.commit_in` for exactly-once writes into the same database.
- :class:`ZkOffsetStore` — MetaQ's ZooKeeper layout (needs the ``zk`` extra: kazoo).

Every store implements :class:`OffsetStore`; ``commit`` never moves an offset backwards,
``reset`` may.  :func:`open_offset_store` builds one from a URL-like string.

The SQL and ZooKeeper stores are imported on first use (PEP 562), so importing the package (and
the consumer, whose default is the file store) never loads SQLAlchemy or kazoo; without their
extra (``sql``/``pg``, ``zk``) using them raises
:class:`~pymetaq.client.errors.MissingDependency` naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pymetaq.offsets.base import (
    CorruptOffsetData,
    OffsetEntry,
    OffsetStore,
    OffsetStoreError,
    OffsetStoreUnavailable,
    partition_key,
    split_partition_key,
)
from pymetaq.offsets.file import FileOffsetStore, default_path

if TYPE_CHECKING:
    from pymetaq.offsets.sql import SqlOffsetStore, configure_sqlite, create_sqlite_engine
    from pymetaq.offsets.zk import ZkOffsetStore

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
    "default_path",
    "open_offset_store",
    "partition_key",
    "split_partition_key",
]


#: lazily imported name -> its module (SQLAlchemy and kazoo are optional dependencies)
_LAZY = {
    "SqlOffsetStore": "pymetaq.offsets.sql",
    "configure_sqlite": "pymetaq.offsets.sql",
    "create_sqlite_engine": "pymetaq.offsets.sql",
    "ZkOffsetStore": "pymetaq.offsets.zk",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pymetaq.offsets' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def open_offset_store(spec: str) -> OffsetStore:
    """``file:<path>`` | ``sqlite:///<path>`` | ``postgresql+psycopg://…`` |
    ``zk://host:port[,host:port][/root]``.

    A ``zk://`` spec means what it means everywhere else (``servers=``, ``pymetaq cluster``):
    the ZooKeeper servers and the registry root (MetaQ's ``zk.zkRoot``, ``/meta`` when no path
    is given), so offsets live under ``<root>/consumers/<group>/offsets``."""
    if spec.startswith("file:"):
        return FileOffsetStore(spec[len("file:") :])
    if spec.startswith(("sqlite", "postgresql")):
        from pymetaq.offsets.sql import SqlOffsetStore

        return SqlOffsetStore(spec)
    if spec.startswith("zk://"):
        from pymetaq.client.protocol.zk import parse_zk_url
        from pymetaq.offsets.zk import ZkOffsetStore

        url = parse_zk_url(spec)
        return ZkOffsetStore(url.hosts, root=url.root)
    raise ValueError(f"unknown offset store {spec!r} (file:, sqlite:, postgresql+psycopg:, zk://)")
