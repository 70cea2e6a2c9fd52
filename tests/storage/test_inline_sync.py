"""Inline group commit: ``append(defer_flush=True)`` + ``sync_inline`` on the appending thread.

The broker's event loop uses these to acknowledge a small group commit without handing the
fsync to the flusher thread and back. What a user relies on: nothing is acknowledged before
the fdatasync that covers it (a power loss right after the ack keeps the records), every
append is acknowledged exactly once and in order, and ``sync_inline`` does nothing (and says
so) when the sync is not cheap, so the caller's fallback to the flusher still acks everything.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

from pymetaq.storage import AppendResult, PartitionLog
from pymetaq.storage.results import DurableCallback
from tests.storage._helpers import abandon, batch, manager, read_all
from tests.storage.faultdisk import FaultDisk


def _acks(plog: PartitionLog) -> tuple[list[int], DurableCallback]:
    acked: list[int] = []

    def cb(r: AppendResult, exc: BaseException | None) -> None:
        assert exc is None
        acked.append(r.offset)

    return acked, cb


def test_deferred_appends_are_acked_by_one_inline_fdatasync(tmp_path: Path) -> None:
    disk = FaultDisk(random.Random(7))
    m = manager(str(tmp_path), threshold=0, start=False, disk=disk)
    plog = m.get_log("t", 0)
    assert plog is not None
    acked, cb = _acks(plog)
    for p in (b"a" * 10, b"b" * 20, b"c" * 30):
        plog.append(batch([p]), on_durable=cb, defer_flush=True)
    assert not m._flusher._pending  # the flusher was not asked
    assert acked == [] and plog.max_offset == 0
    syncs = disk.syncs
    assert plog.sync_inline(1 << 20)
    assert disk.syncs == syncs + 1  # one fdatasync covered the three appends
    assert acked == [0, 30, 70] and plog.max_offset == plog.write_offset == 120
    disk.crash()  # power loss right after the acks: the acked records survive
    abandon(m)
    m2 = manager(str(tmp_path), threshold=0, start=False)
    plog2 = m2.get_log("t", 0)
    assert plog2 is not None
    assert [r.data for r in read_all(plog2)] == [b"a" * 10, b"b" * 20, b"c" * 30]
    m2.close()


def test_sync_inline_declines_a_large_sync_and_the_flusher_acks_it(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0, start=False)
    plog = m.get_log("t", 0)
    assert plog is not None
    acked, cb = _acks(plog)
    plog.append(batch([b"x" * 200]), on_durable=cb, defer_flush=True)
    assert not plog.sync_inline(100)  # 220 unsynced bytes > 100: not cheap
    assert acked == [] and plog.max_offset == 0
    plog.request_flush()
    m._flusher.run_once()
    assert acked == [0] and plog.max_offset == 220
    m.close()


def test_sync_inline_declines_while_a_roll_is_unfinished(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0, segment=100, start=False)
    plog = m.get_log("t", 0)
    assert plog is not None
    acked, cb = _acks(plog)
    plog.append(batch([b"a" * 70]), on_durable=cb, defer_flush=True)
    plog.append(batch([b"b" * 70]), on_durable=cb, defer_flush=True)
    assert len(plog.segments) == 2  # rolled: the seal and rename belong to the flusher
    assert not plog.sync_inline(1 << 20)
    assert acked == [] and plog.max_offset == 0
    m._flusher.run_once()  # the roll asked for it
    assert acked == [0, 90] and plog.max_offset == 180
    assert plog.sync_inline(1 << 20)  # nothing left to do: cheap, and acks nothing twice
    assert acked == [0, 90]
    m.close()


def test_sync_inline_declines_while_another_sync_runs(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0, start=False)
    plog = m.get_log("t", 0)
    assert plog is not None
    acked, cb = _acks(plog)
    plog.append(batch([b"a"]), on_durable=cb, defer_flush=True)
    with plog._sync_lock:  # the flusher (or close) is syncing this log
        result: list[bool] = []
        t = threading.Thread(target=lambda: result.append(plog.sync_inline(1 << 20)))
        t.start()
        t.join(10)
        assert result == [False]  # did not wait for the other sync
    assert acked == []
    assert plog.sync_inline(1 << 20)
    assert acked == [0]
    m.close()
