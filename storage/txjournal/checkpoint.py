"""Checkpoint files: where the next replay of the transaction journal starts.

``<dir>/checkpoint.<n>`` (``n`` increasing) holds two lines::

    {"file": 3, "offset": 8, "next_tid": 17}
    9f3c2a1b

the JSON of a :class:`Checkpoint` and the CRC32 (hex) of that first line.  A checkpoint is
written to ``checkpoint.<n>.tmp``, fsynced, renamed and the directory fsynced, so it is either
whole or absent; the newest valid one wins and the ``max_checkpoints`` newest are kept (MetaQ's
``maxCheckpoints``).  Every byte goes through the storage :class:`~pymetaq.storage.disk.Disk`
seam, so a fault-injecting disk covers checkpoints too.

Thread-safety: functions; the journal serialises writers.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zlib
from dataclasses import dataclass

from pymetaq.storage.disk import Disk

log = logging.getLogger(__name__)

PREFIX = "checkpoint."
_NAME = re.compile(r"^checkpoint\.(\d+)$")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Replay starts at ``offset`` of journal file ``file``; ``next_tid`` is the first unused
    transaction number."""

    file: int
    offset: int
    next_tid: int


def _numbers(directory: str) -> list[int]:
    out = []
    for name in os.listdir(directory):
        m = _NAME.match(name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def _parse(raw: bytes) -> Checkpoint | None:
    lines = raw.split(b"\n")
    if len(lines) < 2 or f"{zlib.crc32(lines[0]):08x}".encode() != lines[1].strip():
        return None
    try:
        obj = json.loads(lines[0])
        cp = Checkpoint(int(obj["file"]), int(obj["offset"]), int(obj["next_tid"]))
    except (ValueError, KeyError, TypeError):
        return None
    return cp if cp.file >= 1 and cp.offset >= 0 and cp.next_tid >= 1 else None


def read_latest(directory: str) -> tuple[Checkpoint | None, int]:
    """The newest valid checkpoint (None if there is none) and the highest number in use."""
    numbers = _numbers(directory)
    for n in reversed(numbers):
        path = os.path.join(directory, f"{PREFIX}{n}")
        try:
            with open(path, "rb") as f:
                cp = _parse(f.read(4096))
        except OSError as exc:
            log.warning("cannot read %s: %s", path, exc)
            continue
        if cp is not None:
            return cp, numbers[-1]
        log.warning("ignoring damaged transaction checkpoint %s", path)
    return None, numbers[-1] if numbers else 0


def write(disk: Disk, directory: str, number: int, cp: Checkpoint, keep: int) -> None:
    """Write ``checkpoint.<number>`` durably, then delete all but the ``keep`` newest."""
    line = json.dumps({"file": cp.file, "offset": cp.offset, "next_tid": cp.next_tid})
    raw = line.encode() + f"\n{zlib.crc32(line.encode()):08x}\n".encode()
    final = os.path.join(directory, f"{PREFIX}{number}")
    tmp = final + ".tmp"
    if os.path.exists(tmp):
        disk.unlink(tmp)
    f = disk.create(tmp, 0)
    try:
        f.write_at(0, raw)
        f.sync()
    finally:
        f.close()
    disk.rename(tmp, final)
    disk.sync_dir(directory)
    old = [n for n in _numbers(directory) if n < number]
    for n in old[: max(0, len(old) - (keep - 1))]:
        disk.unlink(os.path.join(directory, f"{PREFIX}{n}"))
