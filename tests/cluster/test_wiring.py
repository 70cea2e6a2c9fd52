"""How ``zk://`` is wired into the clients, as pure logic (no ZooKeeper, no broker process):

* the ``servers`` string picks the broker set;
* a :class:`ZkBrokerSet` follows registry views: partitions sorted, brokers added, retired
  (connections closed only after requests in flight had their time), marked down and up;
* the producer's sender moves a failed unpinned batch to a live partition — freely when the
  attempt was never written, within ``retries`` when it may have been stored, never a pinned
  batch, and not past the delivery timeout; a ``meta://`` set never moves anything;
* the consumer's membership: a revoke commits before it returns and waits for the
  application's next poll, a lost partition is parked without a commit and comes back at
  max(its own position, the committed offset), a connection drop fences everything at once,
  a failed assignment is rolled back, and listener delivery stops at the fence mid-chunk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.cluster.discovery import TopicView
from pymetaq.client.cluster.errors import ClusterError, ClusterUnavailable, MembershipConflict
from pymetaq.client.consumer import Consumer
from pymetaq.client.consumer.config import ConsumerConfig
from pymetaq.client.consumer.engine import ConsumerEngine
from pymetaq.client.consumer.membership import Membership
from pymetaq.client.consumer.scan import scan
from pymetaq.client.consumer.state import PartitionState
from pymetaq.client.errors import (
    ConnectionLost,
    MessageMayBeStored,
    MetaClientError,
    NoBrokerAvailable,
)
from pymetaq.client.producer.accumulator import Accumulator
from pymetaq.client.producer.sender import Sender, SenderConfig
from pymetaq.client.protocol import ResultReply
from pymetaq.client.protocol.zk import parse_zk_url
from pymetaq.client.transport.brokers import BrokerSet
from pymetaq.client.transport.servers import parse_servers, zk_servers
from pymetaq.client.transport.zkbrokers import ZkBrokerSet, open_broker_set
from pymetaq.client.types import SendResult, TopicPartition
from pymetaq.offsets import FileOffsetStore, OffsetEntry
from tests.client._helpers import FakeLog, FakeTransport, Recording, cfg

T0, T1 = TopicPartition("t", 0, 0), TopicPartition("t", 1, 0)


# ---------------------------------------------------------------- servers strings


def test_servers_string_picks_the_broker_set() -> None:
    assert zk_servers("zk://a:1,b:2/x") == "zk://a:1,b:2/x"
    assert zk_servers(["zk://a:1"]) == "zk://a:1"
    assert zk_servers("meta://a:1") is None and zk_servers(["meta://a:1", "b:2"]) is None
    with pytest.raises(ValueError, match="ZooKeeper URL: give it as the only server"):
        parse_servers("meta://a:1,zk://b:2")
    zk_set = open_broker_set("zk://127.0.0.1:1/r", side="pub")  # no I/O before start()
    assert isinstance(zk_set, ZkBrokerSet) and zk_set.reroutes
    assert zk_set.url.root == "/r" and zk_set.side == "pub" and not zk_set.zk.connected
    plain = open_broker_set("meta://127.0.0.1:1", side="sub")
    assert type(plain) is BrokerSet and not plain.reroutes
    assert all(issubclass(e, MetaClientError) for e in (ClusterError, ClusterUnavailable))
    assert issubclass(MembershipConflict, ClusterError)


# ---------------------------------------------------------------- ZkBrokerSet


class StubConn:
    def __init__(self, pending: int = 0) -> None:
        self.pending = pending
        self.closed = False

    def close(self) -> None:
        self.closed = True


def view(brokers: dict[int, int], ports: dict[int, int] | None = None) -> TopicView:
    parts = tuple(TopicPartition("t", b, p) for b in sorted(brokers) for p in range(brokers[b]))
    urls = {b: f"meta://127.0.0.1:{(ports or {}).get(b, 9000 + b)}" for b in brokers}
    return TopicView("t", parts, urls)


def test_zk_broker_set_follows_the_views() -> None:
    async def main() -> None:
        bs = ZkBrokerSet(parse_zk_url("zk://127.0.0.1:1"), side="pub", request_timeout_s=0.05)
        bs._loop, bs._changed = asyncio.get_running_loop(), asyncio.Event()
        bs._apply_view(view({10: 2, 2: 1}))
        assert bs.cached_partitions("t") == [
            TopicPartition("t", 2, 0),
            TopicPartition("t", 10, 0),
            TopicPartition("t", 10, 1),
        ]
        assert bs.brokers == {2: "meta://127.0.0.1:9002", 10: "meta://127.0.0.1:9010"}
        # a broker that does not answer leaves the lists at once; answering again restores it
        bs._set_down(10)
        assert [tp.broker_id for tp in bs.cached_partitions("t") or []] == [2]
        bs._set_up(10)
        assert len(bs.cached_partitions("t") or []) == 3
        # every broker down: the last list stays (sends fail fast and wait for one)
        bs._set_down(2)
        bs._set_down(10)
        assert len(bs.cached_partitions("t") or []) == 3
        bs._set_up(2)
        bs._set_up(10)
        # gone from the registry: retired; a connection with requests in flight closes later
        busy, idle = StubConn(pending=1), StubConn()
        bs._brokers[0].conn, bs._brokers[1].conn = busy, idle  # type: ignore[assignment]
        bs._apply_view(view({10: 2}, ports={10: 9999}))  # 2 vanished, 10 moved
        assert bs.brokers == {10: "meta://127.0.0.1:9999"}
        assert idle.closed and not busy.closed
        assert [tp.broker_id for tp in bs.cached_partitions("t") or []] == [10, 10]
        await asyncio.wait_for(_until(lambda: busy.closed), 5)
        with pytest.raises(NoBrokerAvailable, match="no registered server has broker_id 2"):
            bs._by_id(2)
        bs._apply_view(TopicView("t"))  # nothing registered any more
        assert bs.cached_partitions("t") is None
        bs.close()

    asyncio.run(main())


async def _until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0.005)


# ---------------------------------------------------------------- the sender's moves


class FakeConn:
    """Answers ``bput`` at once (``ok``), or takes it and loses the connection (written)."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.closed = False
        self.requests = 0

    def send_request(self, cmd: Any, timeout_s: float, on_done: Any = None) -> Any:
        self.requests += 1
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self.ok:
            fut.set_result(ResultReply(200, b"7 %d 100 1" % cmd.partition, 1))
        else:
            fut.set_exception(ConnectionLost("connection lost after the write"))
        loop.call_soon(on_done, fut)
        return fut


