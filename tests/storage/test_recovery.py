"""Recovery after unclean stops: tail corruption rounds, zero tails, continuity, reports."""

from __future__ import annotations

import logging
import os
import random
import struct
import zlib
from pathlib import Path

import pytest

from pymetaq.storage import CorruptLogError, MessageStoreManager, StoreConfig, TopicStoreConfig
from tests.storage._helpers import abandon, batch, file_bytes, manager, read_all, segment_files

SEG = 64 * 1024


def expected_prefix(buf: bytes) -> tuple[int, int]:
    """Independent reference: (valid end, record count) of a segment image.

    A record with message id 0 ends the data: no stored record has id 0, and a zero-filled
    tail followed by junk can frame one (length 0, CRC 0) that must never be served."""
    pos = n = 0
    while pos + 20 <= len(buf):
        length, crc, msg_id = struct.unpack(">iiq", buf[pos : pos + 16])
        if buf[pos : pos + 20] == bytes(20) or msg_id == 0:
            break
        if length < 0 or pos + 20 + length > len(buf):
            break
        if zlib.crc32(buf[pos + 20 : pos + 20 + length]) & 0x7FFFFFFF != crc:
            break
        pos += 20 + length
        n += 1
    return pos, n


def ref_records(buf: bytes, end: int) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos < end:
        length, _crc, msg_id, flag = struct.unpack(">iiqi", buf[pos : pos + 20])
        out.append((pos, msg_id, flag, buf[pos + 20 : pos + 20 + length]))
        pos += 20 + length
    return out


def test_random_tail_corruption_keeps_exactly_the_valid_prefix(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    for round_ in range(60):
        d = tmp_path / f"r{round_}"
        m = manager(str(d), threshold=0, segment=SEG)
        plog = m.get_log("t", 0)
        assert plog is not None
        for _ in range(rng.randrange(1, 30)):
            plog.append_sync(
                batch(rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(1, 5)))
            )
        end = plog.write_offset
        before = read_all(plog)
        abandon(m)
        [path] = segment_files(str(d / "t-0"))
        # overwrite from a random position with random bytes (sometimes past the end)
        pos = rng.randrange(0, end + 50)
        junk = rng.randbytes(rng.randrange(1, 400))
        with open(path, "r+b") as f:
            f.seek(pos)
            f.write(junk)
        image = file_bytes(path)
        want_end, want_n = expected_prefix(image)
        m2 = MessageStoreManager(
            StoreConfig(str(d), max_segment_size=SEG),
            lambda t: TopicStoreConfig(unflush_threshold=0),
        )
        [rep] = m2.open()
        m2.start()
        assert not rep.clean
        assert rep.max_offset == max(want_end, end) and rep.records_scanned == want_n
        p2 = m2.get_log("t", 0)
        assert p2 is not None
        after = read_all(p2)
        assert len(after) == want_n
        # exactly the valid prefix of the image, nothing corrupt served; every record that
        # lay wholly before the damage survives unchanged
        assert [(r.offset, r.msg_id, r.flag, r.data) for r in after] == ref_records(image, want_end)
        untouched = [r for r in before if r.offset + r.size <= pos]
        assert after[: len(untouched)] == untouched
        nonzero_end = len(image.rstrip(b"\0"))
        assert rep.bytes_cut == max(0, nonzero_end - want_end)
        assert (rep.truncated_at is not None) == (rep.bytes_cut > 0)
        if rep.bytes_cut:
            assert rep.records_cut >= 1
        # offsets never go backwards: when the damage cut durable records, the log continues
        # at its old end (a recorded gap); otherwise right after the valid prefix
        assert rep.gap == ((want_end, end) if want_end < end else None)
        res = p2.append_sync(batch([b"next"]))
        assert res.offset == max(want_end, end)
        if want_end < end:
            assert p2.read(want_end, 100).offset == end  # a reader in the gap is moved on
        m2.close()


def test_zero_tail_is_the_end_and_nothing_is_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = manager(str(tmp_path), threshold=0, segment=SEG)
    plog = m.get_log("t", 0)
    assert plog is not None
    plog.append_sync(batch([b"a" * 100] * 10))
    abandon(m)
    [path] = segment_files(str(tmp_path / "t-0"))
    assert os.path.getsize(path) == SEG  # preallocated
    caplog.set_level(logging.INFO, logger="pymetaq.storage")
    m2 = MessageStoreManager(
        StoreConfig(str(tmp_path), max_segment_size=SEG), lambda t: TopicStoreConfig()
    )
    [rep] = m2.open()
    assert (rep.records_scanned, rep.bytes_cut, rep.records_cut, rep.max_offset) == (10, 0, 0, 1200)
    assert any(  # one readable line, not a dataclass repr
        r.message
        == "t-0: recovered 1 segment(s), offsets 0..1200 (scanned 10 record(s), 1200 bytes)"
        for r in caplog.records
    ), [r.message for r in caplog.records]
    m2.close()


def test_torn_record_is_cut_and_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    m = manager(str(tmp_path), threshold=0, segment=SEG)
    plog = m.get_log("t", 0)
    assert plog is not None
    plog.append_sync(batch([b"a" * 100] * 3))  # 360 bytes
    abandon(m)
    [path] = segment_files(str(tmp_path / "t-0"))
    with open(path, "r+b") as f:  # a torn fourth record: header + 30 of 100 data bytes
        f.seek(360)
        f.write(batch([b"z" * 100])[:50])
    caplog.set_level(logging.WARNING, logger="pymetaq.storage")
    m2 = MessageStoreManager(
        StoreConfig(str(tmp_path), max_segment_size=SEG), lambda t: TopicStoreConfig()
    )
    [rep] = m2.open()
    assert (rep.max_offset, rep.records_cut, rep.bytes_cut, rep.truncated_at) == (360, 1, 50, 360)
    assert any(r.levelno == logging.WARNING for r in caplog.records)
    assert file_bytes(path)[360:460] == bytes(100)  # the torn bytes are gone from disk
    m2.close()


def test_gap_between_segments_fences_the_partition(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0, segment=200)
    plog = m.get_log("t", 0)
    assert plog is not None
    for _ in range(6):
        plog.append_sync(batch([b"x" * 60]))
    m.close()
    files = segment_files(str(tmp_path / "t-0"))
    assert len(files) >= 3
    os.unlink(files[1])
    m2 = MessageStoreManager(
        StoreConfig(str(tmp_path), max_segment_size=200), lambda t: TopicStoreConfig()
    )
    [report] = m2.open()  # no longer stops the whole store (test_damaged.py covers more)
    assert report.fenced is not None and "next segment starts at" in report.fenced
    with pytest.raises(CorruptLogError, match="next segment starts at"):
        m2.get_log("t", 0)
    m2.close()


def test_crash_right_after_roll_seeds_ids_from_previous_segment(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0, segment=100)
    plog = m.get_log("t", 0)
    assert plog is not None
    r = plog.append_sync(batch([b"x" * 70]))
    plog.append_sync(batch([b"y" * 70]))  # rolls; then remove the new segment's content
    abandon(m)
    files = segment_files(str(tmp_path / "t-0"))
    with open(files[-1], "r+b") as f:
        f.write(bytes(90))
    m2 = MessageStoreManager(
        StoreConfig(str(tmp_path), max_segment_size=100), lambda t: TopicStoreConfig()
    )
    m2.ids._clock = lambda: 1303895660503  # type: ignore[method-assign]
    [rep] = m2.open()
    m2.start()
    assert rep.last_msg_id == r.first_msg_id
    assert m2.ids.reserve(1) > r.first_msg_id
    m2.close()
