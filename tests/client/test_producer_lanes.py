"""The per-message send path's lock-free lanes (client/producer/lanes.py) against a real broker.

What a user relies on, whichever path a message takes: every message stored exactly once, in
send order per thread and partition, each handle reporting the stored message's own offset and
id, callbacks run exactly once — also when another thread asks for a handle's result while the
owner keeps appending, when the sender absorbs a lane in the middle of a burst, and when the
owner mixes lane sends with the locked paths (``send``, ``send_many``, keys, attributes).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from functools import partial

import pytest

from pymetaq.client import (
    AsyncProducer,
    Producer,
    RequestTimeout,
    SendHandle,
    UnknownTopicOrPartition,
)
from pymetaq.client.producer.lanes import LaneHandle
from pymetaq.client.types import SendResult
from tests._broker import BrokerProcess
from tests.client._helpers import SilentBroker, fetch_all

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("lanes")
    with BrokerProcess.start(tmp, topics={"one-*": {"numPartitions": 1}}) as b:
        yield b


@pytest.fixture
def url(broker: BrokerProcess) -> str:
    return f"meta://{broker.host}:{broker.port}"


def _topic() -> str:
    return f"one-{uuid.uuid4().hex[:10]}"


def _check_positions(
    broker: BrokerProcess, topic: str, sent: list[tuple[bytes, SendResult]]
) -> None:
    """Stored log == send order, and every result names its own stored message."""
    stored = fetch_all(broker.address, topic, 0)
    assert [m.value for m in stored] == [v for v, _ in sent], "lost, duplicated or reordered"
    by_offset = {m.offset: m for m in stored}
    for value, r in sent:
        assert r.success, r.error
        m = by_offset[r.offset]
        assert (m.value, m.id) == (value, r.msg_id)


def _count(calls: Counter[int], i: int, _handle: SendHandle) -> None:
    calls.update([i])


def test_lane_sends_mixed_with_locked_paths_keep_order_and_positions(
    broker: BrokerProcess, url: str, seed: int
) -> None:
    rng = random.Random(seed)
    topic = _topic()
    sent: list[tuple[bytes, SendHandle | SendResult]] = []
    calls: Counter[int] = Counter()
    with Producer(
        url, linger_ms=rng.choice([0, 1, 5]), batch_messages=rng.choice([7, 100, 1000])
    ) as p:
        p.partitions(topic)
        for i in range(6000):
            v = b"%d:" % i + b"x" * rng.randrange(0, 200)
            kind = rng.random()
            if kind < 0.9:
                h = p.send_async(topic, v)
                if rng.random() < 0.1:
                    h.add_done_callback(partial(_count, calls, i))
                    calls[-1] += 1
                sent.append((v, h))
            elif kind < 0.93:
                sent.append((v, p.send(topic, v)))
            elif kind < 0.96:
                vs = [v + b"/%d" % k for k in range(rng.randrange(1, 20))]
                results = p.send_many(topic, vs).result(30)
                sent += list(zip(vs, results, strict=True))
            elif kind < 0.98:
                sent.append((v, p.send_async(topic, v, attribute="a")))
            else:
                sent.append((v, p.send_async(topic, v, key=b"k")))
        assert p.flush(60)
        done = [(v, h if isinstance(h, SendResult) else h.result(0)) for v, h in sent]
    assert sum(1 for _, h in sent if isinstance(h, LaneHandle)) > 4000, "the lane path ran"
    _check_positions(broker, topic, done)
    expected = calls.pop(-1, 0)
    assert sum(calls.values()) == expected and set(calls.values()) <= {1}, "callbacks once"


def test_results_asked_from_another_thread_while_the_owner_appends(
    broker: BrokerProcess, url: str
) -> None:
    """A handle's result wanted before the sender took its lane: the lane is absorbed by the
    asking thread while the owner keeps appending to it; nothing is lost or duplicated."""
    topic = _topic()
    handles: list[tuple[bytes, SendHandle]] = []
    asked: list[SendResult] = []
    stop = threading.Event()

    def ask() -> None:  # takes whatever the owner has queued last, over and over
        while not stop.is_set():
            if handles:
                asked.append(handles[-1][1].result(30))

    with Producer(url, linger_ms=20) as p:
        p.partitions(topic)
        asker = threading.Thread(target=ask)
        asker.start()
        try:
            # at least 10,000, and on until the asker has had an answer while the owner
            # appends (a fast owner can finish first: the asker then asked nothing)
            deadline = time.monotonic() + 60
            i = 0
            while i < 10_000 or (not asked and time.monotonic() < deadline):
                v = b"m%d" % i
                handles.append((v, p.send_async(topic, v)))
                i += 1
        finally:
            stop.set()
            asker.join(60)
        assert p.flush(60)
        results = [(v, h.result(0)) for v, h in handles]
    assert asked and all(r.success for r in asked)
    _check_positions(broker, topic, results)


def test_owner_and_other_threads_each_keep_their_order(broker: BrokerProcess, url: str) -> None:
    topic, threads, per_thread = _topic(), 3, 5000
    with Producer(url, linger_ms=1, batch_messages=64) as p:
        p.partitions(topic)

        def work(t: int) -> None:
            for i in range(per_thread):
                p.send_async(topic, f"{t}:{i}".encode())

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        work(threads)  # this thread too
        for t in ts:
            t.join()
        assert p.flush(60)
    last: dict[int, int] = {}
    count: Counter[int] = Counter()
    for m in fetch_all(broker.address, topic, 0):
        tid, i = map(int, m.value.split(b":"))
        assert i == last.get(tid, -1) + 1, f"thread {tid}: {i} after {last.get(tid)}"
        last[tid] = i
        count[tid] += 1
    assert count == {t: per_thread for t in range(threads + 1)}


def test_lane_sends_are_bounded_by_the_buffer() -> None:
    """A broker that never answers: lane sends fill ``buffer_bytes`` and then fail with
    RequestTimeout (the asyncio face never blocks), instead of queueing without bound."""

    async def main(url: str) -> int:
        sent = 0
        async with AsyncProducer(url, buffer_bytes=64 * 1024, batch_messages=100) as p:
            await p.publish("any")
            with pytest.raises(RequestTimeout, match="buffer full"):
                for _ in range(100_000):
                    p.send_nowait("any", b"x" * 100)
                    sent += 1
                    if sent % 1000 == 0:
                        await asyncio.sleep(0)  # the sender runs (and gets no answer)
        return sent

    with SilentBroker(partitions=1) as fake:
        sent = asyncio.run(main(fake.url))
    record = 120  # 20-byte header + 100
    assert 64 * 1024 - 100 * record <= sent * record <= 64 * 1024 + 100 * record


def test_kept_handles_hold_no_payload(url: str) -> None:
    """Handles kept after their acks (to read results later) keep no payload alive."""
    topic = _topic()
    value = os.urandom(5000)
    base = sys.getrefcount(value)
    with Producer(url) as p:
        p.partitions(topic)
        handles = [p.send_async(topic, value) for _ in range(300)]
        assert p.flush(30)
        offsets = [h.result(0).offset for h in handles]
        assert sys.getrefcount(value) == base
    assert offsets == [i * 5020 for i in range(300)]


def test_explicit_partition_sends_take_the_lane_and_pin_their_batches(
    broker: BrokerProcess, url: str, seed: int
) -> None:
    """``send_async(topic, v, partition=i)`` goes through the lane like a round-robin send
    (order and positions hold when the two mix) and pins the batches it fills (a failed one
    is never re-routed); a lane that only ever held round-robin values stays unpinned."""
    rng = random.Random(seed)
    topic, free = _topic(), _topic()
    sent: list[tuple[bytes, SendHandle]] = []
    with Producer(url, linger_ms=5, batch_messages=rng.choice([7, 100, 1000])) as p:
        p.partitions(topic)
        p.partitions(free)
        for i in range(3000):
            v = b"%d:" % i + b"y" * rng.randrange(0, 100)
            pin = rng.random() < 0.5
            sent.append((v, p.send_async(topic, v, partition=0) if pin else p.send_async(topic, v)))
        pinned = p.send_async(topic, b"pinned", partition=0)
        unpinned = p.send_async(free, b"free")
        assert isinstance(pinned, LaneHandle) and isinstance(unpinned, LaneHandle)
        assert pinned._where()[0].pinned and not unpinned._where()[0].pinned
        sent.append((b"pinned", pinned))
        with pytest.raises(UnknownTopicOrPartition, match="index 1 is out of range"):
            p.send_async(topic, b"nowhere", partition=1)  # still checked, on the slow path
        assert p.flush(60)
        done = [(v, h.result(0)) for v, h in sent]
    assert sum(1 for _, h in sent if isinstance(h, LaneHandle)) > 2500, "the lane path ran"
    _check_positions(broker, topic, done)