class FakeBrokers(BrokerSet):
    def __init__(self, conns: dict[int, FakeConn], parts: list[TopicPartition], reroutes: bool):
        super().__init__(None)
        self.conns = conns
        self._topics["t"] = parts
        self.reroutes = reroutes  # type: ignore[misc]

    def cached_connection(self, broker_id: int) -> Any:
        return self.conns.get(broker_id)

    async def connection(self, broker_id: int) -> Any:
        if broker_id in self.conns:
            return self.conns[broker_id]
        raise NoBrokerAvailable(f"broker {broker_id} does not answer")


async def send_one(
    brokers: FakeBrokers, tp: TopicPartition, *, pinned: bool, retries: int = 0, timeout: float = 2
) -> tuple[SendResult, float]:
    loop = asyncio.get_running_loop()
    sender = Sender(SenderConfig(5, 1.0, retries, 0.02, None, False, timeout), brokers, loop)
    acc = Accumulator(
        batch_messages=10,
        batch_bytes=1 << 20,
        linger_s=0,
        buffer_bytes=1 << 20,
        future_factory=loop.create_future,
        wake=sender.wake,
    )
    sender.attach(acc)
    t0 = time.monotonic()
    handle = acc.append(tp, b"x", None, True, None, pinned)
    result = await asyncio.wait_for(handle, timeout + 5)
    return result, time.monotonic() - t0


