"""Segment rolls happen off the appending thread (before the fix a roll sealed - trimmed and
fdatasync'd - the old segment on it), finish in order, and survive a crash between roll and
flush.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from pymetaq.storage import MessageStoreManager, StoreConfig, TopicStoreConfig
from tests.storage._helpers import (
    abandon,
    batch,
    manager,
    read_all,
    segment_files,
    segment_names,
)
from tests.storage.faultdisk import FaultDisk


def test_roll_does_no_fsync_on_the_appending_thread(tmp_path: Path) -> None:
    """The appending thread only creates the next segment (as ``.meta.new``); the flusher
    seals the old one (trim + fdatasync) and renames the new one before anything past the
    old segment becomes durable."""
    disk = FaultDisk(random.Random(1))
    m = manager(str(tmp_path), threshold=0, segment=100, start=False, disk=disk)
    plog = m.get_log("t", 0)
    assert plog is not None
    acked: list[int] = []
    plog.append(batch([b"a" * 70]), on_durable=lambda r, e: acked.append(r.offset))
    m._flusher.run_once()
    d = str(tmp_path / "t-0")
    syncs = disk.syncs
    plog.append(batch([b"b" * 70]), on_durable=lambda r, e: acked.append(r.offset))  # rolls
    assert disk.syncs == syncs  # no fsync on this thread
    assert segment_names(d) == ["00000000000000000000.meta", "00000000000000000090.meta.new"]
    assert os.path.getsize(os.path.join(d, "00000000000000000000.meta")) == 100  # not trimmed
    assert acked == [0] and plog.max_offset == 90  # nothing past the old segment is served
    m._flusher.run_once()
    assert acked == [0, 90] and plog.max_offset == 180
    assert [os.path.basename(p) for p in segment_files(d)] == [
        "00000000000000000000.meta",
        "00000000000000000090.meta",
    ]
    assert os.path.getsize(os.path.join(d, "00000000000000000000.meta")) == 90  # sealed
    assert [r.data for r in read_all(plog)] == [b"a" * 70, b"b" * 70]
    m.close()


def test_several_rolls_between_flushes_finish_in_order(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0, segment=100, start=False)
    plog = m.get_log("t", 0)
    assert plog is not None
    payloads = [bytes([65 + i]) * 70 for i in range(4)]
    for p in payloads:
        plog.append(batch([p]))
    assert plog.max_offset == 0 and len(plog.segments) == 4
    m._flusher.run_once()
    d = str(tmp_path / "t-0")
    assert [os.path.getsize(p) for p in segment_files(d)] == [90, 90, 90, 100]
    assert not [n for n in os.listdir(d) if n.endswith(".new")]
    assert [r.data for r in read_all(plog)] == payloads
    m.close()


def test_crash_between_roll_and_flush_recovers(tmp_path: Path) -> None:
    """Power loss after a roll, before the flusher finished it: the untrimmed old segment is
    the last ``.meta`` (scanned and cut as usual); the ``.meta.new`` continues it exactly, so
    it is adopted (here with nothing in it: its unsynced write was lost)."""
    disk = FaultDisk(random.Random(2))
    m = manager(str(tmp_path), threshold=0, segment=100, start=False, disk=disk)
    plog = m.get_log("t", 0)
    assert plog is not None
    plog.append(batch([b"a" * 70]))
    m._flusher.run_once()  # durable and acked
    plog.append(batch([b"b" * 70]))  # rolls; never flushed
    d = str(tmp_path / "t-0")
    disk.sync_dir(d)  # even if the .new entry itself reached the disk
    disk.crash()
    abandon(m)
    m2 = MessageStoreManager(
        StoreConfig(str(tmp_path), max_segment_size=100), lambda t: TopicStoreConfig()
    )
    [report] = m2.open()
    m2.start()
    assert segment_names(d) == ["00000000000000000000.meta", "00000000000000000090.meta"]
    assert report.adopted == 1  # (the torn prefix of its unsynced write, if any, is cut)
    assert report.records_cut == (1 if report.bytes_cut else 0)
    p2 = m2.get_log("t", 0)
    assert p2 is not None and report.max_offset == 90
    assert [r.data for r in read_all(p2)] == [b"a" * 70]
    r = p2.append_sync(batch([b"c" * 70]), timeout=10)  # continues at the right place
    assert r.offset == 90
    m2.close()
