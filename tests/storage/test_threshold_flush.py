"""Threshold mode (``unflushThreshold`` N) asks for an fsync half-way to N, so appends are not
held back waiting for one at N.
"""

from __future__ import annotations

from pathlib import Path

from tests.storage._helpers import (
    batch,
    manager,
)


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
