"""A local, append-only disk spool of messages: the client's retry and hold-back store.

Used by the consumer's recover policy (``<recover_dir>/<topic>@<group>/``: messages whose
processing failed, re-fed later) and by the ordered producer (``<dir>/<topic>@<partition>/``:
messages held back while a partition is unavailable, sent later in order).  It plays the part
of MetaQ's store4j journal, in pymetaq's own format.

A spool is a directory of journal files ``<firstKey:020d>.spool``.  Each file is a sequence of
frames; a frame *is* a storage record (``pymetaq.storage.record``: length, CRC32 of the data,
an 8-byte id, a flag), so framing and checksums are shared with the broker's logs:

| offset | size | field    | meaning                                                  |
|-------:|-----:|----------|----------------------------------------------------------|
| 0      | 4    | length   | int32, length of ``body``                                |
| 4      | 4    | checksum | int32, ``CRC32(body) & 0x7FFFFFFF``                      |
| 8      | 8    | key      | int64, the spool key the frame is about                  |
| 16     | 4    | type     | int32, 1 = ADD, 2 = REMOVE                               |
| 20     | len  | body     | ADD: the layout below; REMOVE: empty                     |

ADD body (big-endian):

| size | field     | meaning                                                    |
|-----:|-----------|------------------------------------------------------------|
| 2    | topic_len | uint16                                                     |
| n    | topic     | UTF-8                                                      |
| 2    | part_len  | uint16                                                     |
| m    | partition | UTF-8, e.g. MetaQ's ``"<brokerId>-<partition>"`` ('' unknown)|
| 8    | offset    | int64, the message's log offset (-1 unknown)               |
| 4    | attempts  | int32, delivery attempts so far                            |
| rest | record    | the message as one storage record (header + data)          |

Keys are increasing integers, so key order is insertion order.  A REMOVE frame is written into
the file that holds the key's ADD, so every file is self-contained; when every ADD in a file is
removed, the file is deleted (compaction).  A new file starts when the active one passes
``max_file_bytes``.  On open, each file is replayed; a torn or corrupt tail (a crash
mid-write) is cut off and reported in :attr:`Spool.recovery`, never silently kept.

One process per spool directory (an ``flock`` on ``<dir>/.lock`` enforces it).  Thread-safe:
every method takes the spool's lock.  Pending messages are also held in memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pymetaq.client.errors import SpoolClosed, SpoolFull, SpoolLocked
from pymetaq.storage.record import CorruptRecordError, Record, encode_record, iter_records

FRAME_ADD = 1
FRAME_REMOVE = 2
SUFFIX = ".spool"
_META = struct.Struct(">qi")  # offset, attempts
_STR_LEN = struct.Struct(">H")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpoolConfig:
    max_file_bytes: int = 64 << 20  # roll to a new journal file past this size
    fsync: bool = True  # fsync after every append/remove (durable before returning)
    max_entries: int = 500_000  # MetaQ's local message store limit


@dataclass(frozen=True)
class SpoolEntry:
    """A pending message: its spool key, the record bytes and where it came from."""

    key: int
    record: bytes  # one complete storage-format record
    topic: str = ""
    partition: str = ""
    offset: int = -1
    attempts: int = 0

    def message(self) -> Record:
        """The record decoded (msg_id, flag, data)."""
        return next(iter_records(self.record))


@dataclass(frozen=True)
class SpoolRecovery:
    """What opening the spool found: files read, entries pending, bytes cut off as torn."""

    files: int
    entries: int
    truncated_bytes: int
    truncated_files: tuple[str, ...] = ()


@dataclass
class _File:
    path: Path
    fd: int
    size: int
    live: set[int] = field(default_factory=set)


def _encode_add(entry: SpoolEntry) -> bytes:
    topic = entry.topic.encode("utf-8")
    part = entry.partition.encode("utf-8")
    body = b"".join(
        (
            _STR_LEN.pack(len(topic)),
            topic,
            _STR_LEN.pack(len(part)),
            part,
            _META.pack(entry.offset, entry.attempts),
            entry.record,
        )
    )
    frame: bytes = encode_record(body, FRAME_ADD, entry.key)
    return frame


def _decode_add(key: int, body: bytes) -> SpoolEntry:
    pos = 0
    fields = []
    for _ in range(2):
        (n,) = _STR_LEN.unpack_from(body, pos)
        fields.append(body[pos + 2 : pos + 2 + n].decode("utf-8"))
        pos += 2 + n
    offset, attempts = _META.unpack_from(body, pos)
    record = body[pos + _META.size :]
    return SpoolEntry(key, record, fields[0], fields[1], offset, attempts)


def _check_record(record: bytes) -> None:
    try:
        recs = list(iter_records(record))
    except CorruptRecordError as e:
        raise ValueError(f"not a valid storage record: {e}") from e
    if len(recs) != 1 or recs[0].size != len(record):
        raise ValueError("append() takes exactly one complete storage record")


class Spool:
    """An append-only, crash-safe journal of pending messages (see the module docstring)."""

    def __init__(
        self, directory: str | os.PathLike[str], config: SpoolConfig | None = None
    ) -> None:
        self.dir = Path(directory)
        self.config = config or SpoolConfig()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._lock_fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SpoolLocked(f"{self.dir} is open in another process") from None
        self._entries: dict[int, SpoolEntry] = {}
        self._where: dict[int, _File] = {}
        self._files: list[_File] = []
        self._next_key = 1
        self._closed = False
        self.recovery = self._load()

    # ------------------------------------------------------------------ constructors

    @classmethod
    def for_consumer(
        cls,
        recover_dir: str | os.PathLike[str],
        topic: str,
        group: str,
        config: SpoolConfig | None = None,
    ) -> Spool:
        """The recover store of a consumer group: ``<recover_dir>/<topic>@<group>/``."""
        return cls(Path(recover_dir) / f"{topic}@{group}", config)

    @classmethod
    def for_producer(
        cls,
        directory: str | os.PathLike[str],
        topic: str,
        partition: int | str,
        config: SpoolConfig | None = None,
    ) -> Spool:
        """The ordered producer's local store: ``<dir>/<topic>@<partition>/``."""
        return cls(Path(directory) / f"{topic}@{partition}", config)

    # ------------------------------------------------------------------ public API

    def append(
        self,
        record: bytes,
        *,
        topic: str = "",
        partition: str | int = "",
        offset: int = -1,
        attempts: int = 0,
    ) -> int:
        """Journal one message record; return its key (durable on return if ``fsync``)."""
        record = bytes(record)
        _check_record(record)
        with self._lock:
            self._check_open()
            if len(self._entries) >= self.config.max_entries:
                raise SpoolFull(f"{self.dir}: {len(self._entries)} pending messages")
            key = self._next_key
            entry = SpoolEntry(key, record, topic, str(partition), offset, attempts)
            f = self._active_file(key)
            self._write(f, _encode_add(entry))
            self._next_key = key + 1
            self._entries[key] = entry
            self._where[key] = f
            f.live.add(key)
            return key

    def remove(self, key: int) -> bool:
        """Mark a message done; False if the key is not pending.  May delete its file."""
        with self._lock:
            self._check_open()
            f = self._where.get(key)
            if f is None:
                return False
            self._write(f, encode_record(b"", FRAME_REMOVE, key))
            del self._entries[key]
            del self._where[key]
            f.live.discard(key)
            if not f.live:
                self._delete_file(f)
            return True

    def retry(self, key: int) -> int | None:
        """Move a pending message to the end with ``attempts + 1``; return the new key.

        The new copy is journaled before the old one is removed, so a crash in between leaves
        the message twice (at-least-once), never zero times.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            new_key = self.append(
                entry.record,
                topic=entry.topic,
                partition=entry.partition,
                offset=entry.offset,
                attempts=entry.attempts + 1,
            )
            self.remove(key)
            return new_key

    def get(self, key: int) -> SpoolEntry | None:
        with self._lock:
            return self._entries.get(key)

    def pending(self) -> list[SpoolEntry]:
        """A snapshot of the pending messages in insertion order."""
        with self._lock:
            return list(self._entries.values())

    def __iter__(self) -> Iterator[SpoolEntry]:
        return iter(self.pending())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def files(self) -> list[Path]:
        """The journal files currently on disk, oldest first."""
        with self._lock:
            return [f.path for f in self._files]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for f in self._files:
                os.close(f.fd)
            self._files.clear()
            os.close(self._lock_fd)  # releases the flock

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise SpoolClosed(f"{self.dir}: spool is closed")

    def _load(self) -> SpoolRecovery:
        paths = sorted(p for p in self.dir.iterdir() if p.name.endswith(SUFFIX))
        truncated, torn_files = 0, []
        for path in paths:
            first_key = int(path.name[: -len(SUFFIX)])
            self._next_key = max(self._next_key, first_key + 1)
            buf = path.read_bytes()
            f = _File(path, -1, 0)
            good = 0
            try:
                for rec in iter_records(buf):
                    self._apply(f, rec)
                    good = rec.offset + rec.size
            except CorruptRecordError:
                pass
            if good < len(buf):
                log.warning("spool %s: cut a torn tail of %d bytes", path, len(buf) - good)
                truncated += len(buf) - good
                torn_files.append(path.name)
                os.truncate(path, good)
            f.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            f.size = good
            self._files.append(f)
            if not f.live:
                self._delete_file(f)
        return SpoolRecovery(len(paths), len(self._entries), truncated, tuple(torn_files))

    def _apply(self, f: _File, rec: Record) -> None:
        key = rec.msg_id
        self._next_key = max(self._next_key, key + 1)
        if rec.flag == FRAME_ADD:
            entry = _decode_add(key, rec.data)
            self._entries[key] = entry
            self._where[key] = f
            f.live.add(key)
        elif rec.flag == FRAME_REMOVE:
            self._entries.pop(key, None)
            self._where.pop(key, None)
            f.live.discard(key)
        else:
            raise CorruptRecordError(rec.offset, f"unknown spool frame type {rec.flag}")

    def _active_file(self, key: int) -> _File:
        if self._files and self._files[-1].size < self.config.max_file_bytes:
            return self._files[-1]
        path = self.dir / f"{key:020d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        f = _File(path, fd, 0)
        self._files.append(f)
        self._fsync_dir()
        return f

    def _write(self, f: _File, frame: bytes) -> None:
        """Append one frame; on failure cut the file back so no torn frame precedes later ones."""
        view = memoryview(frame)
        try:
            while view:
                n = os.write(f.fd, view)
                view = view[n:]
            if self.config.fsync:
                os.fsync(f.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(f.fd, f.size)
            raise
        f.size += len(frame)

    def _delete_file(self, f: _File) -> None:
        os.close(f.fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f.path)
        self._files.remove(f)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        if not self.config.fsync:
            return
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