def test_unpinned_batch_moves_from_a_dead_broker_to_a_live_one() -> None:
    async def main() -> None:
        live = FakeConn()
        brokers = FakeBrokers({0: live}, [T0, T1], reroutes=True)
        r, _ = await send_one(brokers, T1, pinned=False)  # retries=0: never written, moved
        assert r.success and (r.broker_id, r.partition) == (0, 0) and live.requests == 1
        r, _ = await send_one(brokers, T1, pinned=True)
        assert not r.success and isinstance(r.error, NoBrokerAvailable)
        assert not isinstance(r.error, MessageMayBeStored)  # never written: never stored
        plain = FakeBrokers({0: FakeConn()}, [T0, T1], reroutes=False)
        r, _ = await send_one(plain, T1, pinned=False)  # meta:// lists keep MetaQ's one try
        assert not r.success and isinstance(r.error, NoBrokerAvailable)

    asyncio.run(main())


def test_a_written_attempt_moves_only_within_retries() -> None:
    async def main() -> None:
        lossy, live = FakeConn(ok=False), FakeConn()
        brokers = FakeBrokers({1: lossy, 0: live}, [T0, T1], reroutes=True)
        r, _ = await send_one(brokers, T1, pinned=False, retries=0)
        assert not r.success and isinstance(r.error, MessageMayBeStored)
        assert (lossy.requests, live.requests) == (1, 0)
        r, _ = await send_one(brokers, T1, pinned=False, retries=1)
        assert r.success and r.broker_id == 0 and (lossy.requests, live.requests) == (2, 1)

    asyncio.run(main())


def test_no_live_partition_fails_at_the_delivery_timeout() -> None:
    async def main() -> None:
        brokers = FakeBrokers({}, [T0, T1], reroutes=True)
        r, elapsed = await send_one(brokers, T1, pinned=False, timeout=0.5)
        assert not r.success and isinstance(r.error, NoBrokerAvailable)
        assert 0.4 <= elapsed < 2.0, elapsed

    asyncio.run(main())


# ---------------------------------------------------------------- the consumer's hand-off


class StubCoordinator:
    def __init__(self) -> None:
        self.deliverable: set[TopicPartition] = set()

    def may_deliver(self, tp: TopicPartition) -> bool:
        return tp in self.deliverable


def member(
    tmp_path: Path, logs: dict[TopicPartition, FakeLog], **config: Any
) -> tuple[ConsumerEngine, Membership, StubCoordinator, FileOffsetStore]:
    store = FileOffsetStore(tmp_path / "offsets.json")
    conf: ConsumerConfig = cfg(**config)
    engine = ConsumerEngine(FakeTransport(logs), "g", store, conf, Recording())  # type: ignore[arg-type]
    engine.topics = ["t"]
    m = Membership(
        engine,
        None,
        root="/meta",
        group="g",
        config=conf,
        quiesce=lambda parts: None,
        assigned=lambda states: None,
        follow=lambda topic: None,
    )
    coord = StubCoordinator()
    m.coordinator = coord  # type: ignore[assignment]
    engine.membership = m
    return engine, m, coord, store


def two_partitions(n: int = 3) -> dict[TopicPartition, FakeLog]:
    logs = {T0: FakeLog(), T1: FakeLog()}
    for log in logs.values():
        for i in range(n):
            log.append(b"m%d" % i)
    return logs


def test_revoke_waits_for_the_next_poll_then_commits(tmp_path: Path) -> None:
    async def main() -> None:
        logs = two_partitions()
        engine, m, coord, store = member(tmp_path, logs)
        coord.deliverable = {T0, T1}
        added = await m._acquire(frozenset({T0, T1}))
        assert sorted(st.tp for st in added) == [T0, T1]
        got = await engine.poll(5.0)
        engine.claim()
        assert len(got) == 6  # the application now holds them
        release = asyncio.ensure_future(m._release(frozenset({T0}), commit=True))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not release.done() and engine.states[T0].fenced  # fenced, waiting for the app
        assert store.load("g", "t", "0-0") is None
        engine.mark_returned_consumed()  # its next poll()/commit()
        await release
        assert T0 not in engine.states and T1 in engine.states
        entry = store.load("g", "t", "0-0")
        assert entry is not None and entry.offset == logs[T0].max_offset

    asyncio.run(main())


