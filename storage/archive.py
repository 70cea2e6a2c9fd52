"""Archived segments: writing them (retention's ``archive`` policy) and reading them back.

MetaQ's ``archive,N`` renames a segment to ``<seg>.meta.arc``; ``archive,N,true`` zips it to
``<seg>.meta.zip``.  pymetaq compresses with an **lz4 frame** instead (``<seg>.meta.lz4``):
lz4 is already a dependency and decompresses fast enough to replay.  The archive holds the
segment's bytes unchanged, so its records are MetaQ records starting at the offset in the name.

Public API: :func:`read_archived` (the bytes), :func:`iter_archived` (decoded records with
their original offsets), :func:`archived_start` (the start offset from a file name).

Thread-safe: pure functions over files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import lz4.frame

from pymetaq.storage.disk import Disk
from pymetaq.storage.record import Record, iter_records
from pymetaq.storage.segment import (
    ARCHIVE_SUFFIX,
    LZ4_SUFFIX,
    SUFFIX,
    parse_segment_name,
    segment_path,
)

_CHUNK = 1 << 20


def archived_start(path: str) -> int:
    """The start offset encoded in an archived (or live) segment file name."""
    name = os.path.basename(path)
    for suffix in (LZ4_SUFFIX, ARCHIVE_SUFFIX, SUFFIX):
        start = parse_segment_name(name, suffix)
        if start is not None:
            return start
    raise ValueError(f"{path!r} is not a segment or archived segment file name")


def read_archived(path: str) -> bytes:
    """The original segment bytes of a ``.meta.arc``, ``.meta.lz4`` (or ``.meta``) file."""
    if path.endswith(LZ4_SUFFIX):
        with lz4.frame.open(path, "rb") as f:
            data: bytes = f.read()
            return data
    with open(path, "rb") as f:
        return f.read()


def iter_archived(path: str, *, verify: bool = True) -> Iterator[Record]:
    """The records of an archived segment, with their absolute offsets."""
    yield from iter_records(read_archived(path), archived_start(path), verify=verify)


def compress_segment(disk: Disk, src: str, directory: str, start: int) -> str:
    """Write ``src`` (the segment starting at ``start``) as an lz4 frame ``<start>.meta.lz4``
    (tmp + fsync + rename), then unlink ``src``."""
    dst = segment_path(directory, start, LZ4_SUFFIX)
    tmp = dst + ".tmp"
    with open(src, "rb") as fin, lz4.frame.open(tmp, "wb") as fout:
        while chunk := fin.read(_CHUNK):
            fout.write(chunk)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    disk.rename(tmp, dst)
    disk.sync_dir(directory)
    disk.unlink(src)
    disk.sync_dir(directory)
    return dst
