"""MetaQ's getNearestOffset: the start of the segment holding an offset (before the fix,
``nearest_offset`` clamped instead).
"""

from __future__ import annotations

from pathlib import Path

from tests.storage._helpers import (
    batch,
    manager,
)


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
