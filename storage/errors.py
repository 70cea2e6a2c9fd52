"""The storage engine's exceptions: one base class, each with a ``retriable`` attribute.

::

    StorageError (retriable=False)
    ├── InvalidRecords        the batch is malformed (framing, CRC, too many records); nothing written
    ├── UnknownTopic          no topic configuration matches
    ├── PartitionOutOfRange   partition >= the topic's num_partitions
    ├── LogFailed             a write or fsync failed earlier; the log refuses further appends
    ├── DurabilityTimeout     append_sync gave up waiting (retriable: the append may still land)
    ├── LogClosed             the log or manager was closed (retriable: another broker may serve)
    └── CorruptLogError       segments are not contiguous / unreadable at open (startup must stop)

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


class LogFailed(StorageError):
    """An earlier write or fsync failed; the log accepts no more appends until reopened."""


class DurabilityTimeout(StorageError):
    """``append_sync`` timed out before the write was durable (it may still become durable)."""

    retriable = True


class LogClosed(StorageError):
    """The log (or its manager) is closed."""

    retriable = True


class CorruptLogError(StorageError):
    """The on-disk log cannot be opened safely (e.g. a gap between segments)."""
