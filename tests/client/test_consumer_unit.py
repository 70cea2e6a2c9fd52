"""Consumer logic against an in-memory transport: scan, backoff, positions, retries, spool."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.consumer import AsyncConsumer, Consumer, offset_entry
from pymetaq.client.consumer.batch import MessageBatch, Messages
from pymetaq.client.consumer.config import (
    ConsumerConfig,
    InitialPosition,
    default_instance_id,
    effective_group,
)
from pymetaq.client.consumer.recover import DropPolicy, LocalRecoverPolicy
from pymetaq.client.consumer.scan import scan
from pymetaq.client.consumer.state import PartitionState, Step, apply_scan, backoff, grown_size
from pymetaq.client.errors import NoCommittedOffset
from pymetaq.client.transport.records import build_record, compress_batch
from pymetaq.client.types import Message, TopicPartition
from pymetaq.offsets import FileOffsetStore, OffsetEntry
from tests._helpers import wait_for
from tests.client._helpers import FakeLog, FakeTransport, Recording, cfg, run, stamped

TP = TopicPartition("t", 0, 0)


# ---------------------------------------------------------------- pure pieces


def test_scan_exact_fields_and_partial_tail() -> None:
    log = FakeLog()
    for i in range(3):
        log.append(b"v%d" % i)
    buf = bytes(log.data) + stamped(b"partial", 99)[:25]
    sc = scan(buf, TP, 1000)
    assert [(m.offset, m.next_offset, m.id, m.value) for m in sc.messages] == [
        (1000, 1022, 1, b"v0"),
        (1022, 1044, 2, b"v1"),
        (1044, 1066, 3, b"v2"),
    ]
    assert sc.next_offset == 1066 and sc.corrupt_at == -1
    assert all(isinstance(m, Message) and m.partition_key == "0-0" for m in sc.messages)


def test_scan_attribute_lz4_and_need() -> None:
    batch = compress_batch([build_record(b"a"), build_record(b"b", "x")])
    buf = stamped(b"p", 7, "attr") + batch
    sc = scan(buf, TP, 0)
    assert [(m.value, m.attribute) for m in sc.messages] == [
        (b"p", "attr"),
        (b"a", None),
        (b"b", "x"),
    ]
    first = 20 + 4 + 4 + 1
    assert sc.messages[1].offset == sc.messages[2].offset == first
    assert sc.next_offset == len(buf)
    big = stamped(b"x" * 500, 1)
    assert scan(big[:100], TP, 0).need == 520


def test_scan_reports_corruption_after_good_records() -> None:
    buf = bytearray(stamped(b"good", 1) + stamped(b"bad!", 2))
    buf[-1] ^= 1
    sc = scan(bytes(buf), TP, 10)
    assert [m.value for m in sc.messages] == [b"good"]
    assert sc.corrupt_at == 10 + 24 and sc.reason == "checksum mismatch"


def test_backoff_and_growth_rules() -> None:
    d, seq = 0.0, []
    for _ in range(12):
        d = backoff(d, 5000)
        seq.append(d)
    assert seq[:3] == [500.0, 1000.0, 1500.0] and seq[9:] == [5000.0] * 3
    assert grown_size(1024, 5000, 1 << 20) == 8192
    assert grown_size(1024, 5 << 20, 1 << 20) == 1 << 20
    c = cfg(fetch_max_size=128, fetch_max_size_cap=1024)
    st = PartitionState(TP, 0, 128)
    assert apply_scan(st, scan(stamped(b"x" * 300, 1)[:128], TP, 0), 128, c) is Step.GROW
    assert st.max_size == 512
    assert apply_scan(st, scan(stamped(b"y", 2), TP, 0), 21, c) is Step.PROGRESS
    assert st.max_size == 256  # halves back when replies are small
    assert apply_scan(st, scan(b"", TP, 21), 0, c) is Step.EMPTY and st.delay_ms == 5.0


def test_group_naming_and_initial_position_rules() -> None:
    assert effective_group("g", ConsumerConfig()) == "g"
    assert effective_group("g", ConsumerConfig(broadcast=True, instance_id="a1")) == "g-a1"
    assert effective_group("g", ConsumerConfig(broadcast=True)) == f"g-{default_instance_id()}"
    assert default_instance_id() == default_instance_id()
    assert "." not in default_instance_id()
    assert effective_group(None, ConsumerConfig()) is None
    with pytest.raises(ValueError):
        effective_group(None, ConsumerConfig(initial_position=InitialPosition.NONE))
    with pytest.raises(ValueError):
        effective_group("bad.group", ConsumerConfig())
    with pytest.raises(ValueError):
        ConsumerConfig(instance_id="a:b")
    assert ConsumerConfig(initial_position="latest").initial_position is InitialPosition.LATEST  # type: ignore[arg-type]


# ---------------------------------------------------------------- poll mode (async face)


def two_partitions(n: int) -> tuple[FakeTransport, dict[TopicPartition, list[int]]]:
    logs = {TopicPartition("t", 0, 0): FakeLog(), TopicPartition("t", 0, 1): FakeLog()}
    ids: dict[TopicPartition, list[int]] = {tp: [] for tp in logs}
    for i in range(n):
        tp = list(logs)[i % 2]
        logs[tp].append(b"m%d" % i)
        ids[tp].append(logs[tp].next_id - 1)
    return FakeTransport(logs), ids


def test_poll_order_positions_and_commit(tmp_path: Path) -> None:
    tr, ids = two_partitions(200)
    store = FileOffsetStore(tmp_path / "off.json")

    async def main() -> None:
        c = AsyncConsumer(
            group="g", offset_store=store, config=cfg(fetch_max_size=256), transport=tr
        )
        c.subscribe("t")
        got: dict[TopicPartition, list[int]] = {tp: [] for tp in ids}
        async with asyncio.timeout(30):
            while sum(map(len, got.values())) < 200:
                batch = await c.poll(1.0)
                assert batch
                for m in batch:
                    got[TopicPartition(m.topic, m.broker_id, m.partition)].append(m.id)
        assert got == ids  # every message, in log order per partition
        tp0 = TopicPartition("t", 0, 0)
        end0 = tr.logs[tp0].max_offset
        # the last poll's messages are not consumed until the next poll()/commit()
        assert c.position(tp0) <= end0
        await c.commit()
        assert c.position(tp0) == end0
        assert store.load("g", "t", "0-0") == OffsetEntry("t", "0-0", end0, ids[tp0][-1])
        await c.close()
        assert tr.closed

    run(main())


def test_restart_resumes_from_commit_and_initial_schemes(tmp_path: Path) -> None:
    tr, ids = two_partitions(10)
    store = FileOffsetStore(tmp_path / "off.json")
    tp1 = TopicPartition("t", 0, 1)
    store.commit("g", [OffsetEntry("t", "0-1", tr.logs[tp1].offsets[3], 4)])

    async def first(**kw: Any) -> list[Message]:
        c = AsyncConsumer(
            group=kw.pop("group", "g"), offset_store=store, config=cfg(**kw), transport=tr
        )
        c.subscribe("t")
        out: list[Message] = []
        for _ in range(3):
            out += await c.poll(0.05)
        await c.close()
        return out

    got = run(first())
    assert [m.id for m in got if m.partition == 1] == ids[tp1][3:]  # resumed at the commit
    assert [m.id for m in got if m.partition == 0] == ids[
        TopicPartition("t", 0, 0)
    ]  # auto=earliest
    assert run(first(group="new", initial_position="latest")) == []
    with pytest.raises(NoCommittedOffset):
        run(first(group="none", initial_position="none"))

    async def ungrouped() -> list[Message]:
        c = AsyncConsumer(group=None, config=cfg(), transport=tr).subscribe("t")
        first = await c.poll(0.05)
        tr.logs[tp1].append(b"late")
        later = await c.poll(1.0)
        await c.close()
        return first + later

    assert [m.value for m in run(ungrouped())] == [b"late"]  # ungrouped auto = latest


def test_seek_moved_and_crc_resync() -> None:
    log = FakeLog()
    for i in range(20):
        log.append(b"x%02d" % i)
    tr = FakeTransport({TP: log})

    async def main() -> None:
        c = AsyncConsumer(
            group=None, config=cfg(initial_position="earliest", fetch_max_size=100), transport=tr
        )
        c.subscribe("t")
        first = await c.poll(1.0)
        assert [m.value for m in first] == [b"x00", b"x01", b"x02", b"x03"]
        c.seek(TP, log.offsets[10])
        moved = await c.poll(1.0)
        assert moved[0].value == b"x10"
        # 301: beyond the end -> moved to the end; below the start -> moved to the start
        c.seek(TP, log.max_offset + 1000)
        assert await c.poll(0.05) == []
        assert c.position(TP) == log.max_offset
        # a corrupt record inside a reply: the good ones before it are delivered and the
        # next fetch starts at the bad record (a transmission error heals there)
        c.seek(TP, log.offsets[15])
        tr.corrupt_once[(TP, log.offsets[15])] = 30
        got: list[Message] = []
        async with asyncio.timeout(30):
            while len(got) < 5:
                got += await c.poll(1.0)
        assert [m.value for m in got] == [b"x15", b"x16", b"x17", b"x18", b"x19"]
        assert c.stats["crc_errors"] == 1
        # a corrupt first record: MetaQ's resync -> offset query -> restart at the segment
        # start (offset 0), records before the bad one are skipped, none duplicated
        c.seek(TP, log.offsets[12])
        tr.corrupt_once[(TP, log.offsets[12])] = 5
        fetched_at_zero = tr.fetches.count((TP, 0, 100))
        got = []
        async with asyncio.timeout(30):
            while len(got) < 8:
                got += await c.poll(1.0)
        assert [m.value for m in got] == [b"x%02d" % i for i in range(12, 20)]
        assert c.stats["crc_errors"] == 2
        assert tr.fetches.count((TP, 0, 100)) == fetched_at_zero + 1
        await c.close()

    run(main())


def test_retention_moves_offset_forward() -> None:
    log = FakeLog()
    for i in range(5):
        log.append(b"r%d" % i)
    tr = FakeTransport({TP: log})
    log.min_offset = 1 << 20  # everything before was deleted by retention
    log.data = bytearray()
    log.append(b"after")

    async def main() -> list[bytes]:
        c = AsyncConsumer(group=None, config=cfg(initial_position="earliest"), transport=tr)
        c.subscribe("t")
        await c.start()
        c.seek(TP, 0)
        out = await c.poll(1.0)
        await c.close()
        return [m.value for m in out]

    assert run(main()) == [b"after"]


# ---------------------------------------------------------------- listener mode (sync face)


def test_listener_retries_exactly_then_rejects(tmp_path: Path) -> None:
    log = FakeLog()
    for i in range(6):
        log.append(b"L%d" % i)
    tr = FakeTransport({TP: log})
    attempts: dict[bytes, int] = {}
    done: list[bytes] = []
    lock = threading.Lock()

    def listener(m: Message) -> None:
        with lock:
            attempts[m.value] = attempts.get(m.value, 0) + 1
            if m.value == b"L2":
                raise RuntimeError("poison")
            done.append(m.value)

    policy = Recording()
    store = FileOffsetStore(tmp_path / "o.json")
    c = Consumer(
        group="g",
        offset_store=store,
        config=cfg(max_fetch_retries=3),
        transport=tr,
        reject_policy=policy,
    )
    c.subscribe("t", listener)
    c.start()
    wait_for(lambda: len(done) == 5)
    c.close()
    assert attempts[b"L2"] == 4  # 1 + max_fetch_retries
    assert [m.value for m, _ in policy.rejected] == [b"L2"]
    assert done == [b"L0", b"L1", b"L3", b"L4", b"L5"]
    assert store.load("g", "t", "0-0").offset == log.max_offset  # type: ignore[union-attr]


def test_recover_spool_redelivers_after_restart(tmp_path: Path) -> None:
    log = FakeLog()
    log.append(b"poison", "a1")
    log.append(b"fine")
    tr = FakeTransport({TP: log})
    fail = True
    seen: list[bytes] = []

    def listener(m: Message) -> None:
        if m.value == b"poison" and fail:
            raise ValueError("not yet")
        seen.append(m.value)

    def consumer() -> Consumer:
        return Consumer(
            group="g",
            offset_store=FileOffsetStore(tmp_path / "o.json"),
            transport=tr,
            config=cfg(
                max_fetch_retries=1, recover_dir=str(tmp_path / "rec"), recover_interval_s=0.05
            ),
        )

    c = consumer().subscribe("t", listener)
    c.start()
    wait_for(lambda: seen == [b"fine"])
    c.close()
    spool_dir = tmp_path / "rec" / "t@g"
    assert spool_dir.is_dir() and any(spool_dir.glob("*.spool"))
    fail = False
    c2 = consumer().subscribe("t", listener)
    c2.start()
    wait_for(lambda: b"poison" in seen)
    c2.close()
    assert seen == [b"fine", b"poison"]
    policy = LocalRecoverPolicy(tmp_path / "rec", 3600)
    policy.bind("g", {"t": listener})
    assert policy.pending() == 0  # deleted on success
    policy.close()


def test_drop_policy_and_offset_entry() -> None:
    p = DropPolicy()
    m = Message("t", 1, 40, 9, b"v", None, 62, 3)
    p.reject(m, RuntimeError("x"))
    assert p.dropped == 1
    assert offset_entry(m) == OffsetEntry("t", "3-1", 62, 9)


# ---------------------------------------------------------------- lazy batches, lz4 positions


def test_lazy_batch_views_values_and_equality() -> None:
    log = FakeLog()
    for i in range(5):
        log.append(b"z%d" % i)
    sc = scan(bytes(log.data), TP, 100)
    batch = sc.messages
    assert isinstance(batch, MessageBatch) and len(batch) == 5
    eager = [
        Message("t", 0, 100 + 22 * i, i + 1, b"z%d" % i, None, 122 + 22 * i, 0) for i in range(5)
    ]
    assert list(batch) == eager and batch[-1] == eager[-1] and batch[1] == eager[1]
    view = batch[1:4]
    assert list(view) == eager[1:4] and view.values() == [b"z1", b"z2", b"z3"]
    both = Messages([view, [eager[0]]])
    assert both == [*eager[1:4], eager[0]] and len(both) == 4 and both[3] == eager[0]
    assert both.values() == [b"z1", b"z2", b"z3", b"z0"]
    assert Messages([]) == [] and not Messages([])


def test_lz4_batch_position_stays_at_the_record_until_its_last_message() -> None:
    batch = compress_batch([build_record(b"a"), build_record(b"b"), build_record(b"c")])
    buf = stamped(b"before", 1) + batch
    sc = scan(buf, TP, 0)
    st = PartitionState(TP, 0, 1 << 20)
    assert apply_scan(st, sc, len(buf), cfg()) is Step.PROGRESS
    positions = []
    for _ in range(4):
        st.consume_head()
        positions.append(st.position)
    assert positions == [26, 26, 26, len(buf)]  # a crash mid-batch redelivers the batch


def test_assign_commits_released_partitions_and_positions_new_ones(tmp_path: Path) -> None:
    tr, ids = two_partitions(6)
    store = FileOffsetStore(tmp_path / "o.json")
    tp0, tp1 = TopicPartition("t", 0, 0), TopicPartition("t", 0, 1)

    async def main() -> None:
        c = AsyncConsumer(group="g", offset_store=store, config=cfg(), transport=tr).subscribe("t")
        got: list[Message] = []
        async with asyncio.timeout(30):
            while len(got) < 6:
                got += await c.poll(1.0)
        await c.poll(0.01)  # the first poll's messages now count as consumed
        await c.assign([tp0])  # release tp1: its position is committed first
        assert c.assignment() == [tp0]
        e = store.load("g", "t", "0-1")
        assert e is not None and e.offset == tr.logs[tp1].max_offset and e.msg_id == ids[tp1][-1]
        tr.logs[tp1].append(b"new")
        await c.assign([tp0, tp1])  # owned again: resumes at the committed offset
        more = await c.poll(1.0)
        assert [m.value for m in more] == [b"new"]
        await c.close()

    run(main())
