"""The files ``pymetaq tail`` follows: finding them, reading whole records from a byte position,
and noticing rotation.

* **Identity** is ``(st_dev, st_ino)``, the name is only where the file was last seen: a file
  renamed by ``logrotate`` (rename + create) is the same file, followed to its end through
  the descriptor the agent keeps open; a file found again under another name resumes where
  it was. A *generation* counts the times the file was truncated in place.
* **Truncation** (``copytruncate``) is noticed when the file is shorter than the position or
  the ``SIG_BYTES`` bytes just before the position are not the bytes that were read there
  (the file was truncated and has grown again past the position).
* **Head**: the first ``HEAD_BYTES`` bytes (of a followed file: as they were read). A file that is not followed yet and starts with the
  head of a followed file is taken for a copy made by ``copytruncate``; it is read from where
  the original was when it was truncated (``find_copy``), never from its start.
* **Records**: one message per line (``\\n``; a ``\\r\\n`` ending loses its ``\\r``), or with a
  start-of-record regex one message per record: a line matching it and the lines after it
  that do not. A line without its newline yet, or a record whose next start has not been
  seen, is not read; ``flush_partial`` (after ``multiline_timeout``) hands out the last
  record of a file that stopped growing.

Thread-safety: a ``FollowedFile`` belongs to one thread (the agent's reader).
"""

from __future__ import annotations

import glob
import os
import re
import zlib
from dataclasses import dataclass, field

#: bytes before the position that must still be there (else: truncated in place); more
#: than a line or two, so that lines differing only in a number still differ
SIG_BYTES = 1024
#: bytes at the start that identify a copy of a file
HEAD_BYTES = 64


def identity(st: os.stat_result) -> str:
    """``"<dev>:<ino>"``: a file's identity in the checkpoint and in message attributes."""
    return f"{st.st_dev}:{st.st_ino}"


@dataclass
class Matcher:
    """Which paths a source follows: globs, and/or a directory with a name regex (tail4j's
    ``log_base_path`` + ``log_name_regx``; a regex holding ``/`` is matched against the whole
    path, else against the file name)."""

    globs: list[str] = field(default_factory=list)
    base_dir: str | None = None
    name_regex: re.Pattern[str] | None = None

    def paths(self) -> list[str]:
        found: set[str] = set()
        for pattern in self.globs:
            found.update(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
        if self.base_dir is not None:
            base = os.path.expanduser(self.base_dir)
            try:
                entries = list(os.scandir(base))
            except OSError:
                entries = []
            for e in entries:
                if e.is_file() and self._name_ok(e.path, e.name):
                    found.add(e.path)
        return sorted(found)

    def _name_ok(self, path: str, name: str) -> bool:
        rx = self.name_regex
        if rx is None:
            return True
        return bool(rx.fullmatch(path) if "/" in rx.pattern else rx.fullmatch(name))


def locate(ident: str, last_path: str) -> str | None:
    """Where the file ``ident`` is now: its last path, or a name in the same directory (a
    renamed file); None when it is gone."""
    try:
        if identity(os.stat(last_path)) == ident:
            return last_path
    except OSError:
        pass
    directory = os.path.dirname(last_path) or "."
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False) and identity(e.stat()) == ident:
                        return e.path
                except OSError:
                    continue
    except OSError:
        return None
    return None


def read_at(fd: int, pos: int, n: int) -> bytes:
    try:
        return os.pread(fd, n, pos)
    except OSError:
        return b""


