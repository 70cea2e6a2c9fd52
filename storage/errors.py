"""The storage engine's exceptions: one base class, each with a ``retriable`` attribute.

::

    StorageError (retriable=False)
    ├── InvalidRecords        the batch is malformed (framing, CRC, id 0, too many records);
    │                         nothing written
    ├── UnknownTopic          no topic configuration matches
    ├── InvalidTopic          the name cannot be a partition directory (a separator, ``.``/``..``,
    │                         a path leaving the data directory, another log's directory)
    ├── PartitionOutOfRange   partition >= the topic's num_partitions
    ├── LogFailed             an fsync (or an unexpected write error) failed; the log refuses
    │                         appends until the broker restarts (its page cache is suspect)
    ├── ResourceExhausted     a transient shortage (descriptors, memory); nothing written (retriable)
    │   └── DiskFull          no space, or free space below the reserve; nothing written (retriable)
    ├── DurabilityTimeout     append_sync gave up waiting (retriable: the append may still land)
    ├── LogClosed             the log or manager was closed (retriable: another broker may serve)
    ├── CorruptLogError       a partition's files are inconsistent (gap, overlap, unreadable)
    │   └── PartitionFenced   ... so the partition was fenced at open: errors for it, the rest
    │                         of the broker serves (``pymetaq check`` / ``pymetaq repair``)
    └── DataDirError          the data directory cannot be used (not writable, not a directory)
        └── DataDirLocked     another process holds the data directory's lock (``pid``)

Expected outcomes (no data, out of range) are :class:`pymetaq.storage.log.ReadStatus` values,
never exceptions.  Thread-safe: immutable exception classes.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every storage fault."""

    retriable: bool = False


class InvalidRecords(StorageError):
    """A batch whose framing or checksums are wrong; ``offset`` is the bad record's position
    within the batch (-1 when the batch as a whole is rejected)."""

    def __init__(self, reason: str, offset: int = -1) -> None:
        super().__init__(f"invalid records at batch offset {offset}: {reason}")
        self.reason = reason
        self.offset = offset


class UnknownTopic(StorageError):
    """No ``[topic=...]`` configuration matches the topic."""


class PartitionOutOfRange(StorageError):
    """The partition number is outside ``[0, num_partitions)``."""


class InvalidTopic(StorageError):
    """The topic name cannot name a partition directory of this store."""


class LogFailed(StorageError):
    """An earlier fsync (or an unexpected write error) failed; the log accepts no more appends
    until reopened (after a failed fsync the kernel may have dropped the dirty pages)."""


class ResourceExhausted(StorageError):
    """A transient shortage of an OS resource (descriptors, memory): nothing was written, the
    log stays healthy, and the same append may succeed later."""

    retriable = True


class DiskFull(ResourceExhausted):
    """No space for the write (ENOSPC/EDQUOT), or free space below ``min_free_disk_bytes``."""


class DurabilityTimeout(StorageError):
    """``append_sync`` timed out before the write was durable (it may still become durable)."""

    retriable = True


class LogClosed(StorageError):
    """The log (or its manager) is closed."""

    retriable = True


class CorruptLogError(StorageError):
    """The on-disk log cannot be opened safely (e.g. a gap between segments)."""


class PartitionFenced(CorruptLogError):
    """The partition was found damaged at open and is fenced: appends and reads fail until an
    operator runs ``pymetaq repair`` (or restores the files) and restarts the broker."""


class DataDirError(StorageError):
    """The data directory cannot be used (missing and not creatable, not writable, ...)."""


class DataDirLocked(DataDirError):
    """Another process (``pid``, 0 if unknown) holds the data directory's lock."""

    def __init__(self, message: str, pid: int = 0) -> None:
        super().__init__(message)
        self.pid = pid
