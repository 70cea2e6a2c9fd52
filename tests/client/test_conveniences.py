"""The client conveniences against a real broker: iterating a consumer (sync and async, exact
positions when the loop stops part-way, stopping on close), serializers, keys that travel with
their messages, timestamps, and sends that raise when asked."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client import AsyncConsumer, AsyncProducer, Consumer, Message, Producer
from pymetaq.client.errors import MetaClientError, PartitionClosed, SerializationError
from pymetaq.client.types import TopicPartition
from pymetaq.offsets import FileOffsetStore
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.client._helpers import fetch_all, produce, server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    topics: dict[str, dict[str, Any]] = {
        "it": {},
        "ait": {},
        "keys": {"numPartitions": 3},
        "ser": {},
        "closed": {"acceptPublish": "false"},
    }
    with BrokerProcess.start(tmp_path_factory.mktemp("conv"), topics=topics) as b:
        yield b


def test_for_message_in_consumer_stops_exactly_where_the_loop_stopped(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    produce(broker, "it", 0, [f"v{i}".encode() for i in range(10)])  # 22-byte records
    store = FileOffsetStore(tmp_path / "o.json")
    seen = []
    with Consumer(server(broker), "g", store) as c:
        c.subscribe("it")
        for m in c:  # one poll returns all 10; the loop takes 4
            seen.append(m.value)
            if len(seen) == 4:
                break
    assert seen == [b"v0", b"v1", b"v2", b"v3"]
    entry = FileOffsetStore(tmp_path / "o.json").load("g", "it", "0-0")
    assert entry is not None and entry.offset == 4 * 22
    with Consumer(server(broker), "g", FileOffsetStore(tmp_path / "o.json")) as c:
        c.subscribe("it")
        it = iter(c)
        assert next(it).value == b"v4"  # nothing lost, nothing twice
        c.commit()  # mid-batch: exactly what was handed out
        assert FileOffsetStore(tmp_path / "o.json").load("g", "it", "0-0").offset == 5 * 22  # type: ignore[union-attr]
        assert [next(it).value for _ in range(5)] == [b"v5", b"v6", b"v7", b"v8", b"v9"]
    assert FileOffsetStore(tmp_path / "o.json").load("g", "it", "0-0").offset == 10 * 22  # type: ignore[union-attr]


def test_a_poll_after_a_partial_iteration_gets_the_rest(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    store = FileOffsetStore(tmp_path / "o.json")
    with Consumer(server(broker), "p", store) as c:
        c.subscribe("it")
        for m in c:
            if m.value == b"v2":
                break
        rest = [m.value for m in c.poll(10.0)]
        assert rest == [b"v3", b"v4", b"v5", b"v6", b"v7", b"v8", b"v9"]

    async def go() -> list[bytes]:
        async with AsyncConsumer(server(broker), "ap", FileOffsetStore(tmp_path / "a.json")) as ac:
            ac.subscribe("it")
            async for m in ac:
                if m.value == b"v7":
                    break
            return [m.value for m in await ac.poll(10.0)]

    assert asyncio.run(asyncio.wait_for(go(), 60)) == [b"v8", b"v9"]


def test_iteration_stops_when_another_thread_closes_the_consumer(broker: BrokerProcess) -> None:
    got: list[Message] = []
    with Consumer(server(broker), None) as c:  # ungrouped: starts at the end, waits
        c.subscribe("it")
        t = threading.Thread(target=lambda: got.extend(c), daemon=True)
        t.start()
        wait_for(lambda: c._engine.opened, 30, "the iteration to start polling")
        c.close()
        t.join(30)
        assert not t.is_alive() and got == []


def test_a_seek_is_committed_by_close(broker: BrokerProcess, tmp_path: Path) -> None:
    tp = TopicPartition("it", 0, 0)
    with Consumer(server(broker), "s", FileOffsetStore(tmp_path / "o.json")) as c:
        c.subscribe("it")
        c.assignment()
        c.seek(tp, 3 * 22)
    entry = FileOffsetStore(tmp_path / "o.json").load("s", "it", "0-0")
    assert entry is not None and entry.offset == 3 * 22


def test_async_for_message_in_consumer(broker: BrokerProcess, tmp_path: Path) -> None:
    produce(broker, "ait", 0, [b"a0", b"a1", b"a2"])

    async def go() -> list[bytes]:
        out = []
        async with AsyncConsumer(server(broker), "ag", FileOffsetStore(tmp_path / "o.json")) as c:
            c.subscribe("ait")
            async for m in c:
                out.append(m.value)
                if len(out) == 2:
                    break
        async with AsyncConsumer(server(broker), "ag", FileOffsetStore(tmp_path / "o.json")) as c:
            c.subscribe("ait")
            out.append((await c.__aiter__().__anext__()).value)
            closer = asyncio.get_running_loop().call_later(
                0.2, lambda: asyncio.ensure_future(c.close())
            )
            async for m in c:  # nothing more: ends when closed
                out.append(m.value)
            closer.cancel()
        return out

    assert asyncio.run(asyncio.wait_for(go(), 60)) == [b"a0", b"a1", b"a2"]


def test_keys_travel_with_their_messages(broker: BrokerProcess) -> None:
    with Producer(server(broker)) as p:
        r1 = p.send("keys", b"one", key="user-42")
        r2 = p.send("keys", b"two", key=b"user 42", attribute="x;y")
        r3 = p.send("keys", b"three")
        bulk = p.send_many("keys", [b"b1", b"b2"], key="k")
        assert bulk.wait(30) and r1.success and r2.success and r3.success
        with pytest.raises(SerializationError, match="may not start with 'pymetaq-key:'"):
            p.send("keys", b"forged", attribute="pymetaq-key:x")
    with Producer(server(broker), compression="lz4") as p:
        assert p.send_many("keys", [b"z1", b"z2"], key="lz").wait(30)
    with Producer(server(broker), key_in_attribute=False) as p:
        r4 = p.send("keys", b"four", key="user-42", attribute="raw")
    stored = {m.value: m for part in range(3) for m in fetch_all(broker.address, "keys", part)}
    assert (stored[b"one"].key, stored[b"one"].attribute) == (b"user-42", None)
    assert (stored[b"two"].key, stored[b"two"].attribute) == (b"user 42", "x;y")
    assert (stored[b"three"].key, stored[b"three"].attribute) == (None, None)
    assert [stored[v].key for v in (b"b1", b"b2", b"z1", b"z2")] == [b"k", b"k", b"lz", b"lz"]
    assert (stored[b"four"].key, stored[b"four"].attribute) == (None, "raw")
    assert r4.partition == r1.partition  # the key still chooses the partition
    now = time.time() * 1000
    assert all(abs(m.timestamp - now) < 120_000 for m in stored.values())


def test_serializers_and_the_error_without_one(broker: BrokerProcess) -> None:
    with Producer(server(broker)) as p:
        for value, kind in (("text", "str"), ({"a": 1}, "dict")):
            with pytest.raises(SerializationError) as e:
                p.send("ser", value)
            assert str(e.value).startswith(
                f"value must be bytes, not {kind}: encode it, or give the producer a "
                "value_serializer"
            )
    with Consumer(server(broker), None, value_deserializer=json.loads) as c:
        c.subscribe("ser")
        c.assignment()
        with Producer(
            server(broker), value_serializer=lambda v: json.dumps(v).encode(),
            key_serializer=lambda k: str(k).encode(),
        ) as p:  # fmt: skip
            assert p.send_and_wait("ser", {"n": 1}, key=7).success
            assert p.send_many("ser", [{"n": 2}, {"n": 3}]).wait(30)
        got: list[tuple[Any, Any]] = []
        for m in c:
            got.append((m.key, m.value))
            if len(got) == 3:
                break
    assert got == [(b"7", {"n": 1}), (None, {"n": 2}), (None, {"n": 3})]


def test_a_deserializer_failure_names_the_message_and_consumes_nothing(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    produce(broker, "ser", 0, [b"not json"])
    store = FileOffsetStore(tmp_path / "o.json")
    with Consumer(server(broker), "d", store, value_deserializer=json.loads) as c:
        c.subscribe("ser")
        tp = TopicPartition("ser", 0, 0)
        with pytest.raises(
            SerializationError, match="value_deserializer failed on the message at ser/0-0"
        ) as e:
            for _ in range(20):  # the bad message is the last one: a poll meets it
                c.poll(5.0)
        assert "consumer.seek(tp, " in str(e.value)
        assert c.position(tp) == 0  # the poll that failed consumed nothing
    assert FileOffsetStore(tmp_path / "o.json").load("d", "ser", "0-0") is None


def test_send_raises_when_asked(broker: BrokerProcess) -> None:
    with Producer(server(broker)) as p:
        r = p.send("closed", b"x")
        assert not r.success and isinstance(r.error, PartitionClosed)
        with pytest.raises(PartitionClosed):
            p.send("closed", b"x", raise_on_error=True)
        with pytest.raises(MetaClientError):
            p.send_and_wait("closed", b"x")

    async def go() -> None:
        async with AsyncProducer(server(broker)) as ap:
            assert not (await ap.send("closed", b"x")).success
            with pytest.raises(PartitionClosed):
                await ap.send_and_wait("closed", b"x")
            assert (await ap.send_and_wait("ser", b"1")).success

    asyncio.run(go())
