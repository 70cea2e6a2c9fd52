"""The idempotent producers' file of one partition: which batch each producer stored where.

An idempotent ``bput`` (``docs/protocol.md``) carries a producer id and the batch's sequence
number for that producer and partition.  The broker remembers, per producer, the last few
batches it stored (sequence, first id, offset, length, count), so a retried batch is answered
with its original result instead of being appended again - also after a restart.  That memory
lives in ``<partition dir>/producers.idem``, an append-only file of fixed-size entries:

| bytes | field                                                        |
|-------|--------------------------------------------------------------|
| 16    | producer id (a UUID's 16 bytes)                              |
| 4     | sequence (int32, big-endian like the whole entry)            |
| 4     | record count of the batch                                    |
| 8     | first message id (ids are consecutive)                       |
| 8     | offset of the batch's first record                           |
| 4     | length of the batch in bytes                                 |
| 4     | CRC32 of the 44 bytes before it, & 0x7FFFFFFF                |

**Order.** An entry is written (``os.write``) while the partition log holds its lock, after
the batch was stamped and *before* its bytes are copied into the segment (the log's
``before_write`` hook), so after a process crash the data of a batch is never on disk without
its entry.  In group-commit mode the file is fdatasync'ed before the batch is acknowledged
(:meth:`ProducerFile.sync`, from the durable callback; one fsync covers every entry written
before it).  The partition log starts that fsync at the same time as its own (the file is the
log's *companion*, :class:`~pymetaq.storage.log.Companion`), so an acknowledgement waits for
the slower of the two fsyncs rather than for both one after the other; the durable callback's
:meth:`ProducerFile.sync` then finds its entry covered (its ticket, from :meth:`append`) and
returns at once.

**Recovery.** :meth:`ProducerFile.load` reads every entry whose CRC holds and cuts a torn tail.
An entry says a batch *was written*, not that it survived: :func:`batch_intact` checks it
against the log (the records at ``offset`` parse, their CRCs hold, there are ``count`` of
them in ``length`` bytes and their ids run from ``first_id``).  A batch whose data was cut by
recovery (a power loss before its fsync: it was never acknowledged) fails the check - also when
newer records have filled its range since, because their ids differ.  An entry whose data was
deleted by retention is kept (it was durable).

**Compaction.** :meth:`ProducerFile.rewrite` replaces the file with the entries still
remembered (write to ``producers.idem.new``, fdatasync, rename, fsync the directory).

Thread-safety: ``append``, ``load`` and ``rewrite`` run on the broker's loop thread; ``sync``
may run on any thread (the flusher, the companion sync's).  One lock guards the descriptor and
the counters, and is not held during an fdatasync (which runs on a duplicate of the
descriptor), so appends go on meanwhile; a second lock makes syncs one at a time.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Protocol

from pymetaq.storage.batch import count_records
from pymetaq.storage.errors import InvalidRecords
from pymetaq.storage.results import ReadStatus

FILE_NAME = "producers.idem"
ENTRY = struct.Struct(">16siiqqi")
ENTRY_SIZE = ENTRY.size + 4  # 48
_CRC = struct.Struct(">I")
_ID = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """One stored batch of one producer."""

    producer_id: str  # 32 lowercase hex digits
    sequence: int
    count: int
    first_id: int
    offset: int
    length: int

    def encode(self) -> bytes:
        head = ENTRY.pack(
            bytes.fromhex(self.producer_id),
            self.sequence,
            self.count,
            self.first_id,
            self.offset,
            self.length,
        )
        return head + _CRC.pack(zlib.crc32(head) & 0x7FFFFFFF)


def decode_entries(raw: bytes) -> tuple[list[ProducerEntry], int]:
    """The entries of a file's bytes and the length of its intact prefix (a torn or corrupt
    entry ends it)."""
    out: list[ProducerEntry] = []
    pos = 0
    while pos + ENTRY_SIZE <= len(raw):
        head = raw[pos : pos + ENTRY.size]
        (crc,) = _CRC.unpack_from(raw, pos + ENTRY.size)
        if zlib.crc32(head) & 0x7FFFFFFF != crc:
            break
        pid, seq, count, first_id, offset, length = ENTRY.unpack(head)
        out.append(ProducerEntry(pid.hex(), seq, count, first_id, offset, length))
        pos += ENTRY_SIZE
    return out, pos


class ProducerFile:
    """``producers.idem`` of one partition directory (see the module docstring)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, FILE_NAME)
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one fdatasync at a time
        self._fd = -1
        #: entries appended since this object was made (never reset: tickets for :meth:`sync`)
        self.appended = 0
        self._durable = 0  # of those, the first this many are covered by an fdatasync
        self.size = 0  # bytes in the file

    def load(self) -> list[ProducerEntry]:
        """Every intact entry, oldest first; a torn tail is cut off.  Opens the file."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                raw = b""
            entries, good = decode_entries(raw)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            if good != len(raw):
                os.ftruncate(self._fd, good)
            os.lseek(self._fd, good, os.SEEK_SET)
            self.size = good
            return entries

    def read(self) -> list[ProducerEntry]:
        """Every intact entry in the file now (any thread; the file stays as it is)."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return []
        return decode_entries(raw)[0]

    def append(self, entry: ProducerEntry) -> int:
        """Write one entry (page cache; :meth:`sync` makes it durable); returns its ticket."""
        data = entry.encode()
        with self._lock:
            if self._fd < 0:
                raise OSError(f"{self.path} is closed")
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            self.appended += 1
            self.size += ENTRY_SIZE
            return self.appended

    def pending(self) -> bool:
        """Is an entry written and not yet covered by an fdatasync?"""
        return self._durable < self.appended

    def sync(self, ticket: int | None = None) -> None:
        """fdatasync unless the entries up to ``ticket`` (default: all written) are already
        covered (any thread)."""
        with self._sync_lock:
            with self._lock:
                target = self.appended if ticket is None else ticket
                if self._fd < 0 or self._durable >= target:
                    return
                target = self.appended
                try:
                    fd = os.dup(self._fd)
                except OSError:  # no descriptor to spare: fsync under the lock, as before
                    os.fdatasync(self._fd)
                    self._durable = max(self._durable, target)
                    return
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
            with self._lock:
                self._durable = max(self._durable, target)

    def rewrite(self, entries: list[ProducerEntry]) -> None:
        """Replace the file by ``entries`` (atomically: a crash leaves the old or the new)."""
        tmp = self.path + ".new"
        data = b"".join(e.encode() for e in entries)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fdatasync(fd)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            os.replace(tmp, self.path)
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = fd
            self._durable = self.appended  # the new file holds every live entry, synced
            self.size = len(data)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class _Readable(Protocol):
    """What :func:`batch_intact` needs of a partition log."""

    @property
    def min_offset(self) -> int: ...

    def read(self, offset: int, max_size: int) -> object: ...


def batch_intact(plog: _Readable, entry: ProducerEntry) -> bool:
    """Is ``entry``'s batch in the log exactly as it was written?  (True when retention has
    deleted its segment: it was durable then.)"""
    if entry.offset < plog.min_offset:
        return True
    buf = bytearray()
    while len(buf) < entry.length:
        res = plog.read(entry.offset + len(buf), entry.length - len(buf))
        region = getattr(res, "region", None)
        if getattr(res, "status", None) is not ReadStatus.OK or region is None:
            return False
        try:
            buf += region.read_bytes()
        except OSError:
            return False
        finally:
            region.close()
    try:
        count, last_id = count_records(buf)
    except InvalidRecords:
        return False
    first_id: int = _ID.unpack_from(buf, 8)[0]
    return (
        count == entry.count
        and first_id == entry.first_id
        and last_id == entry.first_id + count - 1
    )
