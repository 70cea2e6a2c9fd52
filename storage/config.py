"""Storage configuration values: the global :class:`StoreConfig` and per-topic
:class:`TopicStoreConfig`, plus the parser of MetaQ's ``deletePolicy`` strings.

Thread-safe: frozen dataclasses and pure functions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class TopicStoreConfig:
    """Per-topic settings (MetaQ's ``[topic=...]`` section, defaults from ``[system]``)."""

    num_partitions: int = 1
    unflush_threshold: int = 1000  # 0 => group commit (ack after the covering fsync)
    unflush_interval_ms: int = 10000
    delete_policy: str = "delete,168"
    delete_when: str = "0 0 6,18 * * ?"
    data_path: str | None = None  # per-topic override of StoreConfig.data_path

    @property
    def group_commit(self) -> bool:
        return self.unflush_threshold <= 0


@dataclass(frozen=True)
class StoreConfig:
    """Broker-wide storage settings (MetaQ's ``[system]`` section)."""

    data_path: str
    broker_id: int = 0
    max_segment_size: int = 1 << 30
    max_transfer_size: int = 1 << 20
    #: refuse appends while a data directory's filesystem has less free space (0 = no check;
    #: the broker's ``[system] minFreeDiskBytes``), see :mod:`pymetaq.storage.space`
    min_free_disk_bytes: int = 0


class RetentionKind(enum.Enum):
    DELETE = "delete"
    ARCHIVE = "archive"


@dataclass(frozen=True)
class DeletePolicy:
    """A parsed ``deletePolicy``: ``delete,N`` or ``archive,N[,true]``.

    ``N`` is hours, or carries a unit suffix ``s``/``m``/``h`` (MetaQ: ``delete,10m``).
    """

    kind: RetentionKind
    keep_seconds: float
    compress: bool = False


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_delete_policy(text: str) -> DeletePolicy:
    """Parse ``delete,168`` / ``delete,10m`` / ``archive,24,true``; ValueError if malformed."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 2 or parts[0].lower() not in ("delete", "archive"):
        raise ValueError(f"bad deletePolicy {text!r}: expected delete,N or archive,N[,true]")
    kind = RetentionKind(parts[0].lower())
    amount = parts[1].lower()
    unit = 3600.0
    if amount and amount[-1] in _UNITS:
        unit = _UNITS[amount[-1]]
        amount = amount[:-1]
    try:
        keep = float(int(amount)) * unit
    except ValueError:
        raise ValueError(f"bad deletePolicy {text!r}: {parts[1]!r} is not N[s|m|h]") from None
    if keep < 0:
        raise ValueError(f"bad deletePolicy {text!r}: negative retention")
    compress = False
    if len(parts) > 2:
        if kind is not RetentionKind.ARCHIVE or len(parts) > 3:
            raise ValueError(f"bad deletePolicy {text!r}: extra fields")
        compress = parts[2].lower() == "true"
    return DeletePolicy(kind, keep, compress)
