"""pymetaq.storage: MetaQ-compatible persistent partition logs.

Public API (see docs/internals.md, "Storage API"): configuration (:class:`StoreConfig`,
:class:`TopicStoreConfig`), :class:`MessageStoreManager`, :class:`PartitionLog`, results
(:class:`AppendResult`, :class:`ReadResult`, :class:`ReadStatus`, :class:`FileRegion`,
:class:`RecoveryReport`, :class:`RetentionAction`), :class:`IdWorker`, and the errors under
:class:`StorageError`.  Archived segments are read with :mod:`pymetaq.storage.archive`;
schedules are computed by :func:`pymetaq.storage.cron.next_fire`.

Every name is imported lazily on first access (PEP 562): importing the record format
(``pymetaq.storage.record``), as the client and the codec do, loads no storage engine.

Imports no other pymetaq package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymetaq.storage.archive import iter_archived, read_archived
    from pymetaq.storage.config import (
        DeletePolicy,
        StoreConfig,
        TopicStoreConfig,
        parse_delete_policy,
    )
    from pymetaq.storage.cron import next_fire
    from pymetaq.storage.disk import Disk, MmapDisk, SegmentFile
    from pymetaq.storage.errors import (
        CorruptLogError,
        DataDirError,
        DataDirLocked,
        DiskFull,
        DurabilityTimeout,
        InvalidRecords,
        InvalidTopic,
        LogClosed,
        LogFailed,
        PartitionFenced,
        PartitionOutOfRange,
        ResourceExhausted,
        StorageError,
        UnknownTopic,
    )
    from pymetaq.storage.ids import IdWorker
    from pymetaq.storage.log import PartitionLog
    from pymetaq.storage.manager import MessageStoreManager
    from pymetaq.storage.recovery import RecoveryReport
    from pymetaq.storage.results import AppendResult, ReadResult, ReadStatus
    from pymetaq.storage.retention import RetentionAction, RetentionActionKind
    from pymetaq.storage.segment import FileRegion
    from pymetaq.storage.truncate import TruncateReport

#: public name -> the module that defines it
_LAZY = {
    "AppendResult": "pymetaq.storage.results",
    "CorruptLogError": "pymetaq.storage.errors",
    "DataDirError": "pymetaq.storage.errors",
    "DataDirLocked": "pymetaq.storage.errors",
    "DeletePolicy": "pymetaq.storage.config",
    "Disk": "pymetaq.storage.disk",
    "DiskFull": "pymetaq.storage.errors",
    "DurabilityTimeout": "pymetaq.storage.errors",
    "FileRegion": "pymetaq.storage.segment",
    "IdWorker": "pymetaq.storage.ids",
    "InvalidRecords": "pymetaq.storage.errors",
    "InvalidTopic": "pymetaq.storage.errors",
    "LogClosed": "pymetaq.storage.errors",
    "LogFailed": "pymetaq.storage.errors",
    "MessageStoreManager": "pymetaq.storage.manager",
    "MmapDisk": "pymetaq.storage.disk",
    "PartitionFenced": "pymetaq.storage.errors",
    "PartitionLog": "pymetaq.storage.log",
    "PartitionOutOfRange": "pymetaq.storage.errors",
    "ReadResult": "pymetaq.storage.results",
    "ReadStatus": "pymetaq.storage.results",
    "RecoveryReport": "pymetaq.storage.recovery",
    "ResourceExhausted": "pymetaq.storage.errors",
    "RetentionAction": "pymetaq.storage.retention",
    "RetentionActionKind": "pymetaq.storage.retention",
    "SegmentFile": "pymetaq.storage.disk",
    "StorageError": "pymetaq.storage.errors",
    "StoreConfig": "pymetaq.storage.config",
    "TopicStoreConfig": "pymetaq.storage.config",
    "TruncateReport": "pymetaq.storage.truncate",
    "UnknownTopic": "pymetaq.storage.errors",
    "iter_archived": "pymetaq.storage.archive",
    "next_fire": "pymetaq.storage.cron",
    "parse_delete_policy": "pymetaq.storage.config",
    "read_archived": "pymetaq.storage.archive",
}

__all__ = [
    "AppendResult",
    "CorruptLogError",
    "DataDirError",
    "DataDirLocked",
    "DeletePolicy",
    "Disk",
    "DiskFull",
    "DurabilityTimeout",
    "FileRegion",
    "IdWorker",
    "InvalidRecords",
    "InvalidTopic",
    "LogClosed",
    "LogFailed",
    "MessageStoreManager",
    "MmapDisk",
    "PartitionFenced",
    "PartitionLog",
    "PartitionOutOfRange",
    "ReadResult",
    "ReadStatus",
    "RecoveryReport",
    "ResourceExhausted",
    "RetentionAction",
    "RetentionActionKind",
    "SegmentFile",
    "StorageError",
    "StoreConfig",
    "TopicStoreConfig",
    "TruncateReport",
    "UnknownTopic",
    "iter_archived",
    "next_fire",
    "parse_delete_policy",
    "read_archived",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pymetaq.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
