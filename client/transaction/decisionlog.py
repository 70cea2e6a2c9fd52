"""The coordinator's decision log: a file of fsynced commit decisions.

Presumed abort: only a **commit** decision is written, and it is durable (fsynced) before any
participant is told to commit; a global transaction without a decision in the log was never
committed anywhere, so recovery rolls back its prepared branches. Completion records are
written without fsync: losing one only makes recovery commit again, which finds the branches
already committed.

Why a file and not a table: the decision must be durable on its own, before any participant
commits, whatever the participants are; a table in the participating database would be a
third transaction in the resource being coordinated (and unavailable exactly when that
database is), while a local file costs one fsync, shared by concurrent commits (group commit),
and is the one thing the coordinator process owns. Keep it on a disk that survives the host
(the decisions of in-doubt branches are in it).

**Layout** (text, one record a line, UTF-8)::

    pymetaq-decision-log 1 <coordinator name>\\n          header
    C <gtrid hex> <broker id> <crc>\\n                     commit decided
    D <gtrid hex> <crc>\\n                                 every branch committed (done)
    H <gtrid hex> <branch> <outcome> <crc>\\n              a heuristic outcome was found

``<crc>`` is 8 lowercase hex digits of ``zlib.crc32`` of the line before it (without the space).
A crash can tear only the tail (everything before an acknowledged decision is fsynced with it):
the first line that does not check ends the log and is cut away at open; a valid **commit**
record after it means the file was damaged elsewhere, and the log refuses to open
(:class:`DecisionLogError`) rather than let recovery presume an abort.

The file is locked (``flock``, exclusive) while open: one coordinator process per log.
When every decision is done the file is rewritten (temp file, fsync, rename, fsync of the
directory) once it is larger than ``compact_bytes``.

Thread-safety: every method is thread-safe (appends under a lock; fsyncs are shared).
"""

from __future__ import annotations

import fcntl
import os
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from pymetaq.client.transaction.errors import DecisionLogError

MAGIC = "pymetaq-decision-log"
VERSION = 1
COMPACT_BYTES = 1 << 20


def _line(text: str) -> bytes:
    return f"{text} {zlib.crc32(text.encode()):08x}\n".encode()


def _check(raw: bytes) -> str | None:
    """The record text of a stored line, or None if it is torn or damaged."""
    if not raw.endswith(b"\n"):
        return None
    try:
        text, _, crc = raw[:-1].decode("utf-8").rpartition(" ")
    except UnicodeDecodeError:
        return None
    if not text or len(crc) != 8 or f"{zlib.crc32(text.encode()):08x}" != crc:
        return None
    return text


@dataclass
class LogState:
    """What a replay finds: the decisions not yet done, and the heuristics recorded."""

    pending: dict[str, int] = field(default_factory=dict)  # gtrid hex -> broker id
    heuristics: list[tuple[str, str, str]] = field(default_factory=list)
    cut_bytes: int = 0


class DecisionLog:
    """The append-only decision file (see the module docstring)."""

    def __init__(
        self, path: str | os.PathLike[str], name: str, compact_bytes: int = COMPACT_BYTES
    ) -> None:
        self.path = Path(path)
        self.name = name
        self.compact_bytes = compact_bytes
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._written = 0
        self._synced = 0
        self._fd = -1
        self.state = LogState()

    # -- open / replay ------------------------------------------------------------------------
    def open(self) -> LogState:
        """Lock and replay the file (created if missing); returns what is pending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DecisionLogError(
                f"decision log {self.path} is in use by another coordinator process"
            ) from None
        try:
            self.state = self._replay(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self.state

    def _replay(self, fd: int) -> LogState:
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0) if size else b""
        header = _line(f"{MAGIC} {VERSION} {self.name}")
        if not data:
            os.write(fd, header)
            os.fsync(fd)
            _fsync_dir(self.path.parent)
            return LogState()
        lines = data.splitlines(keepends=True)
        head = _check(lines[0])
        if head is None or not head.startswith(MAGIC + " "):
            raise DecisionLogError(f"{self.path} is not a pymetaq decision log")
        _, version, name = [*head.split(" ", 2), "", ""][:3]
        if version != str(VERSION) or name != self.name:
            raise DecisionLogError(
                f"{self.path} belongs to coordinator {name!r} (log version {version}), "
                f"not {self.name!r}"
            )
        state, good = LogState(), len(lines[0])
        for i, raw in enumerate(lines[1:], start=1):
            text = _check(raw)
            if text is None:
                if any((t := _check(r)) is not None and t.startswith("C ") for r in lines[i + 1 :]):
                    raise DecisionLogError(
                        f"{self.path}: damaged record {i + 1} before later commit decisions; "
                        f"refusing to guess (restore the file or decide by hand)"
                    )
                break
            _apply(state, text)
            good += len(raw)
        if good < size:
            state.cut_bytes = size - good
            os.ftruncate(fd, good)
            os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_END)
        return state

    # -- records ------------------------------------------------------------------------------
    def decide_commit(self, gtrid: str, broker_id: int) -> None:
        """Write the commit decision and return once it is on disk (group commit)."""
        self._append(f"C {gtrid} {broker_id}", durable=True)

    def done(self, gtrid: str) -> None:
        """Every branch of ``gtrid`` is committed (not fsynced: see the module docstring)."""
        self._append(f"D {gtrid}", durable=False)

    def heuristic(self, gtrid: str, branch: str, outcome: str) -> None:
        self._append(f"H {gtrid} {branch} {outcome}", durable=True)

    def _append(self, text: str, *, durable: bool) -> None:
        with self._lock:
            if self._fd < 0:
                raise DecisionLogError(f"decision log {self.path} is closed")
            os.write(self._fd, _line(text))
            _apply(self.state, text)
            self._written += 1
            mine = self._written
        if durable:
            self._sync(mine)

    def _sync(self, mine: int) -> None:
        with self._sync_lock:
            if self._synced >= mine:
                return  # another thread's fsync (or a compaction) covered this record
            with self._lock:
                target, fd = self._written, self._fd
            os.fsync(fd)
            self._synced = target

    def pending(self) -> dict[str, int]:
        with self._lock:
            return dict(self.state.pending)

    def compact(self) -> bool:
        """Rewrite the file with only what is still pending (and the heuristic records), if it
        grew past ``compact_bytes``."""
        with self._sync_lock, self._lock:
            if self._fd < 0 or os.fstat(self._fd).st_size < self.compact_bytes:
                return False
            tmp = self.path.with_name(self.path.name + ".tmp")
            body = _line(f"{MAGIC} {VERSION} {self.name}")
            body += b"".join(_line(f"C {g} {b}") for g, b in self.state.pending.items())
            body += b"".join(_line(f"H {g} {b} {o}") for g, b, o in self.state.heuristics)
            with open(tmp, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            fd = os.open(tmp, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
            os.lseek(fd, 0, os.SEEK_END)
            old, self._fd = self._fd, fd
            os.close(old)
            self._synced = self._written  # the new file holds (durably) every record
            return True

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1


def _apply(state: LogState, text: str) -> None:
    kind, _, rest = text.partition(" ")
    parts = rest.split(" ")
    if kind == "C" and len(parts) == 2:
        state.pending[parts[0]] = int(parts[1])
    elif kind == "D" and len(parts) == 1:
        state.pending.pop(parts[0], None)
    elif kind == "H" and len(parts) == 3:
        state.heuristics.append((parts[0], parts[1], parts[2]))
    else:
        raise DecisionLogError(f"unknown decision log record {text!r}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
