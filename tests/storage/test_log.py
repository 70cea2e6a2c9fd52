"""PartitionLog behaviour, parametrized over flush mode x segment size (NATS style)."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

from pymetaq.storage import (
    AppendResult,
    InvalidRecords,
    MessageStoreManager,
    PartitionOutOfRange,
    ReadStatus,
    StoreConfig,
    TopicStoreConfig,
    UnknownTopic,
)
from pymetaq.storage.record import encode_record, iter_records
from pymetaq.storage.segment import parse_segment_name
from tests.storage._helpers import batch, manager, read_all, segment_files, settle, wait_for

MODES = {"group": 0, "threshold": 3}
SIZES = {"tiny": 256, "small": 4096, "big": 1 << 20}
WRITES = ("pwrite", "mmap")  # [system] segmentWrites


@pytest.fixture(
    params=[(m, s, w) for m in MODES for s in SIZES for w in WRITES],
    ids=lambda p: "-".join(p),
)
def store(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    mode, size, writes = request.param
    m = manager(
        str(tmp_path), threshold=MODES[mode], interval_ms=20, segment=SIZES[size], writes=writes
    )
    yield m
    m.close()


def test_append_read_round_trip_and_layout(store: MessageStoreManager, seed: int) -> None:
    rng = random.Random(seed)
    plog = store.get_log("orders", 2)
    assert plog is not None
    expected: list[tuple[int, bytes]] = []
    last_id = 0
    biggest = 0
    for _ in range(60):
        payloads = [rng.randbytes(rng.randrange(0, 120)) for _ in range(rng.randrange(1, 6))]
        res = plog.append_sync(batch(payloads), timeout=10)
        assert res.offset == (expected[-1][0] + 20 + len(expected[-1][1]) if expected else 0)
        assert res.count == len(payloads) and res.first_msg_id > last_id
        last_id = res.first_msg_id + res.count - 1
        biggest = max(biggest, res.length)
        pos = res.offset
        for p in payloads:
            expected.append((pos, p))
            pos += 20 + len(p)
    recs = read_all(plog)
    assert [(r.offset, r.data) for r in recs] == expected
    ids = [r.msg_id for r in recs]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # MetaQ layout: <dataPath>/<topic>-<partition>/<20 digits>.meta, contiguous
    files = segment_files(os.path.join(store.config.data_path, "orders-2"))
    names = [os.path.basename(f) for f in files]
    assert all(len(n) == 25 for n in names) and names[0] == "00000000000000000000.meta"
    starts = [parse_segment_name(n) for n in names]
    sizes = [os.path.getsize(f) for f in files[:-1]]
    assert [s + z for s, z in zip(starts, sizes)] == starts[1:]  # type: ignore[operator]
    # a segment exceeds the limit only when one batch alone is bigger than it
    assert all(z <= max(store.config.max_segment_size, biggest) for z in sizes)


def test_read_semantics(store: MessageStoreManager) -> None:
    plog = store.get_log("t", 0)
    assert plog is not None
    assert plog.read(0, 100).status is ReadStatus.NO_DATA
    r1 = plog.append_sync(batch([b"a" * 30, b"b" * 30]), timeout=10)
    settle(plog)
    hw = plog.max_offset
    assert hw == 100 and r1 == AppendResult(0, 100, 2, r1.first_msg_id)
    res = plog.read(0, 70)  # ends in a partial record, as MetaQ serves it
    assert res.status is ReadStatus.OK and res.region is not None
    with res.region as region:
        data = region.read_bytes()
        assert len(data) == 70 and region.length == 70
    assert [r.data for r in iter_records(data)] == [b"a" * 30]
    assert plog.read(hw, 10).status is ReadStatus.NO_DATA
    out = plog.read(hw + 1, 10)
    assert (out.status, out.offset, out.region) == (ReadStatus.OUT_OF_RANGE, hw, None)
    assert plog.nearest_offset(-5) == 0 and plog.nearest_offset(10**9) == hw
    big = plog.read(0, 10**9)
    assert big.region is not None and big.region.length <= store.config.max_transfer_size
    big.region.close()


def test_invalid_batch_writes_nothing(store: MessageStoreManager) -> None:
    plog = store.get_log("t", 1)
    assert plog is not None
    good = plog.append_sync(batch([b"x"]), timeout=10)
    bad = batch([b"ok", b"corrupt me"])
    bad[-1] ^= 1
    with pytest.raises(InvalidRecords) as ei:
        plog.append(bad)
    assert ei.value.offset == 22 and not ei.value.retriable
    assert plog.write_offset == good.length
    after = plog.append_sync(batch([b"y"]), timeout=10)
    assert after.offset == good.length


def test_oversize_batch_gets_its_own_segment(store: MessageStoreManager) -> None:
    plog = store.get_log("t", 3)
    assert plog is not None
    plog.append_sync(batch([b"s" * 10]), timeout=10)
    n = store.config.max_segment_size // 100 + 3
    big = [bytes([i % 251]) * 100 for i in range(min(n, 4096))]
    res = plog.append_sync(batch(big), timeout=10)
    recs = read_all(plog)
    assert [r.data for r in recs] == [b"s" * 10, *big]
    if res.length > store.config.max_segment_size:
        assert any(s.start == res.offset for s in plog.segments)


def test_listeners_see_only_durable_offsets(store: MessageStoreManager) -> None:
    plog = store.get_log("t", 0)
    assert plog is not None
    seen: list[int] = []
    plog.add_listener(seen.append)
    for i in range(10):
        plog.append(batch([b"m%d" % i]))
    wait_for(lambda: bool(seen) and seen[-1] == plog.write_offset)
    assert seen == sorted(seen) and all(x <= plog.max_offset for x in seen)


def test_group_commit_shares_fsyncs_and_acks_after_durable(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0)
    plog = m.get_log("t", 0)
    assert plog is not None
    acks: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def cb(r: AppendResult, e: BaseException | None) -> None:
        assert e is None
        with lock:
            acks.append((r.offset, r.length, plog.max_offset))

    for i in range(500):
        plog.append(batch([b"%d" % i]), on_durable=cb)
    wait_for(lambda: len(acks) == 500)
    assert all(off + ln <= hw for off, ln, hw in acks)  # acked only once durable
    assert sorted(acks) == acks
    m.close()


def test_unknown_topic_and_partition(tmp_path: Path) -> None:
    cfg = TopicStoreConfig(num_partitions=2)
    m = MessageStoreManager(StoreConfig(str(tmp_path)), lambda t: cfg if t == "known" else None)
    m.open()
    with pytest.raises(UnknownTopic):
        m.get_log("nope", 0)
    with pytest.raises(PartitionOutOfRange):
        m.get_log("known", 2)
    assert m.get_log("known", 1, create=False) is None
    assert m.get_log("known", 1) is not None
    assert m.topics() == ["known"]
    m.close()


def test_clean_reopen_keeps_everything_and_ids_keep_increasing(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0, segment=300)
    plog = m.get_log("t", 0)
    assert plog is not None
    for i in range(30):
        last = plog.append_sync(batch([b"r%03d" % i] * 3), timeout=10)
    before = [(r.offset, r.msg_id, r.data) for r in read_all(plog)]
    m.close()
    assert os.path.exists(tmp_path / ".clean_shutdown")
    m2 = MessageStoreManager(
        StoreConfig(str(tmp_path), max_segment_size=300), lambda t: TopicStoreConfig()
    )
    m2.ids._clock = lambda: 1303895660503 + 5  # type: ignore[method-assign]  # clock far back
    [rep] = m2.open()
    assert rep.clean and rep.bytes_cut == 0 and rep.max_offset == last.offset + last.length
    assert not os.path.exists(tmp_path / ".clean_shutdown")
    p2 = m2.get_log("t", 0)
    assert p2 is not None
    assert [(r.offset, r.msg_id, r.data) for r in read_all(p2)] == before
    nxt = p2.append(batch([b"more"]))
    assert nxt.first_msg_id > before[-1][1] and nxt.offset == last.offset + last.length
    m2.close()


def test_per_topic_data_path(tmp_path: Path) -> None:
    other = tmp_path / "other"
    cfgs = {
        "a": TopicStoreConfig(unflush_threshold=0),
        "b": TopicStoreConfig(data_path=str(other), unflush_threshold=0),
    }
    m = MessageStoreManager(StoreConfig(str(tmp_path / "main")), cfgs.get)
    m.open()
    m.start()
    pb = m.get_log("b", 0)
    assert pb is not None
    pb.append_sync(batch([b"in other"]), timeout=10)
    assert (other / "b-0" / "00000000000000000000.meta").exists()
    m.close()
    m = MessageStoreManager(StoreConfig(str(tmp_path / "main")), cfgs.get)
    assert m.open() == []  # only dirs under the main data path are loaded eagerly
    pb = m.get_log("b", 0, create=False)
    assert pb is not None and [r.data for r in read_all(pb)] == [b"in other"]
    m.close()


def test_threshold_mode_acks_below_n_at_once_and_defers_the_nth(tmp_path: Path) -> None:
    """N = 5: an append leaving < 5 acked-but-unflushed messages is acked before it returns;
    the one that would make it 5 is acked only by the fsync that covers it; append never
    blocks (the flusher thread is not even running here)."""
    m = manager(str(tmp_path), threshold=5, interval_ms=60_000, start=False)
    plog = m.get_log("t", 0)
    assert plog is not None
    acked: list[int] = []

    def append(i: int, n: int = 1) -> None:
        recs = batch([b"%02d" % i] * n)  # 22-byte records
        plog.append(recs, on_durable=lambda _r, e: acked.append(i) if e is None else None)

    for i in range(4):
        append(i)
    assert acked == [0, 1, 2, 3] and plog.max_offset == 0  # acked, unflushed, invisible
    append(4)  # would leave 5 acked unflushed: deferred, and append returned at once
    assert acked == [0, 1, 2, 3] and plog.write_offset == 5 * 22
    m._flusher.run_once()  # the fsync that covers it
    assert acked == [0, 1, 2, 3, 4] and plog.max_offset == 5 * 22
    for i in range(5, 9):  # the count restarted at the fsync
        append(i)
    assert acked == list(range(9)) and plog.max_offset == 5 * 22
    append(9, n=5)  # one batch of N is never acked before its fsync
    append(10)  # acked at once? 4 acked unflushed + 1 = 5: no, deferred too
    assert acked == list(range(9))
    m._flusher.run_once()
    assert sorted(acked) == list(range(11)) and plog.max_offset == plog.write_offset
    assert len(read_all(plog, wait=False)) == 15
    m.close()


def test_encode_record_sanity() -> None:
    assert len(encode_record(b"x")) == 21
