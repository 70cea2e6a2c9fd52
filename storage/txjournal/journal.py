"""The transaction journal's files: appends, the fsync policy, rolling, replay, deletion.

One sequential stream of files ``<dir>/redo.<n>`` (MetaQ's names; ``n`` from 1 up), each
starting with the magic of :mod:`~pymetaq.storage.txjournal.format` followed by framed records.
Appends go to the newest file; once it holds ``file_size`` bytes the next append starts
``redo.<n+1>`` (created, directory fsynced) and ``on_roll`` is called so the owner can
checkpoint.  Files before the newest checkpoint are deleted by :meth:`delete_before`.

Durability (``flushTxLogAtCommit``, MetaQ's values):

- ``1`` (default): :meth:`sync` completes its callback after the fdatasync that covers the
  position, run by the journal's syncer thread; every caller waiting at that moment shares one
  fsync round (group commit).  A round fsyncs every file with unsynced bytes, oldest first, so
  a position counts as durable only when everything before it is.
- ``0``: callbacks complete at once (the OS writes the pages back); ``2``: at once, and the
  syncer fsyncs once a second.  In every mode each record is written with ``pwrite`` before
  ``append`` returns, so a process crash loses nothing; a power loss may lose up to a second
  (mode 2) or more (mode 0) of the log.

Replay (:meth:`replay`) reads from the newest valid checkpoint, file by file.  The first
invalid frame ends the journal: its file is cut there and every later file deleted (with the
policy above, nothing after a torn frame was ever acknowledged, because acknowledgements wait
for fsyncs that cover everything before them).  A frame with a valid CRC that does not decode
is corruption the CRC cannot explain: :class:`JournalCorrupt`, and the broker does not start.

Thread-safety: :meth:`append`, :meth:`sync`, :meth:`force` and :meth:`delete_before` may be
called from any thread (one lock for the file list and positions, one for fsync rounds; the
fsyncs run outside the first); :meth:`replay` runs once, before anything else.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from pymetaq.storage.disk import Disk, SegmentFile
from pymetaq.storage.txjournal import checkpoint as cpfile
from pymetaq.storage.txjournal.format import FRAME_SIZE, MAGIC, FormatError, Record, decode
from pymetaq.storage.txjournal.format import read_frame as _read_frame

log = logging.getLogger(__name__)

PREFIX = "redo."
_NAME = re.compile(r"^redo\.(\d+)$")
_READ_CHUNK = 4 << 20

SyncCallback = Callable[[BaseException | None], None]


class JournalError(Exception):
    """The transaction journal cannot be written (retriable: another try may succeed)."""

    retriable = True


class JournalFailed(JournalError):
    """An fsync of the journal failed: nothing more is accepted until the broker restarts."""

    retriable = False


class JournalCorrupt(Exception):
    """The journal holds a checksummed record that does not decode: the broker must not start."""

    retriable = False


class JournalPos(NamedTuple):
    """A byte position in the journal: (file number, offset in that file)."""

    file: int
    offset: int


@dataclass(frozen=True)
class JournalConfig:
    directory: str  # <dataLogPath>/transactions
    file_size: int = 64 << 20  # MetaQ's meta.tx_journal_file_size
    flush_at_commit: int = 1  # flushTxLogAtCommit: 0, 1 or 2
    max_checkpoints: int = 3
    flush_every_s: float = 1.0  # mode 2

    def __post_init__(self) -> None:
        if self.flush_at_commit not in (0, 1, 2):
            raise ValueError(f"flushTxLogAtCommit must be 0, 1 or 2, not {self.flush_at_commit}")


@dataclass
class ReplayReport:
    """What reading the journal found and what it discarded."""

    directory: str
    checkpoint: JournalPos | None = None
    files: list[str] = field(default_factory=list)
    records: int = 0
    bytes_read: int = 0
    bytes_cut: int = 0
    files_dropped: list[str] = field(default_factory=list)


class _File:
    __slots__ = ("file", "number", "path", "synced", "written")

    def __init__(self, number: int, path: str, file: SegmentFile, written: int) -> None:
        self.number, self.path, self.file = number, path, file
        self.written = self.synced = written


class TxJournal:
    """The redo journal of one broker (see the module docstring)."""

    def __init__(self, config: JournalConfig, disk: Disk) -> None:
        self.config = config
        self._disk = disk
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._files: list[_File] = []
        self._waiters: list[tuple[JournalPos, SyncCallback]] = []
        self._durable = JournalPos(0, 0)
        self._failed: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self.on_roll: Callable[[], None] | None = None
        self.checkpoint: cpfile.Checkpoint | None = None
        self._cp_number = 0

    # -- replay --------------------------------------------------------------------------------
    def replay(self, visit: Callable[[JournalPos, Record], None]) -> ReplayReport:
        """Call ``visit(start, record)`` for every record from the newest checkpoint on; cut a
        torn tail; leave the journal ready for appends."""
        d = self.config.directory
        os.makedirs(d, exist_ok=True)
        report = ReplayReport(d)
        self.checkpoint, self._cp_number = cpfile.read_latest(d)
        numbers = self._list()
        start = JournalPos(1, len(MAGIC))
        if self.checkpoint is not None:
            cp = JournalPos(self.checkpoint.file, self.checkpoint.offset)
            report.checkpoint = cp
            if cp.file in numbers or not numbers:
                start = cp
            else:
                log.warning("%s: checkpoint names missing redo.%d; replaying all", d, cp.file)
                start = JournalPos(numbers[0], len(MAGIC))
        stale = [n for n in numbers if n < start.file]
        for n in stale:  # before the checkpoint: a deletion that did not finish
            self._disk.unlink(self._path(n))
        live = [n for n in numbers if n >= start.file]
        for i, n in enumerate(live):
            f, cut = self._replay_file(
                n, start.offset if n == start.file else len(MAGIC), visit, report
            )
            self._files.append(f)
            if cut:
                for m in live[i + 1 :]:
                    self._disk.unlink(self._path(m))
                    report.files_dropped.append(f"{PREFIX}{m}")
                break
        if stale or report.files_dropped:
            self._disk.sync_dir(d)
        if not self._files:
            self._files.append(self._create(max(start.file, 1)))
        last = self._files[-1]
        self._durable = JournalPos(last.number, last.written)
        if report.bytes_cut or report.files_dropped:
            log.warning(
                "transaction journal: cut %d bytes, dropped %s",
                report.bytes_cut,
                report.files_dropped,
            )
        return report

    def _replay_file(
        self,
        number: int,
        offset: int,
        visit: Callable[[JournalPos, Record], None],
        report: ReplayReport,
    ) -> tuple[_File, bool]:
        path = self._path(number)
        seg = self._disk.open(path, writable=True)
        data = self._read_all(seg)
        report.files.append(f"{PREFIX}{number}")
        if data[: len(MAGIC)] != MAGIC:
            # the header is fsynced before anything in the file is acknowledged (a round syncs
            # files in order), so a file without it holds nothing durable: start it again
            log.warning("%s: no journal header; treating it and later files as torn", path)
            seg.truncate(0)
            seg.write_at(0, MAGIC)
            seg.sync()
            report.bytes_cut += len(data)
            return _File(number, path, seg, len(MAGIC)), True
        pos = max(offset, len(MAGIC))
        while True:
            body = _read_frame(data, pos)
            if body is None:
                break
            try:
                rec = decode(body)
            except FormatError as exc:
                seg.close()
                raise JournalCorrupt(f"{path}@{pos}: {exc}") from exc
            visit(JournalPos(number, pos), rec)
            report.records += 1
            pos += FRAME_SIZE + len(body)
        report.bytes_read += pos
        cut = len(data) > pos
        if cut:
            report.bytes_cut += len(data) - pos
            seg.truncate(pos)
            seg.sync()
        return _File(number, path, seg, pos), cut

    @staticmethod
    def _read_all(seg: SegmentFile) -> bytes:
        size = seg.size()
        parts, pos = [], 0
        while pos < size:
            chunk = seg.read_at(pos, min(_READ_CHUNK, size - pos))
            if not chunk:
                break
            parts.append(chunk)
            pos += len(chunk)
        return b"".join(parts)

    # -- files ---------------------------------------------------------------------------------
    def _path(self, number: int) -> str:
        return os.path.join(self.config.directory, f"{PREFIX}{number}")

    def _list(self) -> list[int]:
        out = []
        for name in os.listdir(self.config.directory):
            m = _NAME.match(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def _create(self, number: int) -> _File:
        path = self._path(number)
        if os.path.exists(path):  # left by a crash before anything in it was durable
            self._disk.unlink(path)
        seg = self._disk.create(path, 0)
        seg.write_at(0, MAGIC)
        self._disk.sync_dir(self.config.directory)
        f = _File(number, path, seg, len(MAGIC))
        f.synced = 0
        return f

    def files(self) -> list[int]:
        with self._lock:
            return [f.number for f in self._files]

    # -- appends -------------------------------------------------------------------------------
    def append(self, data: bytes) -> tuple[JournalPos, JournalPos]:
        """Write one framed record; returns (its start, its end).  Raises JournalError."""
        rolled = False
        with self._lock:
            if self._failed is not None:
                raise JournalFailed(f"transaction journal failed earlier: {self._failed}")
            if self._closed:
                raise JournalError("transaction journal is closed")
            cur = self._files[-1]
            if cur.written >= self.config.file_size:
                try:
                    cur = self._create(cur.number + 1)
                except OSError as exc:
                    raise JournalError(f"cannot start a new journal file: {exc}") from exc
                self._files.append(cur)
                rolled = True
            start = cur.written
            try:
                cur.file.write_at(start, data)
            except OSError as exc:
                self._undo(cur, start)
                raise JournalError(f"{cur.path}: write failed: {exc}") from exc
            cur.written = start + len(data)
            span = JournalPos(cur.number, start), JournalPos(cur.number, cur.written)
        if rolled and self.on_roll is not None:
            self.on_roll()
        return span

    def _undo(self, f: _File, size: int) -> None:
        """Cut a partly written record (lock held); if even that fails, the journal fails."""
        try:
            f.file.truncate(size)
        except OSError as exc:
            self._failed = exc

    def end(self) -> JournalPos:
        with self._lock:
            last = self._files[-1]
            return JournalPos(last.number, last.written)

    # -- durability ----------------------------------------------------------------------------
    def sync(self, pos: JournalPos, cb: SyncCallback) -> None:
        """``cb(None)`` once ``pos`` is durable under the policy (``cb(exc)`` if it never will
        be).  Mode 1 calls back from the syncer thread; modes 0 and 2 call back at once."""
        with self._lock:
            failed = self._failed
            if failed is None and self.config.flush_at_commit == 1 and pos > self._durable:
                self._waiters.append((pos, cb))
                self._cond.notify()
                return
        cb(failed)

    def force(self) -> None:
        """fsync everything written so far, now, on this thread (any mode)."""
        self._round()
        with self._lock:
            if self._failed is not None:
                raise JournalFailed(f"transaction journal fsync failed: {self._failed}")

    def _round(self) -> None:
        """One fsync round: every file with unsynced bytes, oldest first; then the waiters."""
        with self._sync_lock:
            with self._lock:
                if self._failed is not None:
                    waiters, self._waiters = self._waiters, []
                    exc: BaseException | None = self._failed
                    work: list[tuple[_File, int]] = []
                else:
                    work = [(f, f.written) for f in self._files if f.synced < f.written]
                    last = self._files[-1]
                    target = JournalPos(last.number, last.written)
                    exc = None
            if exc is None:
                try:
                    for f, written in work:
                        f.file.sync()
                        f.synced = max(f.synced, written)
                except OSError as e:
                    log.error("transaction journal fsync failed; transactions stop: %s", e)
                    exc = e
                with self._lock:
                    if exc is not None:
                        self._failed = exc
                        waiters, self._waiters = self._waiters, []
                    else:
                        self._durable = max(self._durable, target)
                        waiters = [w for w in self._waiters if w[0] <= self._durable]
                        self._waiters = [w for w in self._waiters if w[0] > self._durable]
        for _pos, cb in waiters:
            cb(exc)

    def start(self) -> None:
        """Start the syncer thread (modes 1 and 2)."""
        if self.config.flush_at_commit in (1, 2) and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pymetaq-txjournal", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        periodic = self.config.flush_at_commit == 2
        while True:
            with self._lock:
                if not self._waiters and not self._closed:
                    self._cond.wait(self.config.flush_every_s if periodic else None)
                if self._closed and not self._waiters:
                    return
            self._round()

    # -- checkpoints and deletion ----------------------------------------------------------------
    def write_checkpoint(self, pos: JournalPos, next_tid: int) -> None:
        """Durably record that replay may start at ``pos`` (the caller forced the journal)."""
        cp = cpfile.Checkpoint(pos.file, pos.offset, next_tid)
        with self._sync_lock:
            self._cp_number += 1
            cpfile.write(
                self._disk, self.config.directory, self._cp_number, cp, self.config.max_checkpoints
            )
            self.checkpoint = cp

    def delete_before(self, number: int) -> list[str]:
        """Close and delete every journal file older than ``number``; returns their names."""
        with self._lock:
            old = [f for f in self._files if f.number < number and f is not self._files[-1]]
            self._files = [f for f in self._files if f not in old]
        for f in old:
            f.file.close()
            self._disk.unlink(f.path)
        if old:
            self._disk.sync_dir(self.config.directory)
        return [os.path.basename(f.path) for f in old]

    def close(self) -> None:
        """Final fsync, stop the syncer, close the files."""
        if self._failed is None and self._files:
            try:
                self._round()
            except Exception:  # pragma: no cover - _round reports fsync errors itself
                log.exception("final transaction journal fsync failed")
        with self._lock:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            for f in self._files:
                f.file.close()
            self._files = []

    @property
    def failed(self) -> bool:
        return self._failed is not None
