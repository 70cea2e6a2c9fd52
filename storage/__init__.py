"""pymetaq.storage: MetaQ-compatible persistent partition logs.

Public API (see docs/internals.md, "Storage API"): configuration (:class:`StoreConfig`,
:class:`TopicStoreConfig`), :class:`MessageStoreManager`, :class:`PartitionLog`, results
(:class:`AppendResult`, :class:`ReadResult`, :class:`ReadStatus`, :class:`FileRegion`,
:class:`RecoveryReport`, :class:`RetentionAction`), :class:`IdWorker`, and the errors under
:class:`StorageError`.  Archived segments are read with :mod:`pymetaq.storage.archive`;
schedules are computed by :func:`pymetaq.storage.cron.next_fire`.

Imports no other pymetaq package.
"""

from pymetaq.storage.archive import iter_archived, read_archived
from pymetaq.storage.config import DeletePolicy, StoreConfig, TopicStoreConfig, parse_delete_policy
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
    "UnknownTopic",
    "iter_archived",
    "next_fire",
    "parse_delete_policy",
    "read_archived",
]
