"""Producer against a real broker process: stored bytes, order, selection, futures, lz4, errors."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pymetaq.client import (
    AsyncProducer,
    MessageTooLarge,
    Producer,
    RequestTimeout,
    TopicPartition,
    UnknownTopicOrPartition,
)
from pymetaq.client.errors import ClientClosed, ConnectionLost, NoBrokerAvailable
from pymetaq.storage.record import FLAG_LZ4_BATCH, HEADER
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.client._helpers import SilentBroker, fetch_all, fetch_raw

pytestmark = pytest.mark.integration

NPART = 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("producer")
    topics = {"p-*": {"numPartitions": NPART}, "one-*": {"numPartitions": 1}}
    with BrokerProcess.start(tmp, topics=topics) as b:
        yield b


@pytest.fixture
def url(broker: BrokerProcess) -> str:
    return f"meta://{broker.host}:{broker.port}"


def _topic(prefix: str = "p") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _all(broker: BrokerProcess, topic: str, n: int = NPART) -> list[list[bytes]]:
    return [[m.value for m in fetch_all(broker.address, topic, p)] for p in range(n)]


def test_send_stores_exact_record_and_reports_its_position(broker: BrokerProcess, url: str) -> None:
    topic = _topic()
    with Producer(url) as p:
        assert p.partitions(topic) == [TopicPartition(topic, 0, i) for i in range(NPART)]
        r1 = p.send(topic, b"hello", partition=2)
        r2 = p.send(topic, b"world", partition=2, attribute="tag")
    assert r1.success and r2.success, (r1, r2)
    assert (r1.partition, r1.offset, r1.broker_id) == (2, 0, 0)
    assert r2.offset == 20 + 5  # right after the first record
    assert r2.msg_id > r1.msg_id
    msgs = fetch_all(broker.address, topic, 2)
    assert [(m.value, m.attribute, m.offset, m.id) for m in msgs] == [
        (b"hello", None, 0, r1.msg_id),
        (b"world", "tag", 25, r2.msg_id),
    ]
    raw = fetch_raw(broker.address, topic, 2)
    length, _crc, msg_id, flag = HEADER.unpack_from(raw, 0)
    assert (length, msg_id, flag) == (5, r1.msg_id, 0) and raw[20:25] == b"hello"


def test_per_partition_order_with_concurrent_senders(broker: BrokerProcess, url: str) -> None:
    topic, threads, per_thread = _topic(), 4, 2000
    with Producer(url, linger_ms=1) as p:
        p.partitions(topic)

        def work(t: int) -> None:
            for i in range(per_thread):
                p.send_async(topic, f"{t}:{i}".encode())

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert p.flush(60)
    seen: dict[int, list[int]] = {t: [] for t in range(threads)}
    for values in _all(broker, topic):
        last: dict[int, int] = {}
        for v in values:
            tid, i = map(int, v.split(b":"))
            assert i > last.get(tid, -1), (
                f"thread {tid}: {i} after {last.get(tid)} in one partition"
            )
            last[tid] = i
            seen[tid].append(i)
    for tid in range(threads):
        assert sorted(seen[tid]) == list(range(per_thread)), "lost or duplicated messages"


def test_round_robin_spreads_evenly_in_partition_order(broker: BrokerProcess, url: str) -> None:
    topic = _topic()
    with Producer(url) as p:
        handles = [p.send_async(topic, str(i).encode()) for i in range(40)]
        p.flush()
        assert [h.result().partition for h in handles[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]
    stored = _all(broker, topic)
    assert [len(v) for v in stored] == [10] * NPART
    assert stored[1] == [str(i).encode() for i in range(1, 40, 4)]


def _hash_in_subprocess(keys: list[str], n: int) -> list[int]:
    code = (
        "import sys; from pymetaq.client.producer.partitioner import key_hash_index as h;"
        f"print(' '.join(str(h(k.encode(), {n})) for k in sys.argv[1:]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *keys], capture_output=True, text=True, check=True
    )
    return [int(x) for x in out.stdout.split()]


def test_key_hash_is_stable_across_processes(broker: BrokerProcess, url: str) -> None:
    topic = _topic()
    keys = [f"customer-{i}" for i in range(30)]
    with Producer(url) as p:
        placed = {
            k: p.send(topic, f"{k}#{j}".encode(), key=k).partition for k in keys for j in range(3)
        }
        again = {k: p.send(topic, b"x", key=k.encode()).partition for k in keys}
    assert placed == again
    expected = _hash_in_subprocess(keys, NPART)  # a different interpreter (hash randomisation)
    assert [placed[k] for k in keys] == expected
    assert expected == [zlib.crc32(k.encode()) % NPART for k in keys]
    assert len(set(expected)) == NPART  # 30 keys reach every partition
    stored = _all(broker, topic)
    for k in keys:  # all of a key's messages sit in its partition, in order
        vals = [v for v in stored[placed[k]] if v.startswith(f"{k}#".encode())]
        assert vals == [f"{k}#{j}".encode() for j in range(3)]


def test_custom_and_random_partitioners(broker: BrokerProcess, url: str) -> None:
    topic = _topic()
    calls: list[int] = []

    def last_partition(t: str, parts: object, msg: object) -> int:
        calls.append(1)
        return 3

    with Producer(url, partitioner=last_partition) as p:
        assert p.send(topic, b"a").partition == 3
    assert calls == [1]
    with Producer(url, partitioner="random") as p:
        parts = {p.send_async(topic, b"r").result(30).partition for _ in range(200)}
    assert parts == set(range(NPART))
    with Producer(url) as p, pytest.raises(UnknownTopicOrPartition):
        p.send(topic, b"x", partition=NPART)


def test_send_async_handles_all_resolve_with_consecutive_positions(
    broker: BrokerProcess, url: str
) -> None:
    topic = _topic("one")
    n = 5000
    with Producer(url, batch_messages=300, max_in_flight=3) as p:
        handles = [p.send_async(topic, i.to_bytes(4, "big") * 25) for i in range(n)]
        results = [h.result(60) for h in handles]
    assert all(r.success for r in results)
    assert [r.offset for r in results] == [i * 120 for i in range(n)]
    ids = [r.msg_id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == n
    stored = fetch_all(broker.address, topic, 0)
    assert [m.id for m in stored] == ids
    assert [m.value for m in stored] == [i.to_bytes(4, "big") * 25 for i in range(n)]


@pytest.mark.parametrize("face", ["threads", "asyncio"])
def test_flush_returns_after_every_callback_ran(broker: BrokerProcess, url: str, face: str) -> None:
    """As Kafka's flush: when ``flush()`` returns, every message queued before it is
    acknowledged *and its callback has run* (the callbacks run on the I/O thread after their
    batch's future completes; slow ones make a flush that waited only for futures return
    with most of them still to run)."""
    topic = _topic("one")
    n = 300
    ran: list[int] = []

    def slow(i: int) -> Callable[[object], None]:
        def on_done(handle: object) -> None:
            time.sleep(0.001)
            ran.append(i)

        return on_done

    if face == "threads":
        with Producer(url, batch_messages=100) as p:
            for i in range(n):
                p.send_async(topic, b"m").add_done_callback(slow(i))
            assert p.flush(60)
            assert len(ran) == n
    else:

        async def main() -> None:
            async with AsyncProducer(url, batch_messages=100) as p:
                await p.publish(topic)
                for i in range(n):
                    p.send_nowait(topic, b"m").add_done_callback(slow(i))
                await p.flush()
                assert len(ran) == n

        asyncio.run(main())
    assert ran == list(range(n))


def test_flush_inside_a_callback_returns(url: str) -> None:
    """A callback runs on the I/O thread: a ``flush()`` there must not wait for a round of
    the loop it is blocking (nothing else is queued, so it returns True at once)."""
    results: list[bool] = []
    called = threading.Event()
    with Producer(url) as p:

        def on_done(handle: object) -> None:
            results.append(p.flush(5))
            called.set()

        p.send_async(_topic("one"), b"m").add_done_callback(on_done)
        assert called.wait(10)
    assert results == [True]


def test_send_many_is_one_ordered_block(broker: BrokerProcess, url: str) -> None:
    topic = _topic("one")
    values = [f"bulk-{i}".encode() for i in range(2500)]
    with Producer(url, batch_messages=1000) as p:
        p.send(topic, b"first")
        h = p.send_many(topic, values)
        p.send(topic, b"last")
        results = h.result(60)
    assert [r.success for r in results] == [True] * 2500
    stored = fetch_all(broker.address, topic, 0)
    assert [m.value for m in stored] == [b"first", *values, b"last"]
    assert [r.offset for r in results] == [m.offset for m in stored[1:-1]]
    assert [r.msg_id for r in results] == [m.id for m in stored[1:-1]]


def test_lz4_compression_round_trip(broker: BrokerProcess, url: str, seed: int) -> None:
    rng = random.Random(seed)
    topic = _topic("one")
    values = [f"event {i} {'x' * rng.randrange(0, 200)}".encode() for i in range(3000)]
    with Producer(url, compression="lz4", batch_messages=1000, linger_ms=60_000) as p:
        handles = [p.send_async(topic, v) for v in values]
        results = [h.result(60) for h in handles]
    assert all(r.success for r in results)
    raw = fetch_raw(broker.address, topic, 0)
    length, _crc, _id, flag = HEADER.unpack_from(raw, 0)
    assert flag == FLAG_LZ4_BATCH
    assert length < sum(len(v) + 20 for v in values[:1000])  # it is compressed
    stored = fetch_all(broker.address, topic, 0)
    assert [m.value for m in stored] == values
    # every message of an lz4 batch reports the outer record's offset and id
    assert {(r.offset, r.msg_id) for r in results[:1000]} == {(stored[0].offset, stored[0].id)}
    assert len({r.offset for r in results}) == 3


def test_message_too_large_and_bad_value(url: str) -> None:
    with Producer(url, max_message_bytes=1000) as p:
        with pytest.raises(MessageTooLarge):
            p.send_async("p-x", b"x" * 1001)
        with pytest.raises(TypeError):
            p.send_async("p-x", "text")  # type: ignore[arg-type]
        with pytest.raises(UnknownTopicOrPartition):
            p.send("no-such-topic", b"x")


def test_timeout_is_reported_as_request_timeout() -> None:
    with SilentBroker(partitions=2) as fake:
        with Producer(fake.url, request_timeout_ms=200) as p:
            r = p.send("any", b"lost?")
            assert not r.success
            assert isinstance(r.error, RequestTimeout) and r.error.retriable
            h = p.send_async("any", b"async")
            assert isinstance(h.result(10).error, RequestTimeout)
        # the fake counts on its own thread, which may not have read the last put yet
        wait_for(lambda: fake.requests >= 2, 10, "both puts reached the fake broker")
        assert fake.requests == 2


def test_retries_resend_after_timeout(tmp_path: Path) -> None:
    with SilentBroker(partitions=1) as fake:
        with Producer(fake.url, request_timeout_ms=100, retries=2, retry_backoff_ms=10) as p:
            r = p.send("any", b"again")
        assert isinstance(r.error, RequestTimeout)
        wait_for(lambda: fake.requests >= 3, 10, "the retries reached the fake broker")
        assert fake.requests == 3  # one attempt + two retries


def test_no_broker_and_lost_connection(tmp_path: Path) -> None:
    with pytest.raises(NoBrokerAvailable):
        Producer("meta://127.0.0.1:1", connect_timeout_ms=500)
    with BrokerProcess.start(tmp_path, topics={"t": {"numPartitions": 1}}) as b:
        p = Producer(f"meta://{b.host}:{b.port}", request_timeout_ms=2000)
        try:
            assert p.send("t", b"ok").success
            b.kill()
            r = p.send("t", b"after kill")
            assert not r.success
            assert isinstance(r.error, (ConnectionLost, NoBrokerAvailable)) and r.error.retriable
        finally:
            p.close()


def test_async_producer(broker: BrokerProcess, url: str) -> None:
    topic = _topic("one")

    async def main() -> list[int]:
        async with AsyncProducer(url, linger_ms=1) as p:
            with pytest.raises(UnknownTopicOrPartition):
                p.send_nowait(topic, b"not yet published")
            first = await p.send(topic, b"a0")
            handles = [p.send_nowait(topic, f"a{i}".encode()) for i in range(1, 500)]
            bulk = p.send_many(topic, [b"b0", b"b1"])
            results = await asyncio.gather(*handles)
            assert all(r.success for r in results)
            assert [r.success for r in await bulk] == [True, True]
            await p.flush()
            return [first.offset, *(r.offset for r in results)]

    offsets = asyncio.run(main())
    stored = fetch_all(broker.address, topic, 0)
    assert [m.value for m in stored] == [f"a{i}".encode() for i in range(500)] + [b"b0", b"b1"]
    assert offsets == [m.offset for m in stored[:500]]


def test_close_completes_sends_still_in_flight() -> None:
    with SilentBroker(partitions=1) as fake:
        p = Producer(fake.url, request_timeout_ms=60_000)
        h = p.send_async("any", b"pending")
        assert p.flush(0.2) is False  # the broker never answers
        p.close(timeout_s=0.1)
        r = h.result(5)
        assert not r.success and isinstance(r.error, (ClientClosed, ConnectionLost))
        with pytest.raises(ClientClosed):
            p.send_async("any", b"after close")


def test_retries_keep_order_across_a_broker_restart(tmp_path: Path) -> None:
    from tests._helpers import wait_for
    from tests.client._helpers import free_port

    port = free_port()
    broker = BrokerProcess.start(tmp_path, system={"serverPort": port}, topics={"r": {}})
    try:
        n = 3000
        with Producer(
            f"meta://127.0.0.1:{port}", retries=100, retry_backoff_ms=50, batch_messages=100
        ) as p:
            handles = [p.send_async("r", f"{i}".encode()) for i in range(n // 2)]
            wait_for(lambda: handles[10].done(), what="first acks")
            assert broker.terminate() == 0
            handles += [p.send_async("r", f"{i}".encode()) for i in range(n // 2, n)]
            broker.restart()
            results = [h.result(60) for h in handles]
        assert all(r.success for r in results), {str(r.error) for r in results if not r.success}
        stored = [int(m.value) for m in fetch_all(broker.address, "r", 0)]
        first_seen = list(dict.fromkeys(stored))  # duplicates (a resent batch) dropped
        assert first_seen == list(range(n))
    finally:
        broker.__exit__(None, None, None)
