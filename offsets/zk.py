"""Offsets in ZooKeeper, MetaQ's default layout (kazoo).

| path                                                      | kind       | value            |
|-----------------------------------------------------------|------------|------------------|
| ``<root>/consumers/<group>/offsets/<topic>/<partition>``  | persistent | ``msgId-offset`` |

``root`` is ``/meta`` by default; ``partition`` is ``"<brokerId>-<partition>"``.  The value is
UTF-8 text ``"<lastMsgId>-<offset>"`` (pre-1.4 MetaQ wrote just ``"<offset>"``); it is parsed at
the last ``-``, so a msgId of ``-1`` reads back (``"-1-1024"``).

A commit is a compare-and-set per partition (read with its version, write with that version,
retry on a concurrent change), so the offset never moves backwards even with several writers.

Thread-safety: kazoo clients are thread-safe; so is this store.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pymetaq.client.errors import MissingDependency
from pymetaq.client.protocol import zk as layout
from pymetaq.offsets.base import (
    CorruptOffsetData,
    OffsetEntry,
    OffsetStoreUnavailable,
    last_wins,
    newest,
)

DEFAULT_ROOT = layout.DEFAULT_ROOT
CAS_ATTEMPTS = 100


def encode_value(entry: OffsetEntry) -> bytes:
    return layout.encode_offset(entry.msg_id, entry.offset)


def decode_value(raw: bytes) -> tuple[int, int]:
    """``b"<msgId>-<offset>"`` or legacy ``b"<offset>"`` -> (msg_id, offset)."""
    try:
        return layout.decode_offset(raw)
    except ValueError as e:
        raise CorruptOffsetData(f"bad offset value {raw[:80]!r}") from e


class ZkOffsetStore:
    """Offsets under ``<root>/consumers/<group>/offsets`` in ZooKeeper."""

    def __init__(
        self,
        hosts: str | None = None,
        *,
        client: Any = None,
        root: str = DEFAULT_ROOT,
        timeout_s: float = 10.0,
    ) -> None:
        try:
            from kazoo.client import KazooClient
        except ImportError as e:  # the ``zk`` extra is not installed
            raise MissingDependency("ZkOffsetStore", "kazoo", "zk") from e

        if (hosts is None) == (client is None):
            raise ValueError("give exactly one of hosts or client")
        self._owns_client = client is None
        self.client = client if client is not None else KazooClient(hosts=hosts)
        if self._owns_client:
            self.client.start(timeout=timeout_s)
        self.paths = layout.ZkPaths(root)
        self._closed = False

    def _path(self, group: str, topic: str = "", partition: str = "") -> str:
        if partition:
            return self.paths.offset(group, topic, partition)
        return self.paths.offsets(group, topic)

    def load(self, group: str, topic: str, partition: str) -> OffsetEntry | None:
        from kazoo.exceptions import KazooException, NoNodeError

        try:
            raw, _stat = self.client.get(self._path(group, topic, partition))
        except NoNodeError:
            return None
        except KazooException as e:
            raise OffsetStoreUnavailable(f"zookeeper: {e!r}") from e
        msg_id, offset = decode_value(raw)
        return OffsetEntry(topic, partition, offset, msg_id)

    def load_all(self, group: str) -> list[OffsetEntry]:
        from kazoo.exceptions import KazooException, NoNodeError

        out: list[OffsetEntry] = []
        try:
            topics = sorted(self.client.get_children(self._path(group)))
        except NoNodeError:
            return []
        except KazooException as e:
            raise OffsetStoreUnavailable(f"zookeeper: {e!r}") from e
        for topic in topics:
            try:
                parts = sorted(self.client.get_children(self._path(group, topic)))
            except NoNodeError:
                continue
            for part in parts:
                entry = self.load(group, topic, part)
                if entry is not None:
                    out.append(entry)
        return out

    def commit(self, group: str, entries: Iterable[OffsetEntry]) -> None:
        for e in newest(entries).values():
            self._set(group, e, forward_only=True)

    def reset(self, group: str, entries: Iterable[OffsetEntry]) -> None:
        for e in last_wins(entries).values():
            self._set(group, e, forward_only=False)

    def _set(self, group: str, e: OffsetEntry, *, forward_only: bool) -> None:
        from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

        path = self._path(group, e.topic, e.partition)
        value = encode_value(e)
        try:
            for _ in range(CAS_ATTEMPTS):
                try:
                    raw, stat = self.client.get(path)
                except NoNodeError:
                    try:
                        self.client.create(path, value, makepath=True)
                        return
                    except NodeExistsError:
                        continue
                if forward_only and decode_value(raw)[1] >= e.offset:
                    return
                try:
                    self.client.set(path, value, version=stat.version)
                    return
                except (BadVersionError, NoNodeError):
                    continue
        except KazooException as ex:
            raise OffsetStoreUnavailable(f"zookeeper: {ex!r}") from ex
        raise OffsetStoreUnavailable(f"{path}: too many concurrent updates")

    def close(self) -> None:
        if self._owns_client and not self._closed:
            self._closed = True
            self.client.stop()
            self.client.close()
