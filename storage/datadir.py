"""The data directory as a whole: its exclusive lock and its clean-shutdown marker.

**Lock.**  ``<dataPath>/.lock`` holds the pid of the process that owns the directory, under an
exclusive ``flock``: a second broker (or ``pymetaq repair``) on the same directory is refused
with the holder's pid, instead of trimming segments the first one is writing.  The kernel drops
the lock when its holder dies, so a crashed broker never leaves a stale lock; the pid in the
file is only informative.  Taking the lock also proves the directory is writable (a read-only
or unwritable directory is refused at start with the reason).

**Clean-shutdown marker.**  ``<dataPath>/.clean_shutdown``, written (tmp + fsync + rename) after
every log was flushed and trimmed, removed at open.  JSON::

    {"version": 2, "max_msg_id": <highest id issued>, "time": <epoch s>,
     "logs": {"<partition directory>": [<last segment start>, <its size>, <crc32 of its last
              4096 bytes>], ...}}

A partition is trusted without a scan only if its entry matches its last segment's current
size and trailing bytes, so a stale marker, a truncated or extended file, or a torn tail after
a clean stop is still scanned.  A marker that does not parse (or an old one without ``logs``)
is ignored with a warning: every partition is scanned.

Thread-safety: used by the manager's open/close only.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass, field

from pymetaq.storage.disk import fsync_dir
from pymetaq.storage.errors import DataDirError, DataDirLocked
from pymetaq.storage.scan import TailState

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
CLEAN_MARKER = ".clean_shutdown"
MARKER_VERSION = 2


class DataDirLock:
    """An exclusive ``flock`` on ``<directory>/.lock`` carrying the holder's pid."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self) -> None:
        """Create the directory if needed, prove it writable, take the lock; or raise
        :class:`DataDirError` / :class:`DataDirLocked` with a message for a person."""
        d = self.directory
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise DataDirError(f"data directory {d} cannot be created: {e.strerror}") from e
        if not os.path.isdir(d):
            raise DataDirError(f"data directory {d} is not a directory")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise DataDirError(
                f"data directory {d} is not writable ({e.strerror}); the broker stores its "
                "logs there: fix the permissions or the mount, or choose another dataPath"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = holder_pid(self.path)
            os.close(fd)
            who = f"pid {pid}" if pid else "another process"
            raise DataDirLocked(
                f"data directory {d} is in use by another pymetaq process ({who}); stop it "
                "first, or give this broker its own dataPath",
                pid,
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, b"%d\n" % os.getpid(), 0)
            _probe_writable(d)
        except OSError as e:
            os.close(fd)
            raise DataDirError(f"data directory {d} is not writable: {e.strerror}") from e
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1


def holder_pid(path: str) -> int:
    """The pid written in a lock file (0 if unreadable)."""
    try:
        with open(path, "rb") as f:
            return int(f.read(32).strip() or 0)
    except (OSError, ValueError):
        return 0


def lock_holder(directory: str) -> int | None:
    """The pid holding ``directory``'s lock (0 if unknown), or None if nobody holds it."""
    path = os.path.join(directory, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return holder_pid(path)
    finally:
        os.close(fd)
    return None


def _probe_writable(directory: str) -> None:
    """Create and remove a file: ``os.access`` says yes to root on a read-only mount."""
    probe = os.path.join(directory, f".probe-{os.getpid()}")
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    os.close(fd)
    os.unlink(probe)


@dataclass
class Marker:
    """A parsed clean-shutdown marker (``present`` False: none, or ignored)."""

    present: bool = False
    max_msg_id: int = 0
    logs: dict[str, TailState] = field(default_factory=dict)

    def entry(self, directory: str) -> TailState | None:
        return self.logs.get(os.path.realpath(directory))


def take_marker(data_path: str) -> Marker:
    """Read and remove ``<data_path>/.clean_shutdown``; a bad one is ignored with a warning."""
    path = os.path.join(data_path, CLEAN_MARKER)
    try:
        with open(path, "rb") as f:
            raw = f.read(64 << 20)
    except FileNotFoundError:
        return Marker()
    try:
        marker = _parse_marker(raw)
    except (ValueError, TypeError, KeyError) as e:
        log.warning(
            "%s: ignoring the clean-shutdown marker (%s): scanning every partition", path, e
        )
        marker = Marker()
    os.unlink(path)
    return marker


def _parse_marker(raw: bytes) -> Marker:
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object: {raw[:40]!r}")
    max_id = doc.get("max_msg_id", 0)
    if not isinstance(max_id, int) or isinstance(max_id, bool) or max_id < 0:
        raise ValueError(f"bad max_msg_id {max_id!r}")
    logs = doc.get("logs")
    if doc.get("version") != MARKER_VERSION or not isinstance(logs, dict):
        raise ValueError("an old or unknown format (no per-partition tail records)")
    entries = {}
    for directory, entry in logs.items():
        start, size, crc = entry
        if not all(isinstance(v, int) and v >= 0 for v in (start, size, crc)):
            raise ValueError(f"bad entry for {directory!r}: {entry!r}")
        entries[str(directory)] = TailState(start, size, crc)
    return Marker(True, max_id, entries)


def write_marker(data_path: str, max_msg_id: int, logs: dict[str, TailState]) -> None:
    """Write the marker durably (tmp + fsync + rename + directory fsync)."""
    path = os.path.join(data_path, CLEAN_MARKER)
    tmp = path + ".tmp"
    state = {
        "version": MARKER_VERSION,
        "max_msg_id": max_msg_id,
        "time": time.time(),
        "logs": {d: [t.start, t.size, t.crc] for d, t in logs.items()},
    }
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(data_path)