def test_revoke_gives_up_waiting_after_max_poll_interval(tmp_path: Path) -> None:
    async def main() -> None:
        logs = two_partitions()
        engine, m, coord, store = member(tmp_path, logs, max_poll_interval_ms=50)
        coord.deliverable = {T0}
        await m._acquire(frozenset({T0}))
        assert len(await engine.poll(5.0)) == 3
        engine.claim()
        await m._release(frozenset({T0}), commit=True)
        entry = store.load("g", "t", "0-0")  # what was consumed before the last poll: nothing
        assert entry is None or entry.offset == 0

    asyncio.run(main())


def test_lost_parks_without_commit_and_comes_back_at_its_own_position(tmp_path: Path) -> None:
    async def main() -> None:
        logs = two_partitions()
        engine, m, coord, store = member(tmp_path, logs)
        coord.deliverable = {T0}
        await m._acquire(frozenset({T0}))
        assert len(await engine.poll(5.0)) == 3
        engine.claim()
        engine.mark_returned_consumed()
        m._on_state("SUSPENDED")  # kazoo's thread: everything fenced at once
        assert engine.states[T0].fenced
        assert await engine.poll(0) == []  # nothing delivered from a fenced partition
        await m._release(frozenset({T0}), commit=False)
        assert T0 in engine.parked and store.load("g", "t", "0-0") is None
        store.commit("g", [OffsetEntry("t", "0-0", 22, 1)])  # an older commit
        (st,) = await m._acquire(frozenset({T0}))
        assert st.position == logs[T0].max_offset and not st.fenced  # max(own, committed)
        await m._release(frozenset({T0}), commit=True)
        store.commit("g", [OffsetEntry("t", "0-0", logs[T0].max_offset + 1000, 9)])  # ahead
        (st,) = await m._acquire(frozenset({T0}))
        assert st.position == logs[T0].max_offset + 1000

    asyncio.run(main())


def test_assignment_fenced_when_the_session_dropped_meanwhile_and_rolled_back_on_error(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        logs = two_partitions()
        ta = TopicPartition("t", 0, 1)
        logs[ta] = FakeLog()
        engine, m, coord, _store = member(tmp_path, logs, initial_position="latest")
        coord.deliverable = set()  # the connection dropped between claim and on_assign
        (st,) = await m._acquire(frozenset({T0}))
        assert st.fenced
        coord.deliverable = {ta, T1}
        del logs[T1]  # positioning T1 fails: nothing of this assignment may stay
        with pytest.raises(KeyError):
            await m._acquire(frozenset({ta, T1}))
        assert set(engine.states) == {T0}

    asyncio.run(main())


def test_listener_delivery_stops_at_the_fence_mid_chunk() -> None:
    c = Consumer(transport=FakeTransport({T0: FakeLog()}), reject_policy=Recording())
    try:
        c.membership = object()  # type: ignore[assignment]  # turns on the per-message check
        log = FakeLog()
        for i in range(10):
            log.append(b"v%d" % i)
        st = PartitionState(T0, 0, 1024)
        st.buffer = scan(bytes(log.data), T0, 0).messages
        c._engine.states[T0] = st
        seen: list[bytes] = []

        def listener(msg: Any) -> None:
            seen.append(msg.value)
            if len(seen) == 4:
                st.fenced = True  # a revoke (or a dropped session) arrives during message 4

        c._listeners["t"] = listener
        c._deliver(st)
        assert seen == [b"v0", b"v1", b"v2", b"v3"]
        assert st.position == log.offsets[4] and st.index == 4
    finally:
        c.close()
