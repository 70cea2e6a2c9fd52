"""The producer's XA resource against real brokers: MetaQ's ``TransactionContext`` semantics,
its exact requests (as ``test_java_exchange.py`` replays them), recovery across brokers,
heuristic outcomes, and the asyncio face."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client import AsyncProducer, Producer
from pymetaq.client.transaction import (
    TMFAIL,
    TMRESUME,
    TMSUCCESS,
    TMSUSPEND,
    XA_OK,
    XA_RDONLY,
    XAError,
    Xid,
)
from pymetaq.client.transaction.errors import (
    XA_HEURCOM,
    XA_RBROLLBACK,
    XAER_DUPID,
    XAER_INVAL,
    XAER_NOTA,
    XAER_PROTO,
    XAER_RMFAIL,
)
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import encode_record
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.transactions._helpers import Tap, open_transactions, values
from tests.transactions._txwire import Wire

pytestmark = pytest.mark.integration

TOPICS = {"pay": {"numPartitions": 2}}
Q = "billing-1"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess.start(tmp_path_factory.mktemp("cxa"), topics=TOPICS) as b:
        yield b


def url(b: BrokerProcess) -> str:
    return f"meta://{b.host}:{b.port}"


def raises(code: int) -> Any:
    """``pytest.raises`` for an XAError with ``code``."""
    return pytest.raises(XAError, match=rf"\({code}\)")


def test_two_phase_commit_sends_the_java_clients_requests(broker: BrokerProcess) -> None:
    with Tap(broker.address) as tap, Producer(tap.url) as p:
        p.partitions("pay")
        xa = p.xa_resource()
        assert xa.unique_qualifier == f"XAMessageProducer-{socket.gethostname()}"
        q = xa.unique_qualifier
        xa.set_transaction_timeout(30)
        xid = Xid(1, b"\x0a\x0b\x0c", b"\x01")
        key = f"XID:1:0a0b0c:01:{q}"
        xa.start(xid)
        a = p.send("pay", b"xa-1", partition=0)
        b = p.send("pay", b"xa-2", partition=0)
        xa.end(xid, TMSUCCESS)
        assert xa.prepare(xid) == XA_OK
        assert open_transactions(broker.address)[key] == "PREPARED"
        assert xa.recover() == [xid]
        before = len(values(broker.address, "pay", 2))
        xa.commit(xid, one_phase=False)
        wait_for(lambda: len(values(broker.address, "pay", 2)) == before + 2, what="commit")
        assert a.offset == b.offset == -1 and xa.recover() == []
        sid = p._engine.transactions().ids.session_id
        lines = [x.rsplit(" ", 1)[0] for x in tap.lines(r"^(transaction|bput) ")]
        one = [encode_record(b"xa-1", 0), encode_record(b"xa-2", 0)]  # one bput per sync send
        assert lines == [
            f"transaction {key} {sid} BEGIN 30 {q}",
            *(f"bput pay 0 {len(r)} 1 {checksum(r)} {key}" for r in one),
            f"transaction {key} {sid} END {q}",
            f"transaction {key} {sid} PREPARE {q}",
            f"transaction null {sid} RECOVER {q}",
            f"transaction {key} {sid} COMMIT_TWO_PHASE {q}",
            f"transaction null {sid} RECOVER {q}",
        ]


def test_read_only_one_phase_rollback(broker: BrokerProcess) -> None:
    with Producer(url(broker)) as p:
        p.partitions("pay")
        xa = p.xa_resource(Q)
        empty, one, rb = Xid(7, b"empty", b""), Xid(7, b"one", b""), Xid(7, b"rb", b"")
        xa.start(empty)
        xa.end(empty)
        assert xa.prepare(empty) == XA_RDONLY  # no message: finished by PREPARE
        with raises(XAER_NOTA):
            xa.commit(empty)
        xa.start(one)
        p.send("pay", b"one-phase")
        xa.end(one)
        xa.commit(one, one_phase=True)
        xa.start(rb)
        p.send("pay", b"rolled-back")
        xa.end(rb)
        assert xa.prepare(rb) == XA_OK
        xa.rollback(rb)
        assert open_transactions(broker.address) == {}
    wait_for(lambda: b"one-phase" in values(broker.address, "pay", 2), what="one-phase commit")
    assert b"rolled-back" not in values(broker.address, "pay", 2)


def test_metaqs_checks_and_the_brokers_codes(broker: BrokerProcess) -> None:
    with Producer(url(broker)) as p:
        p.partitions("pay")
        xa = p.xa_resource(Q)
        x1, x2 = Xid(1, b"c1", b""), Xid(1, b"c2", b"")
        with raises(XAER_NOTA) as info:
            xa.prepare(x1)
        assert info.value.message == f"XA transaction 'XID:1:6331::{Q}' has not been started."
        with raises(XAER_PROTO):
            xa.commit(None)  # type: ignore[arg-type]
        with raises(XAER_PROTO):
            xa.end(x1, TMSUSPEND)  # not associated
        with raises(XAER_INVAL):
            xa.end(x1, 0)
        with raises(XAER_INVAL):
            xa.set_transaction_timeout(-1)
        xa.start(x1)
        with raises(XAER_DUPID):
            xa.start(x2)
        with raises(XAER_PROTO):
            xa.prepare(x1)  # end() first
        with raises(XAER_PROTO):
            xa.commit(x1)
        xa.end(x1)
        with raises(XAER_PROTO) as info:
            xa.commit(x1, one_phase=False)  # never prepared: the broker says so
        assert "not been prepared" in info.value.message
        xa.rollback(x1)
        with p.transaction(), raises(XAER_PROTO):
            xa.start(x2)  # a local transaction is in progress


def test_suspend_and_resume(broker: BrokerProcess) -> None:
    with Producer(url(broker)) as p:
        p.partitions("pay")
        xa = p.xa_resource(Q)
        xid = Xid(3, b"sus", b"p")
        xa.start(xid)
        p.send("pay", b"s-1")
        xa.end(xid, TMSUSPEND)
        plain = p.send("pay", b"between")  # not in the branch
        assert plain.offset >= 0
        xa.start(xid, TMRESUME)
        p.send("pay", b"s-2")
        xa.end(xid, TMSUCCESS)
        assert xa.prepare(xid) == XA_OK
        xa.commit(xid)
    wait_for(lambda: {b"s-1", b"s-2"} <= set(values(broker.address, "pay", 2)), what="commit")


def test_recover_asks_every_broker_for_its_qualifier(tmp_path: Path) -> None:
    topics = {"pay": {}, "only1": {}}
    with (
        BrokerProcess.start(tmp_path, name="b0", topics=TOPICS) as b0,
        BrokerProcess.start(tmp_path, name="b1", system={"brokerId": 1}, topics=topics) as b1,
        Producer(f"{url(b0)},{url(b1)}") as p,
    ):
        p.partitions("pay")
        p.partitions("only1")
        on = {0: p.xa_resource(Q, topics=["pay"]), 1: p.xa_resource(Q, topics=["only1"])}
        while on[0].broker_id != 0:  # MetaQ picks at random among the candidates
            on[0] = p.xa_resource(Q, topics=["pay"])
        assert on[1].broker_id == 1
        other = p.xa_resource("someone-else", topics=["only1"])
        xids = {b: Xid(9, b"g%d" % b, b"") for b in (0, 1)}
        for b, xa in [(0, on[0]), (1, on[1])]:
            xa.start(xids[b])
            p.send("pay", b"on-%d" % b)
            xa.end(xids[b])
            assert xa.prepare(xids[b]) == XA_OK
        foreign = Xid(9, b"foreign", b"")
        other.start(foreign)
        p.send("only1", b"foreign")
        other.end(foreign)
        other.prepare(foreign)
        fresh = p.xa_resource(Q, topics=["pay"])  # a coordinator after its restart
        assert sorted(fresh.recover(), key=lambda x: x.gtrid) == [xids[0], xids[1]]
        for x in (xids[0], xids[1]):
            fresh.commit(x)  # each goes to the broker that listed it
        assert other.recover() == [foreign]
        other.rollback(foreign)
        wait_for(lambda: values(b1.address, "pay", 1) == [b"on-1"], what="broker 1's commit")
        wait_for(lambda: values(b0.address, "pay", 2) == [b"on-0"], what="broker 0's commit")
        b1.kill()
        lonely = p.xa_resource(Q, topics=["pay"])
        assert lonely.recover() == []
        assert list(lonely.last_recover_failures) == [1]


def test_heuristic_commit_is_reported_then_forgotten(broker: BrokerProcess) -> None:
    with Producer(url(broker)) as p:
        p.partitions("pay")
        xa = p.xa_resource(Q)
        xid = Xid(5, b"heur", b"")
        xa.start(xid)
        p.send("pay", b"decided by an operator")
        xa.end(xid)
        xa.prepare(xid)
        key = xid.key(Q)
        with Wire(broker.address) as w:
            assert w.call(f"txadmin commit {key} 1\r\n".encode()).code == 200
        assert xa.recover() == [xid]  # listed until forgotten
        with raises(XA_HEURCOM):
            xa.commit(xid)
        xa.forget(xid)
        assert xa.recover() == []


def test_a_message_not_taken_makes_end_fail(tmp_path: Path) -> None:
    system = {"maxTxHeldBytes": 1024}
    with BrokerProcess.start(tmp_path, topics=TOPICS, system=system) as b, Producer(url(b)) as p:
        p.partitions("pay")
        xa = p.xa_resource(Q)
        xid = Xid(1, b"big", b"")
        xa.start(xid)
        p.send_async("pay", b"fits")
        p.send_async("pay", b"x" * 2000)
        with raises(XA_RBROLLBACK):
            xa.end(xid)
        xa.rollback(xid)
        xid2 = Xid(1, b"fail", b"")
        xa.start(xid2)
        p.send_async("pay", b"y" * 2000)
        xa.end(xid2, TMFAIL)  # the caller is rolling back anyway: no error
        xa.rollback(xid2)
        assert open_transactions(b.address) == {}


def test_an_unreachable_broker_is_rmfail(tmp_path: Path) -> None:
    b = BrokerProcess.start(tmp_path, topics=TOPICS)
    with b, Producer(url(b)) as p:
        p.partitions("pay")
        xa = p.xa_resource(Q)
        b.kill()
        with raises(XAER_RMFAIL) as info:
            xa.start(Xid(1, b"down", b""))
        assert info.value.retriable


def test_asyncio_face(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with AsyncProducer(url(broker)) as p:
            await p.publish("pay")
            xa = p.xa_resource(Q)
            xid = Xid(2, b"async", b"")
            await xa.start(xid)
            await asyncio.gather(*(p.send("pay", b"as-%d" % i) for i in range(3)))
            await xa.end(xid)
            assert await xa.prepare(xid) == XA_OK
            assert await xa.recover() == [xid]
            await xa.commit(xid)
            assert await xa.recover() == []

    asyncio.run(main())
    wait_for(lambda: {b"as-0", b"as-1", b"as-2"} <= set(values(broker.address, "pay", 2)))
