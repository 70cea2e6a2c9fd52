"""Storage fixes: MetaQ getNearestOffset, per-record size limit, rolls off the appending thread.

Each test fails on the engine before the fix: ``nearest_offset`` clamped instead of answering
a segment start; ``append`` had no ``max_record_size``; a roll sealed (trimmed + fdatasync'd)
the old segment on the appending thread.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from pymetaq.storage import InvalidRecords, MessageStoreManager, StoreConfig, TopicStoreConfig
from pymetaq.storage.record import encode_record
from tests.storage._helpers import (
    abandon,
    batch,
    manager,
    read_all,
    segment_files,
    segment_names,
)
from tests.storage.faultdisk import FaultDisk


def test_nearest_offset_is_the_start_of_the_segment_holding_it(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0, segment=100)
    plog = m.get_log("t", 0)
    assert plog is not None
    for p in (b"a" * 50, b"b" * 50, b"c" * 50):  # 70-byte records: one per segment
        plog.append_sync(batch([p]), timeout=10)
    starts = [s.start for s in plog.segments]
    assert starts == [0, 70, 140] and plog.max_offset == 210
    assert [plog.nearest_offset(o) for o in (0, 1, 69, 70, 71, 139, 140, 209)] == [
        0, 0, 0, 70, 70, 70, 140, 140,
    ]  # fmt: skip
    assert plog.nearest_offset(210) == 210 and plog.nearest_offset(10**12) == 210
    assert plog.nearest_offset(-1) == 0
    m.close()


def test_nearest_offset_before_the_first_segment_after_retention(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0, segment=100)
    plog = m.get_log("t", 0)
    assert plog is not None
    for p in (b"a" * 50, b"b" * 50, b"c" * 50):
        plog.append_sync(batch([p]), timeout=10)
    dropped = plog.detach_prefix(lambda s: s.start >= 140)
    for seg in dropped:
        seg.file.close()
    assert plog.min_offset == 140
    assert plog.nearest_offset(0) == 140 and plog.nearest_offset(139) == 140
    assert plog.nearest_offset(150) == 140
    m.close()


@pytest.mark.parametrize("uniform", [True, False], ids=["uniform", "mixed"])
def test_max_record_size_rejects_the_batch_and_writes_nothing(
    tmp_path: Path, uniform: bool
) -> None:
    m = manager(str(tmp_path), threshold=0)
    plog = m.get_log("t", 0)
    assert plog is not None
    plog.append_sync(batch([b"first"]), timeout=10)
    end = plog.write_offset
    payloads = [b"x" * 101] * 3 if uniform else [b"ok", b"x" * 101, b"fine"]
    with pytest.raises(InvalidRecords) as info:
        plog.append(batch(payloads), max_record_size=100)
    assert info.value.offset == (0 if uniform else 22)  # the oversized record's position
    assert "101 bytes exceeds the limit of 100" in info.value.reason
    assert plog.write_offset == end
    # a record of exactly the limit is fine, in both paths
    ok = [b"y" * 100] * 2 if uniform else [b"y" * 100, b"z"]
    r = plog.append_sync(batch(ok), timeout=10)
    assert r.offset == end and r.count == 2
    assert [rec.data for rec in read_all(plog)] == [b"first", *ok]
    m.close()


def test_max_record_size_also_checked_without_stamping(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0)
    plog = m.get_log("t", 0)
    assert plog is not None
    with pytest.raises(InvalidRecords, match="exceeds the limit"):
        records = bytearray(encode_record(b"a", msg_id=7) + encode_record(b"b" * 9, msg_id=8))
        plog.append(records, stamp_ids=False, max_record_size=8)
    assert plog.write_offset == 0
    m.close()


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


def test_threshold_mode_asks_for_an_fsync_half_way_to_n(tmp_path: Path) -> None:
    """N = 10: the 5th acknowledged-but-unflushed message requests an fsync, so it can finish
    before the count reaches N (else the appends after it would all wait for it)."""
    m = manager(str(tmp_path), threshold=10, interval_ms=60_000, start=False)
    plog = m.get_log("t", 0)
    assert plog is not None
    for i in range(4):
        plog.append(batch([b"%d" % i]))
    assert plog not in m._flusher._pending
    plog.append(batch([b"4"]))
    assert plog in m._flusher._pending
    m._flusher.run_once()
    assert plog.max_offset == plog.write_offset == 5 * 21
    acked: list[int] = []
    for i in range(9):  # the count restarted: 9 more are acknowledged at once
        plog.append(batch([b"%d" % i]), on_durable=lambda r, e: acked.append(r.offset))
        assert len(acked) == i + 1
    m.close()
