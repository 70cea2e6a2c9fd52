"""Local transactions through the client (``with producer.transaction():``) against real
brokers: commit, rollback, exceptions, timeouts, the one-broker rule, context binding, the
asyncio face, and the exact requests (compared with MetaQ's Java client)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client import AsyncProducer, Producer
from pymetaq.client.transaction import (
    CrossBrokerTransaction,
    TransactionClosed,
    TransactionInProgress,
    TransactionRolledBack,
)
from pymetaq.client.transport.records import join_key
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import decode_data, encode_record
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.transactions._helpers import Tap, counters, open_transactions, stored, values

pytestmark = pytest.mark.integration

TOPICS = {"orders": {"numPartitions": 2}, "audit": {"numPartitions": 1}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    system = {"maxTxTimeoutInSeconds": 30}
    with BrokerProcess.start(tmp_path_factory.mktemp("ctx"), topics=TOPICS, system=system) as b:
        yield b


def url(b: BrokerProcess) -> str:
    return f"meta://{b.host}:{b.port}"


def committed(b: BrokerProcess, count: int, topic: str = "orders") -> list[bytes]:
    """The topic's values once it holds ``count`` (visible after the partition's fsync)."""
    box: list[list[bytes]] = []

    def enough() -> bool:
        box[:] = [values(b.address, topic, TOPICS[topic]["numPartitions"])]
        return len(box[0]) >= count

    wait_for(enough, what=f"{count} messages in {topic}")
    return box[0]


def test_commit_on_normal_exit(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics=TOPICS) as b, Producer(url(b)) as p:
        before = counters(b.address)
        with p.transaction(timeout_s=10) as tx:
            r1 = p.send("orders", b"o-1")
            h2 = p.send_async("orders", b"o-2", key="customer-7")
            bulk = p.send_many("orders", [b"o-3", b"o-4"], partition=1)
            assert values(b.address, "orders", 2) == []  # invisible until commit
            assert open_transactions(b.address) == {tx.key: "IN_USE"}
        assert tx.outcome == "committed" and tx.messages == 4 and tx.broker_id == 0
        results = [r1, h2.result(), *bulk.result()]
        assert all(r.success and r.offset == -1 and r.broker_id == 0 for r in results)
        committed(b, 4)
        records = {
            r.msg_id: (part, decode_data(r.data, r.flag))
            for part, r in stored(b.address, "orders", 2)
        }
        key = join_key(b"customer-7", None)  # the key travels in the attribute, as outside one
        sent = [(None, b"o-1"), (key, b"o-2"), (None, b"o-3"), (None, b"o-4")]
        assert {r.msg_id: (r.partition, v) for r, v in zip(results, sent)} == records
        after = counters(b.address)
        assert after["tx_begin"] - before["tx_begin"] == 1
        assert after["tx_commit"] - before["tx_commit"] == 1
        assert open_transactions(b.address) == {}


def test_exception_rolls_back_and_propagates(broker: BrokerProcess) -> None:
    with Producer(url(broker)) as p:
        with pytest.raises(KeyError), p.transaction() as tx:
            assert p.send("audit", b"never-1").success
            p.send_async("audit", b"never-2")
            raise KeyError("boom")
        assert tx.outcome == "rolled back"
        with p.transaction() as tx2:
            p.send("audit", b"x")
            tx2.rollback()  # early, explicit
        assert tx2.outcome == "rolled back"
        with p.transaction():
            p.send("audit", b"kept")
    assert committed(broker, 1, "audit") == [b"kept"]
    assert open_transactions(broker.address) == {}


def test_an_empty_transaction_sends_nothing(broker: BrokerProcess) -> None:
    with Tap(broker.address) as tap, Producer(tap.url) as p:
        with p.transaction() as tx:
            pass
        with pytest.raises(ValueError), p.transaction():
            raise ValueError
        assert tx.outcome == "committed" and tx.broker_id is None
        assert tap.lines() == []


def test_requests_are_the_java_clients(broker: BrokerProcess) -> None:
    """BEGIN lazily with the timeout and no qualifier, then COMMIT_ONE_PHASE (or ROLLBACK), as
    the Java client writes them (test_java_exchange.py's bytes), all on one connection; the
    messages go as pymetaq's transactional ``bput`` (8 tokens, the body's checksum)."""
    with Tap(broker.address) as tap, Producer(tap.url) as p:
        p.partitions("orders")
        with p.transaction(timeout_s=30) as tx:
            p.send("orders", b"hello", partition=0)
            p.send("orders", b"world", partition=0, attribute="tag")
        with pytest.raises(RuntimeError), p.transaction() as tx2:
            p.send("orders", b"gone", partition=1)
            raise RuntimeError
        sid = tx.key.split(":")[1]
        assert tx.key == f"TX:{sid}:1" and tx2.key == f"TX:{sid}:2"
        assert ":" not in sid and " " not in sid and len(sid.split("-")) == 3
        tagged = b"\x00\x00\x00\x03taghello"[:7] + b"world"
        lines = [
            " ".join(t for i, t in enumerate(x.split(" ")) if i != len(x.split(" ")) - 1)
            for x in tap.lines(r"^(transaction|bput) ")
        ]

        def bput(partition: int, data: bytes, flag: int, key: str) -> str:
            body = encode_record(data, flag)
            return f"bput orders {partition} {len(body)} 1 {checksum(body)} {key}"

        assert lines == [
            f"transaction {tx.key} {sid} BEGIN 30",
            bput(0, b"hello", 0, tx.key),
            bput(0, tagged, 1, tx.key),
            f"transaction {tx.key} {sid} COMMIT_ONE_PHASE",
            f"transaction {tx2.key} {sid} BEGIN",
            bput(1, b"gone", 0, tx2.key),
            f"transaction {tx2.key} {sid} ROLLBACK",
        ]
        # every transaction's requests went over one connection, not the send connection
        plain = [i for i, r in enumerate(tap.requests) if b"stats" in r]
        tx_conns = [i for i, r in enumerate(tap.requests) if b"transaction" in r]
        assert len(tx_conns) == 1 and tx_conns[0] not in plain


def test_the_broker_timeout_rolls_back(tmp_path: Path) -> None:
    system = {"maxTxTimeoutInSeconds": 1}
    with BrokerProcess.start(tmp_path, topics=TOPICS, system=system) as b, Producer(url(b)) as p:
        with pytest.raises(TransactionRolledBack, match="timed out after 1 s"), p.transaction():
            p.send("audit", b"too slow")
            wait_for(lambda: open_transactions(b.address) == {}, what="the broker's timeout")
        assert values(b.address, "audit", 1) == []


def test_a_failed_put_rolls_the_transaction_back(tmp_path: Path) -> None:
    system = {"maxTxHeldBytes": 1024}
    with BrokerProcess.start(tmp_path, topics=TOPICS, system=system) as b, Producer(url(b)) as p:
        tx = p.transaction()
        with pytest.raises(TransactionRolledBack, match="maxTxHeldBytes") as info, tx:
            assert p.send("audit", b"small").success
            failed = p.send("audit", b"x" * 2000)
            assert not failed.success and "maxTxHeldBytes" in str(failed.error)
        assert info.value.retriable
        assert values(b.address, "audit", 1) == []
        assert open_transactions(b.address) == {}


def test_binding_is_per_context(broker: BrokerProcess) -> None:
    """A transaction belongs to the thread that opened it; sends of other threads are plain,
    and each thread may run its own transaction at the same time."""
    before = len(values(broker.address, "audit", 1))
    with Producer(url(broker)) as p:
        results: dict[str, object] = {}
        inside = threading.Event()
        release = threading.Event()

        def other() -> None:
            inside.wait(10)
            results["plain"] = p.send("audit", b"plain")
            with p.transaction():
                results["other-tx"] = p.send("audit", b"other-tx")
            release.set()

        t = threading.Thread(target=other)
        t.start()
        with p.transaction() as tx:
            p.send("audit", b"mine")
            with pytest.raises(TransactionInProgress):
                p.transaction().__enter__()
            inside.set()
            assert release.wait(10)
            assert open_transactions(broker.address) == {tx.key: "IN_USE"}
        t.join(10)
        plain = results["plain"]
        assert getattr(plain, "offset", -1) >= 0  # stored at once, outside any transaction
        assert getattr(results["other-tx"], "offset", 0) == -1
    got = committed(broker, before + 3, "audit")
    assert got[before:] in ([b"plain", b"other-tx", b"mine"], [b"plain", b"mine", b"other-tx"])


def test_one_broker_per_transaction(tmp_path: Path) -> None:
    with (
        BrokerProcess.start(tmp_path, name="b0", topics=TOPICS) as b0,
        BrokerProcess.start(
            tmp_path,
            name="b1",
            system={"brokerId": 1},
            topics={"orders": {"numPartitions": 2}, "only1": {}},
        ) as b1,
        Producer(f"{url(b0)},{url(b1)}") as p,
    ):
        assert [tp.key for tp in p.partitions("orders")] == ["0-0", "0-1", "1-0", "1-1"]
        p.partitions("only1")
        for first in ("1-1", "0-0"):
            with p.transaction() as tx:
                p.send("orders", b"first", partition=first)
                for i in range(6):
                    r = p.send("orders", b"more-%d" % i, key=f"k{i}")
                    assert r.broker_id == tx.broker_id == int(first[0])
                with pytest.raises(CrossBrokerTransaction, match="one broker"):
                    p.send("orders", b"elsewhere", partition="0-1" if first == "1-1" else "1-0")
                if first == "0-0":
                    with pytest.raises(CrossBrokerTransaction, match="There is no partitions"):
                        p.send("only1", b"not on broker 0")
        wait_for(lambda: len(values(b0.address, "orders", 2)) == 7, what="broker 0's commit")
        wait_for(lambda: len(values(b1.address, "orders", 2)) == 7, what="broker 1's commit")


def test_after_the_block_the_transaction_is_closed(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with AsyncProducer(url(broker)) as p:
            await p.publish("audit")
            gate = asyncio.Event()

            async def late() -> None:
                await gate.wait()
                with pytest.raises(TransactionClosed):
                    await p.send("audit", b"too late")

            async with p.transaction():
                task = asyncio.get_running_loop().create_task(late())  # copies the binding
                await p.send("audit", b"in time")
            gate.set()
            await task

    asyncio.run(main())


def test_asyncio_face(broker: BrokerProcess) -> None:
    async def main() -> list[int]:
        async with AsyncProducer(url(broker)) as p:
            await p.publish("orders")
            async with p.transaction(timeout_s=20) as tx:
                first = await p.send("orders", b"a-0")
                rest = await asyncio.gather(*(p.send("orders", b"a-%d" % i) for i in range(1, 8)))
            assert tx.outcome == "committed" and tx.messages == 8
            with pytest.raises(LookupError):
                async with p.transaction():
                    await p.send("orders", b"a-never")
                    raise LookupError
            return [r.msg_id for r in (first, *rest)]

    ids = asyncio.run(main())
    wait_for(lambda: len(stored(broker.address, "orders", 2)) >= 8, what="the async commit")
    got = {r.msg_id: r.data for _, r in stored(broker.address, "orders", 2)}
    assert [got[i] for i in ids] == [b"a-%d" % i for i in range(8)]
    assert b"a-never" not in got.values()


def test_closing_the_producer_rolls_back(broker: BrokerProcess) -> None:
    p = Producer(url(broker))
    scope = p.transaction()
    scope.__enter__()
    p.send("audit", b"abandoned")
    assert len(open_transactions(broker.address)) == 1
    p.close()
    wait_for(lambda: open_transactions(broker.address) == {}, what="rollback on disconnect")
    assert b"abandoned" not in values(broker.address, "audit", 1)
