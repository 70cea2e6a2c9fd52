"""Shared helpers for the storage tests: building batches, reading a whole log back."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from pymetaq.storage import (
    MessageStoreManager,
    PartitionLog,
    ReadStatus,
    StoreConfig,
    TopicStoreConfig,
)
from pymetaq.storage.record import Record, encode_record, iter_records
from tests._helpers import wait_for


def batch(payloads: Iterable[bytes]) -> bytearray:
    """A batch of complete records (ids 0, as a producer sends them)."""
    out = bytearray()
    for p in payloads:
        out += encode_record(p)
    return out


def settle(plog: PartitionLog) -> None:
    """Wait until everything written is durable (threshold mode flushes periodically)."""
    wait_for(lambda: plog.max_offset == plog.write_offset)


def read_all(
    plog: PartitionLog, start: int | None = None, chunk: int = 4096, *, wait: bool = True
) -> list[Record]:
    """Every durable record from ``start`` (default min_offset) to max_offset, via read()
    (following a gap's out-of-range answer forward, as a consumer follows a 301)."""
    if wait:
        settle(plog)
    pos = plog.min_offset if start is None else start
    out: list[Record] = []
    while True:
        res = plog.read(pos, chunk)
        if res.status is ReadStatus.NO_DATA:
            return out
        if res.status is ReadStatus.OUT_OF_RANGE and res.offset > pos:  # a gap: move on (301)
            pos = res.offset
            continue
        assert res.status is ReadStatus.OK, res
        assert res.region is not None
        with res.region as region:
            data = region.read_bytes()
        recs = list(iter_records(data, pos))
        if not recs:  # a record bigger than chunk: ask for more
            chunk *= 2
            continue
        out += recs
        pos = recs[-1].offset + recs[-1].size


def manager(
    path: str,
    *,
    threshold: int = 0,
    interval_ms: int = 10000,
    segment: int = 1 << 20,
    start: bool = True,
    writes: str = "pwrite",
    **kw: object,
) -> MessageStoreManager:
    cfg = TopicStoreConfig(
        num_partitions=4, unflush_threshold=threshold, unflush_interval_ms=interval_ms
    )
    m = MessageStoreManager(
        StoreConfig(path, max_segment_size=segment, segment_writes=writes),
        lambda t: cfg,
        **kw,  # type: ignore[arg-type]
    )
    m.open()
    if start:
        m.start()
    return m


def abandon(m: MessageStoreManager) -> None:
    """Simulate a process death: stop threads, close files without flush/trim/marker."""
    m._flusher.stop()
    with m._ret_cond:
        m._ret_stop = True
        m._ret_cond.notify()
    if m._ret_thread is not None:
        m._ret_thread.join()
    for plog in m.logs():
        plog._closed = True
        for seg in plog.segments:
            seg.file.close()
        if plog._high_water is not None:
            plog._high_water.close()
    m._release_locks()  # the kernel drops a dead process's flock


def file_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def segment_names(directory: str) -> list[str]:
    """The segment files (``.meta``, ``.meta.new``) of a partition directory, sorted."""
    return sorted(n for n in os.listdir(directory) if n.endswith((".meta", ".meta.new")))


def segment_files(directory: str) -> list[str]:
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".meta"))


__all__ = [
    "abandon",
    "batch",
    "file_bytes",
    "manager",
    "read_all",
    "segment_files",
    "segment_names",
    "settle",
    "threading",
    "wait_for",
]
