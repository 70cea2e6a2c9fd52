"""Completed sends leave no reference cycles: batches and handles are freed by refcounting.

Regression for the ack-latency stalls of issue 5: a callback added with ``add_done_callback``
refers to its handle, the handle to its batch and the batch to its future; when callbacks were
stored on the ``concurrent.futures.Future`` (which never drops them), every batch with a
callback was a cycle (batch -> future -> callback -> handle -> batch) that only the cyclic GC
could free, and at 100k msgs/s full collections stalled the producer for 20-30 ms. Here the
cyclic GC is disabled while sending, so any such cycle survives the flush and is counted.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from pymetaq.client import AsyncProducer, Producer
from pymetaq.client.producer.batch import Batch, BatchHandle, SendHandle
from tests._broker import BrokerProcess

pytestmark = pytest.mark.integration

SENDS = 300


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("producer-gc")
    with BrokerProcess.start(tmp, topics={"gc-*": {"numPartitions": 2}}) as b:
        yield f"meta://{b.host}:{b.port}"


def _alive() -> dict[str, int]:
    """Live producer objects (the cyclic GC is off, so cycles are still here)."""
    kinds = (Batch, SendHandle, BatchHandle)
    counts = {k.__name__: 0 for k in kinds}
    for obj in gc.get_objects():
        for kind in kinds:  # SendHandle: its two kinds (BatchSendHandle, LaneHandle)
            if isinstance(obj, kind):
                counts[kind.__name__] += 1
    return counts


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_thread_face_callbacks_leave_no_batches_or_handles(url: str, no_cyclic_gc: None) -> None:
    topic = f"gc-{uuid.uuid4().hex[:10]}"
    calls: list[int] = []
    lock = threading.Lock()

    def done(_handle: Any) -> None:
        with lock:
            calls.append(1)

    with Producer(url, linger_ms=0) as p:
        p.partitions(topic)
        assert _alive() == {"Batch": 0, "SendHandle": 0, "BatchHandle": 0}
        for i in range(SENDS):
            p.send_async(topic, b"m%d" % i).add_done_callback(done)
            if i % 10 == 0:
                p.send_many(topic, [b"a", b"b", b"c"]).add_done_callback(done)
        assert p.flush(30)
        assert len(calls) == SENDS + SENDS // 10
        assert _alive() == {"Batch": 0, "SendHandle": 0, "BatchHandle": 0}


def test_asyncio_face_callbacks_leave_no_batches_or_handles(url: str, no_cyclic_gc: None) -> None:
    topic = f"gc-{uuid.uuid4().hex[:10]}"
    calls: list[int] = []

    async def main() -> dict[str, int]:
        async with AsyncProducer(url, linger_ms=0) as p:
            await p.publish(topic)
            for i in range(SENDS):
                p.send_nowait(topic, b"m%d" % i).add_done_callback(lambda _h: calls.append(1))
                if i % 50 == 0:
                    await asyncio.sleep(0)
            await p.flush()
            return _alive()

    assert asyncio.run(main()) == {"Batch": 0, "SendHandle": 0, "BatchHandle": 0}
    assert len(calls) == SENDS


def test_a_pending_callback_keeps_no_object_of_its_own() -> None:
    """``add_done_callback`` on a message waiting for its ack stores ``fn, handle`` flat on the
    batch: no ``partial`` or pair per message lives until the ack (a backlog of unacked
    messages is what the cyclic GC walks; bench.timeline saw 180 ms collections in a gap)."""
    import concurrent.futures

    from pymetaq.client.producer.batch import BatchSendHandle
    from pymetaq.client.types import TopicPartition

    batch = Batch(TopicPartition("t", 0, 0), concurrent.futures.Future(), 0.0)
    handles = [BatchSendHandle(batch, i, 0) for i in range(2000)]
    got: list[SendHandle] = []
    fn = got.append  # one callable for all (a bound method is a new object per access)
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for h in handles:
            h.add_done_callback(fn)
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert grown < 20, grown  # was one partial per callback (2000)
    batch.complete()
    assert got == handles  # each callback got its own handle, in order
