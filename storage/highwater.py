"""Offsets never go backwards: a partition's high-water file and its accepted gaps.

A consumer holds byte offsets.  If the newest data of a partition disappears (a deleted
segment file, a damaged tail cut by recovery or ``pymetaq repair``), reusing those offsets for
new messages would hand consumers past the cut the middle of new records.  So:

- ``highwater`` records the durable end the log has reached.  It is rewritten in place
  (``pwrite``, no fsync) each time the durable end advances, *before* consumers can see the new
  end, so a process crash keeps it; after a power loss it may be older, which is safe: it only
  holds offsets that were already fsynced, and those survive a power loss.  Layout (30 bytes,
  text): ``<offset, 20 digits> <crc32 of those 20 digits, 8 hex digits>\\n``; a torn or foreign
  content is ignored with a warning.
- At open, if the recovered end ``E`` is below the high-water mark ``H``, the log continues at
  ``H``: the offsets ``[E, H)`` are recorded as an accepted **gap** in ``<E>.gap`` (text: ``H``),
  and a read inside a gap is answered with the next offset that holds data (the broker turns
  that into MetaQ's ``301`` with the new offset).  ``pymetaq repair`` records gaps the same way
  when it moves damaged files aside.

Thread-safety: :class:`HighWater` is written by one thread at a time (the log's sync lock);
the gap functions run at open or in the repair tool, before/without a broker.
"""

from __future__ import annotations

import logging
import os
import zlib

from pymetaq.storage.disk import fsync_dir
from pymetaq.storage.segment import GAP_SUFFIX, HIGH_WATER_FILE, parse_segment_name, segment_path

log = logging.getLogger(__name__)

_SIZE = 30


def encode_high_water(offset: int) -> bytes:
    digits = b"%020d" % offset
    return digits + b" %08x\n" % (zlib.crc32(digits) & 0xFFFFFFFF)


def read_high_water(directory: str) -> tuple[int | None, str]:
    """(the recorded high-water offset or None, a note when the file is unusable)."""
    path = os.path.join(directory, HIGH_WATER_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read(_SIZE + 1)
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"{HIGH_WATER_FILE} unreadable ({e.strerror}): ignored"
    digits = raw[:20]
    if len(raw) != _SIZE or not digits.isdigit() or raw != encode_high_water(int(digits)):
        return None, f"{HIGH_WATER_FILE} is damaged ({raw[:40]!r}): ignored"
    return int(digits), ""


class HighWater:
    """The open ``highwater`` file of one partition (one descriptor, rewritten in place)."""

    def __init__(self, directory: str, offset: int) -> None:
        self.path = os.path.join(directory, HIGH_WATER_FILE)
        self.offset = -1
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._warned = False
        self.write(offset)

    def write(self, offset: int) -> None:
        """Record ``offset`` (a write to the page cache; survives a process crash)."""
        if offset == self.offset or self._fd < 0:
            return
        try:
            os.pwrite(self._fd, encode_high_water(offset), 0)
            self.offset = offset
        except OSError as e:  # a hint, not data: never fail an append for it
            if not self._warned:
                log.warning("%s: cannot record the high-water mark: %s", self.path, e)
                self._warned = True

    def sync(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_gaps(directory: str) -> tuple[dict[int, int], list[str]]:
    """The accepted gaps ``{start: end}`` of a partition, and notes on unusable gap files."""
    gaps: dict[int, int] = {}
    notes: list[str] = []
    for name in os.listdir(directory):
        start = parse_segment_name(name, GAP_SUFFIX)
        if start is None:
            continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                end = int(f.read(64).strip())
        except (OSError, ValueError) as e:
            notes.append(f"{name} is unusable ({e}): ignored")
            continue
        if end <= start:
            notes.append(f"{name} ends at {end}, before its start: ignored")
            continue
        gaps[start] = end
    return gaps, notes


def write_gap(directory: str, start: int, end: int) -> str:
    """Durably record the accepted gap ``[start, end)`` (tmp + fsync + rename + dir fsync)."""
    path = segment_path(directory, start, GAP_SUFFIX)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, b"%d\n" % end)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)
    return path