class FollowedFile:
    """One followed file: an open descriptor, the position of the first byte not yet read,
    and what is needed to notice truncation and copies."""

    def __init__(self, path: str, fd: int, ident: str, pos: int = 0, gen: int = 0) -> None:
        self.path = path
        self.fd = fd
        self.ident = ident
        self.gen = gen
        #: the next byte to read (everything before it was handed out)
        self.pos = pos
        #: acknowledged by the broker (<= pos); what the checkpoint holds
        self.acked = pos
        self.head = read_at(fd, 0, HEAD_BYTES)
        #: crc of the SIG_BYTES before ``pos`` (None: pos == 0)
        self.sig = self.sig_at(pos)
        #: the same for ``acked`` (what the checkpoint holds)
        self.acked_sig = self.sig
        #: when the file last grew / was last read, for partial-record flushing
        self.idle_since = 0.0
        #: the name no longer leads here (renamed or deleted): read to the end, then drop
        self.detached = False

    @classmethod
    def open(cls, path: str, pos: int = 0, gen: int = 0) -> FollowedFile | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        return cls(path, fd, identity(os.fstat(fd)), pos, gen)

    def sig_at(self, pos: int) -> int | None:
        if pos <= 0:
            return None
        start = max(0, pos - SIG_BYTES)
        return zlib.crc32(read_at(self.fd, start, pos - start))

    def size(self) -> int:
        try:
            return os.fstat(self.fd).st_size
        except OSError:
            return 0

    def truncated(self) -> bool:
        """The file was cut below the position (or cut and rewritten past it)."""
        if self.pos == 0:
            return False
        if self.size() < self.pos:
            return True
        return self.sig_at(self.pos) != self.sig

    def restart_truncated(self) -> int:
        """After :meth:`truncated`: start generation+1 at 0; the old position (for the copy)."""
        old = self.pos
        self.gen += 1
        self.pos = self.acked = 0
        self.sig = None
        self.head = b""  # known again from what is read of the new generation
        return old

    def read_tail(self, size: int, n: int = 65536) -> bytes:
        """The up to ``n`` bytes before ``size``."""
        start = max(0, size - n)
        return read_at(self.fd, start, size - start)

    def read_chunk(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` from the position (not consumed: see :meth:`advance`)."""
        return read_at(self.fd, self.pos, max_bytes)

    def advance(self, data: bytes) -> None:
        """``data`` (read at the position) is handed out: move past it. The head is kept from
        what was read (a later read of the file's start may see a newer generation)."""
        if self.pos < HEAD_BYTES:
            self.head = (self.head[: self.pos] + data)[:HEAD_BYTES]
        self.pos += len(data)
        self.sig = self.sig_at(self.pos)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def split_lines(data: bytes) -> tuple[list[bytes], int]:
    """Whole lines of ``data`` (endings removed) and the bytes they used (a last line without
    its newline is left for later)."""
    end = data.rfind(b"\n") + 1
    if end == 0:
        return [], 0
    lines = data[: end - 1].split(b"\n")
    if b"\r" in data:
        lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
    return lines, end


def split_records(
    data: bytes, start: re.Pattern[bytes], final: bool = False
) -> tuple[list[bytes], int]:
    """Multi-line records of ``data``: each begins at a line matching ``start`` (lines before
    the first such line form a record of their own). The last record is handed out only when
    ``final`` (the file stopped growing), as it may still get lines. Returns (records, bytes
    used); a record keeps its inner newlines and loses the last one."""
    lines, used = split_lines(data)
    if not lines:
        return [], 0
    records: list[bytes] = []
    current: list[bytes] = []
    offsets: list[int] = []  # byte position where each line begins
    pos = 0
    for ln in lines:
        offsets.append(pos)
        pos += len(ln) + 1
    raw = data[:used]
    rec_start_pos = 0
    for i, ln in enumerate(lines):
        if start.match(ln) and current:
            records.append(b"\n".join(current))
            current = []
            rec_start_pos = offsets[i]
        current.append(ln)
    if final:
        records.append(b"\n".join(current))
        return records, used
    if not records:
        return [], 0
    # the last record (from rec_start_pos) stays unread; map back to raw byte positions
    consumed = _raw_position(raw, rec_start_pos, lines, offsets)
    return records, consumed


def _raw_position(raw: bytes, logical: int, lines: list[bytes], offsets: list[int]) -> int:
    """Byte position in ``raw`` of the line that begins at ``logical`` in the stripped text
    (``\\r\\n`` endings make the two differ)."""
    if b"\r" not in raw:
        return logical
    idx = offsets.index(logical)
    pos = 0
    for _ in range(idx):
        pos = raw.index(b"\n", pos) + 1
    return pos
