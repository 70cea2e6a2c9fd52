"""The offset-store contract shared by every implementation: values, protocol, errors.

An offset is the next byte position a consumer group fetches from a partition; ``msg_id`` is
the id of the last consumed message (MetaQ stores the pair as ``"<msgId>-<offset>"``).  A
partition is named by MetaQ's key ``"<brokerId>-<partition>"``.

Rules every store follows:

- ``load`` of an unknown (group, topic, partition) returns ``None``.
- ``commit`` never moves an offset backwards: a stale or equal offset is ignored.  When one
  call carries several entries for the same partition, the highest offset wins.
- ``reset`` sets offsets exactly, backwards included (operator tool: ``offsets reset``).

Errors: :class:`OffsetStoreError` and its subclasses are client errors
(:class:`pymetaq.client.errors.MetaClientError`), so one ``except MetaClientError`` covers a
consumer and its store.

Thread-safety: pure values and functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pymetaq.client.errors import MetaClientError


@dataclass(frozen=True)
class OffsetEntry:
    """One committed position of a group in one partition."""

    topic: str
    partition: str  # MetaQ's partition key "<brokerId>-<partition>"
    offset: int  # next byte position to fetch
    msg_id: int = -1  # id of the last consumed message

    @property
    def key(self) -> tuple[str, str]:
        return self.topic, self.partition


@runtime_checkable
class OffsetStore(Protocol):
    """Where a consumer group keeps its positions."""

    def load(self, group: str, topic: str, partition: str) -> OffsetEntry | None: ...

    def load_all(self, group: str) -> list[OffsetEntry]: ...

    def commit(self, group: str, entries: Iterable[OffsetEntry]) -> None: ...

    def reset(self, group: str, entries: Iterable[OffsetEntry]) -> None: ...

    def close(self) -> None: ...


class OffsetStoreError(MetaClientError):
    """Base of every offset-store fault; ``retriable`` says whether retrying may succeed."""

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class OffsetStoreUnavailable(OffsetStoreError):
    """The backing service (database, ZooKeeper, disk) failed; the commit may be retried."""

    retriable = True


class CorruptOffsetData(OffsetStoreError):
    """Stored offset data cannot be parsed."""

    retriable = False


def split_partition_key(partition: str) -> tuple[int, int]:
    """``"<brokerId>-<partition>"`` -> (brokerId, partition); ValueError if malformed."""
    broker, sep, part = partition.rpartition("-")
    if not sep or not broker:
        raise ValueError(f"partition key must be '<brokerId>-<partition>', got {partition!r}")
    return int(broker), int(part)


def partition_key(broker_id: int, partition: int) -> str:
    """(brokerId, partition) -> MetaQ's partition key ``"<brokerId>-<partition>"``."""
    return f"{broker_id}-{partition}"


def newest(entries: Iterable[OffsetEntry]) -> dict[tuple[str, str], OffsetEntry]:
    """The highest-offset entry per (topic, partition); a later entry wins a tie."""
    best: dict[tuple[str, str], OffsetEntry] = {}
    for e in entries:
        if e.offset < 0:
            raise ValueError(f"negative offset in {e!r}")
        cur = best.get(e.key)
        if cur is None or e.offset >= cur.offset:
            best[e.key] = e
    return best


def last_wins(entries: Iterable[OffsetEntry]) -> dict[tuple[str, str], OffsetEntry]:
    """The last entry per (topic, partition) (``reset`` semantics)."""
    out: dict[tuple[str, str], OffsetEntry] = {}
    for e in entries:
        if e.offset < 0:
            raise ValueError(f"negative offset in {e!r}")
        out[e.key] = e
    return out
