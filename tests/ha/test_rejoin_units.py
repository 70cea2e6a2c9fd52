"""The pure parts of a replaced master's rejoin (pymetaq.ha.rejoin) and the epoch's insync."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pymetaq.ha.failover import Epoch
from pymetaq.ha.rejoin import (
    GregorNode,
    cut_point,
    decode_ends,
    encode_ends,
    record_ending_at,
    whole_records,
)
from pymetaq.ha.sync import bsync_reply_error
from pymetaq.storage.record import encode_record
from tests.storage._helpers import batch, manager, read_all


def test_ends_and_the_gregor_node_round_trip() -> None:
    ends = {("orders", 0): 341, ("my-topic", 12): 0}
    assert decode_ends(encode_ends(ends)) == ends
    node = GregorNode("meta://10.0.0.5:8123", "ab12", ends)
    assert GregorNode.decode(node.encode()) == node
    for bad in ({"orders": 1}, {"orders-x": 1}, {"orders-0": -1}, {"orders-0": "1"}, [1]):
        with pytest.raises(ValueError):
            decode_ends(bad)
    with pytest.raises(ValueError, match="not a gregor node value"):
        GregorNode.decode(b'{"url": "meta://x:1"}')


def test_the_epoch_carries_insync_only_when_tracked() -> None:
    legacy = Epoch(1, "meta://a:1", "r1")
    assert b"insync" not in legacy.encode() and Epoch.decode(legacy.encode()).insync is None
    promoted = Epoch(2, "meta://b:1", "r2", insync="")
    assert Epoch.decode(promoted.encode()) == promoted
    assert Epoch.decode(Epoch(2, "meta://b:1", "r2", insync="r1").encode()).insync == "r1"
    with pytest.raises(ValueError):
        Epoch.decode(b'{"epoch":2,"master":"m","replica":"r","insync":5}')


def test_a_bsync_reply_must_name_the_masters_offset_when_aligned() -> None:
    assert bsync_reply_error(b"7 0 100 3", 7, 3) is None
    assert bsync_reply_error(b"7 0 100 3", 7, 3, 100) is None
    why = bsync_reply_error(b"7 0 120 3", 7, 3, 100)
    assert why == "the slave stored the batch at offset 120, not at the master's 100"


def test_whole_records_stops_at_a_partial_one() -> None:
    recs = [encode_record(b"x" * n, msg_id=i + 1) for i, n in enumerate((0, 5, 300))]
    joined = b"".join(recs)
    assert whole_records(joined) == len(joined)
    assert whole_records(joined[:-1]) == len(recs[0]) + len(recs[1])
    assert whole_records(joined[:10]) == 0


def test_cut_point_and_the_record_ending_there(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    m = manager(str(tmp_path), segment=2048)
    plog = m.get_log("t", 0)
    assert plog is not None
    for _ in range(30):
        plog.append_sync(batch(rng.randbytes(rng.randrange(0, 200)) for _ in range(2)))
    records = read_all(plog)
    assert len(plog.segments) > 3
    assert cut_point(plog, {}) == plog.min_offset  # the new master never had it
    assert cut_point(plog, {("t", 0): plog.max_offset + 999}) == plog.max_offset
    for r in rng.sample(records, 12):
        end = r.offset + r.size
        assert cut_point(plog, {("t", 0): end}) == end
        found = record_ending_at(plog, end)
        assert found is not None and found[0] == r.offset
        assert found[1][20:] == r.data
        if r.size > 20:  # inside a record: not a boundary, the logs cannot line up there
            assert record_ending_at(plog, end - 1) is None
    assert record_ending_at(plog, plog.min_offset) is None
    m.close()
