"""Damaged logs: each case of issue 8 defect 7, reproduced on disk, failing before the fix.

- a torn tail after a clean stop was trusted because of the marker (new appends landed after
  the fragment; a consumer stalled on it);
- a stale marker over an untrimmed segment served its zero fill as empty records with id 0;
- a garbage ``.clean_shutdown`` crashed every start;
- a gap between segments stopped the whole store;
- deleting the newest segment was reported as nothing cut and its offsets were reused;
- threshold mode: a crash between a roll and the flusher's rename deleted acknowledged data.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
from pathlib import Path

import pytest

from pymetaq.storage import (
    AppendResult,
    DataDirLocked,
    InvalidRecords,
    MessageStoreManager,
    PartitionFenced,
    ReadStatus,
    StoreConfig,
    TopicStoreConfig,
)
from pymetaq.storage.record import encode_record
from tests.storage._helpers import abandon, batch, manager, read_all, segment_files, segment_names
from tests.storage.faultdisk import FaultDisk

MARKER = ".clean_shutdown"


def reopen(path: Path, *, segment: int = 1 << 20, threshold: int = 0) -> MessageStoreManager:
    return manager(str(path), segment=segment, threshold=threshold)


def test_torn_tail_after_a_clean_stop_is_cut(tmp_path: Path) -> None:
    m = reopen(tmp_path)
    plog = m.get_log("t", 0)
    assert plog is not None
    plog.append_sync(batch([b"a" * 100] * 3))  # 360 bytes
    m.close()
    [path] = segment_files(str(tmp_path / "t-0"))
    with open(path, "ab") as f:  # a fragment after the clean stop (the marker still says clean)
        f.write(batch([b"z" * 100])[:50])
    m = reopen(tmp_path)
    [rep] = m.recovery_reports
    assert not rep.clean and (rep.records_cut, rep.bytes_cut, rep.truncated_at) == (1, 50, 360)
    assert any("marker does not match" in n for n in rep.notes)
    plog = m.get_log("t", 0)
    assert plog is not None
    assert plog.append_sync(batch([b"next"])).offset == 360  # right after the valid records
    assert [r.data for r in read_all(plog)] == [b"a" * 100] * 3 + [b"next"]
    m.close()


def test_clean_stop_is_trusted_without_a_scan(tmp_path: Path) -> None:
    m = reopen(tmp_path)
    for part in (0, 1):
        plog = m.get_log("t", part)
        assert plog is not None
        plog.append_sync(batch([b"x" * 10] * (part + 1)))
    m.close()
    m = reopen(tmp_path)
    reps = sorted(m.recovery_reports, key=lambda r: r.partition)
    assert [(r.clean, r.records_scanned, r.max_offset) for r in reps] == [
        (True, 0, 30),
        (True, 0, 60),
    ]
    m.close()


def test_stale_marker_over_an_untrimmed_segment_serves_no_zero_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = reopen(tmp_path)
    plog = m.get_log("t", 0)
    assert plog is not None
    plog.append_sync(batch([b"A" * 50] * 2))
    m.close()
    stale = (tmp_path / MARKER).read_bytes()
    m = reopen(tmp_path)
    plog = m.get_log("t", 0)
    assert plog is not None
    plog.append_sync(batch([b"B" * 50] * 2))  # acknowledged, then the process dies
    abandon(m)  # the segment stays untrimmed: 1 MiB, mostly zeros
    (tmp_path / MARKER).write_bytes(stale)  # an old marker restored over it
    caplog.set_level(logging.WARNING)
    m = reopen(tmp_path)
    [rep] = m.recovery_reports
    assert not rep.clean and rep.max_offset == 280
    plog = m.get_log("t", 0)
    assert plog is not None
    records = read_all(plog)
    assert [r.data for r in records] == [b"A" * 50] * 2 + [b"B" * 50] * 2
    assert all(r.msg_id != 0 for r in records)
    assert plog.read(280, 4096).status is ReadStatus.NO_DATA  # the zero fill is not data
    m.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"garbage",
        b"",
        b"\xff\xfe\x00",
        b"{}",
        b"[1, 2]",
        b'{"max_msg_id": "x"}',
        b'{"max_msg_id": 5}',  # the old format: no per-partition records
        b'{"version": 2, "max_msg_id": 1, "logs": 5}',
        b'{"version": 2, "max_msg_id": 1, "logs": {"d": [1, 2]}}',
        b'{"version": 2, "max_msg_id": -1, "logs": {}}',
    ],
)
def test_a_bad_marker_is_ignored_with_a_warning(
    tmp_path: Path, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    m = reopen(tmp_path)
    plog = m.get_log("t", 0)
    assert plog is not None
    plog.append_sync(batch([b"kept"] * 3))
    abandon(m)
    (tmp_path / MARKER).write_bytes(garbage)
    caplog.set_level(logging.WARNING, logger="pymetaq.storage")
    m = reopen(tmp_path)  # used to raise JSONDecodeError / AttributeError / ValueError
    [rep] = m.recovery_reports
    assert not rep.clean and rep.records_scanned == 3
    assert any("ignoring the clean-shutdown marker" in r.message for r in caplog.records)
    assert not (tmp_path / MARKER).exists()
    plog = m.get_log("t", 0)
    assert plog is not None and [r.data for r in read_all(plog)] == [b"kept"] * 3
    m.close()


def _two_partitions(tmp_path: Path) -> list[str]:
    m = reopen(tmp_path, segment=200)
    for part in (0, 1):
        plog = m.get_log("t", part)
        assert plog is not None
        for i in range(6):
            plog.append_sync(batch([b"%d" % i * 60]))
    m.close()
    return segment_files(str(tmp_path / "t-0"))


@pytest.mark.parametrize("damage", ["hole", "overlap", "unreadable"])
def test_a_damaged_partition_is_fenced_and_the_rest_served(tmp_path: Path, damage: str) -> None:
    files = _two_partitions(tmp_path)
    if damage == "hole":
        os.unlink(files[1])
    elif damage == "overlap":
        with open(files[0], "ab") as f:  # an untrimmed middle segment
            f.write(bytes(100))
    else:
        os.unlink(files[1])
        os.mkdir(files[1])  # cannot be opened as a file
    m = reopen(tmp_path, segment=200)  # used to raise CorruptLogError: nothing served
    fenced = {r.partition: r.fenced for r in m.recovery_reports}
    assert fenced[0] is not None and fenced[1] is None
    assert ("t", 0) in m.fenced
    with pytest.raises(PartitionFenced, match="damaged and fenced"):
        m.get_log("t", 0)
    with pytest.raises(PartitionFenced):
        m.get_log("t", 0, create=False)
    other = m.get_log("t", 1)
    assert other is not None and len(read_all(other)) == 6
    assert other.append_sync(batch([b"still served"])).count == 1
    m.close()


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_deleting_the_newest_segment_never_reuses_offsets(tmp_path: Path, stop: str) -> None:
    m = reopen(tmp_path, segment=200)
    plog = m.get_log("t", 0)
    assert plog is not None
    for i in range(6):
        plog.append_sync(batch([b"%d" % i * 60]))  # 80-byte records, two per segment
    end = plog.max_offset
    (m.close if stop == "clean" else lambda: abandon(m))()
    newest = segment_files(str(tmp_path / "t-0"))[-1]
    cut_from = int(os.path.basename(newest)[:20])
    os.unlink(newest)
    m = reopen(tmp_path, segment=200)
    [rep] = m.recovery_reports
    assert rep.gap == (cut_from, end) and rep.lost_data  # reported, not "nothing cut"
    plog = m.get_log("t", 0)
    assert plog is not None
    assert plog.append_sync(batch([b"new"])).offset == end  # offsets never go backwards
    for consumer_at in (cut_from, cut_from + 80, end - 1):  # a consumer past the cut
        res = plog.read(consumer_at, 4096)
        assert (res.status, res.offset) == (ReadStatus.OUT_OF_RANGE, end)  # told where to go
        assert plog.nearest_offset(consumer_at) == end
    assert [r.data for r in read_all(plog)][-1] == b"new"
    m.close()
    m = reopen(tmp_path, segment=200)  # the recorded gap is accepted from now on
    [rep] = m.recovery_reports
    assert rep.fenced is None and rep.gap is None
    m.close()


def test_zero_ids_are_refused_when_ids_are_kept(tmp_path: Path) -> None:
    m = reopen(tmp_path)
    plog = m.get_log("t", 0)
    assert plog is not None
    with pytest.raises(InvalidRecords, match="message id 0"):
        plog.append(bytearray(encode_record(b"", msg_id=0)), stamp_ids=False)
    assert plog.write_offset == 0
    m.close()


def test_threshold_mode_ack_in_an_unrenamed_roll_survives_a_process_crash(tmp_path: Path) -> None:
    """Threshold mode acks at once; the batches after a roll live in ``.meta.new`` until the
    flusher renames it.  A process crash before that used to delete them."""
    m = manager(str(tmp_path), threshold=1000, segment=200, start=False)
    plog = m.get_log("t", 0)
    assert plog is not None
    acked: list[int] = []
    for i in range(7):  # 80-byte records: rolls at 200 bytes, three times
        plog.append(batch([b"%d" % i * 60]), on_durable=lambda r, e: acked.append(r.offset))
    assert len(acked) == 7  # all acknowledged, none fsynced, no flusher ran
    assert segment_names(str(tmp_path / "t-0"))[-1].endswith(".meta.new")
    abandon(m)  # the process dies: the page cache keeps every written byte
    m = reopen(tmp_path, segment=200, threshold=1000)
    [rep] = m.recovery_reports
    assert rep.adopted == 3 and (rep.records_cut, rep.bytes_cut) == (0, 0)
    plog = m.get_log("t", 0)
    assert plog is not None
    assert [r.offset for r in read_all(plog)] == acked
    assert not [n for n in os.listdir(tmp_path / "t-0") if n.endswith(".new")]
    m.close()


def test_a_roll_segment_that_does_not_continue_the_log_is_counted(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=1000, segment=200, start=False)
    plog = m.get_log("t", 0)
    assert plog is not None
    for i in range(3):
        plog.append(batch([b"%d" % i * 60]))  # the third rolls into 160.meta.new
    abandon(m)
    d = tmp_path / "t-0"
    [old] = segment_files(str(d))
    with open(old, "r+b") as f:  # tear the second record of the old segment
        f.seek(100)
        f.write(b"\xff" * 10)
    m = reopen(tmp_path, segment=200, threshold=1000)
    [rep] = m.recovery_reports
    # the torn record (1) and the discarded roll segment's record (1) are both counted
    assert rep.adopted == 0 and rep.records_cut == 2 and rep.truncated_at == 80
    assert rep.bytes_cut == 80 + 80 and any("does not continue" in n for n in rep.notes)
    m.close()


def test_power_loss_in_threshold_mode_with_rolls_stays_within_budget(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    n = 8
    for round_ in range(12):
        path = tmp_path / f"r{round_}"
        disk = FaultDisk(random.Random(rng.random()))
        cfg = TopicStoreConfig(unflush_threshold=n, unflush_interval_ms=60_000)
        m = MessageStoreManager(
            StoreConfig(str(path), max_segment_size=256),
            lambda t, cfg=cfg: cfg,  # type: ignore[misc]
            disk=disk,  # type: ignore[arg-type]
        )
        m.open()
        m.start()
        plog = m.get_log("t", 0)
        assert plog is not None
        acked: list[tuple[int, bytes]] = []

        for _ in range(rng.randrange(5, 60)):
            p = rng.randbytes(rng.randrange(1, 120))
            plog.append(batch([p]), on_durable=functools.partial(_ack_into, acked, p))
        disk.crash()
        abandon(m)
        m2 = reopen(path, segment=256, threshold=n)
        # the high-water mark only ever holds fsynced offsets: a power loss never makes a gap
        assert all(r.gap is None and r.fenced is None for r in m2.recovery_reports)
        p2 = m2.get_log("t", 0)
        assert p2 is not None
        got = {r.offset: r.data for r in read_all(p2)}
        lost = [o for o, d in sorted(acked) if got.get(o) != d]
        assert len(lost) <= n - 1, (round_, len(lost))
        m2.close()


def test_a_second_manager_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    m = reopen(tmp_path)
    other = MessageStoreManager(StoreConfig(str(tmp_path)), lambda t: TopicStoreConfig())
    with pytest.raises(DataDirLocked, match=f"pid {os.getpid()}") as info:
        other.open()
    assert info.value.pid == os.getpid()
    m.close()
    other.open()  # released at close
    other.close()


def test_marker_records_every_partition(tmp_path: Path) -> None:
    m = reopen(tmp_path)
    for part in range(3):
        plog = m.get_log("t", part)
        assert plog is not None
        plog.append_sync(batch([b"p"]))
    m.close()
    doc = json.loads((tmp_path / MARKER).read_text())
    assert doc["version"] == 2 and len(doc["logs"]) == 3


def _ack_into(
    acked: list[tuple[int, bytes]], payload: bytes, r: AppendResult, e: BaseException | None
) -> None:
    if e is None:  # at once, or at the covering fsync (which the crash may fail)
        acked.append((r.offset, payload))
