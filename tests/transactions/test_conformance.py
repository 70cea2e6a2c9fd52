"""Every ``transaction`` command and reply, transactional puts and the admin extension, over raw
sockets against one real broker process, with exact reply bytes.

Each test uses its own keys (and its own topic where log contents matter).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from pymetaq.client.protocol import ResultReply
from pymetaq.server.stats import VERSION
from pymetaq.storage.checksum import checksum
from tests._broker import BrokerProcess
from tests.transactions._txwire import (
    Wire,
    log_when,
    ok,
    put_ok,
    read_log,
    result,
    tx_line,
    tx_put,
    wait_for,
)

pytestmark = pytest.mark.integration

TOPICS: dict[str, dict[str, Any]] = {
    "tx": {"numPartitions": 2},
    "tx-order": {},
    "tx-xa": {},
    "tx-heur": {},
    "tx-rb": {},
    "tx-drop": {},
    "closed": {"acceptPublish": "false"},
}
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("txconf")
    with BrokerProcess.start(tmp, topics=TOPICS, system={"idleTimeoutMs": 0}) as b:
        yield b


@pytest.fixture
def w(broker: BrokerProcess) -> Iterator[Wire]:
    with Wire(broker.address) as wire:
        yield wire


def local() -> tuple[str, str]:
    session = f"127.0.0.1-1700000000000-{next(_ids)}"
    return f"TX:{session}:1", session


def xid(qualifier: str = "conf") -> str:
    n = next(_ids)
    return f"XID:1:{n:04x}:{n:02x}:{qualifier}"


def stats(w: Wire, item: str = "") -> dict[str, str]:
    r = w.call(b"stats %s 999\r\n" % item.encode())
    lines = r.body.decode().split("\r\n")[1:-2]
    return dict(line.split(" ", 1) for line in lines)


# -- local transactions ------------------------------------------------------------------------


def test_local_begin_put_commit_replies_exactly(broker: BrokerProcess, w: Wire) -> None:
    key, sid = local()
    w.exact(tx_line(key, sid, "BEGIN", 1), result(200, b"", 1))
    ids = [put_ok(w, "tx", p, b"m%d" % i, key, 10 + i) for i, p in enumerate([0, 1, 0])]
    assert len(set(ids)) == 3 and all(i > 0 for i in ids)
    w.exact(tx_line(key, sid, "COMMIT_ONE_PHASE", 2), result(200, b"", 2))
    wait_for(
        lambda: (
            len([r for p in (0, 1) for r in read_log(broker.address, "tx", p) if r.msg_id in ids])
            == 3
        )
    )
    p0 = [r for r in read_log(broker.address, "tx", 0) if r.msg_id in ids]
    p1 = [r for r in read_log(broker.address, "tx", 1) if r.msg_id in ids]
    assert [(r.msg_id, r.data) for r in p0] == [(ids[0], b"m0"), (ids[2], b"m2")]
    assert [(r.msg_id, r.data) for r in p1] == [(ids[1], b"m1")]


def test_messages_are_invisible_until_commit_and_gone_after_rollback(
    broker: BrokerProcess, w: Wire
) -> None:
    key, sid = local()
    ok(w, tx_line(key, sid, "BEGIN", 1), 1)
    put_ok(w, "tx-rb", 0, b"never", key, 2)
    assert read_log(broker.address, "tx-rb", 0) == []
    w.exact(tx_line(key, sid, "ROLLBACK", 3), result(200, b"", 3))
    assert read_log(broker.address, "tx-rb", 0) == []
    w.exact(
        tx_line(key, sid, "COMMIT_ONE_PHASE", 4),
        result(500, f"Local transaction '{key}' has not been started.".encode(), 4),
    )


def test_a_transaction_is_one_contiguous_range_among_plain_puts(
    broker: BrokerProcess, w: Wire
) -> None:
    key, sid = local()
    ok(w, tx_line(key, sid, "BEGIN", 1), 1)
    with Wire(broker.address) as plain:
        for i in range(6):
            put_ok(w, "tx-order", 0, b"tx%d" % i, key, 10 + i)
            r = plain.call(b"put tx-order 0 5 0 -1 %d\r\nplain" % (100 + i))
            assert r.code == 200, r
    ok(w, tx_line(key, sid, "COMMIT_ONE_PHASE", 2), 2)
    datas = [r.data for r in log_when(broker.address, "tx-order", 0, 12)]
    first = datas.index(b"tx0")
    assert datas[first : first + 6] == [b"tx%d" % i for i in range(6)]
    assert datas.count(b"tx0") == 1 and len(datas) == 12


def test_end_gets_no_reply(w: Wire) -> None:
    key, sid = local()
    ok(w, tx_line(key, sid, "BEGIN", 1), 1)
    w.send(tx_line(key, sid, "END", 2))
    w.exact(b"version 3\r\n", result(200, VERSION.encode(), 3))


def test_second_begin_joins_and_timeout_slot_is_read(w: Wire) -> None:
    key, sid = local()
    ok(w, tx_line(key, sid, "BEGIN", 30, 1), 1)  # 6 tokens, numeric slot: the timeout
    ok(w, tx_line(key, sid, "BEGIN", 2), 2)
    lines = [v for k, v in stats(w, "transactions").items() if k == key]
    assert lines and "timeout_s 30 " in lines[0]
    ok(w, tx_line(key, sid, "ROLLBACK", 3), 3)


def test_local_transaction_belongs_to_its_connection(broker: BrokerProcess, w: Wire) -> None:
    key, sid = local()
    ok(w, tx_line(key, sid, "BEGIN", 1), 1)
    with Wire(broker.address) as other:
        expected = result(500, f"Local transaction '{key}' has not been started.".encode(), 2)
        other.exact(tx_line(key, sid, "COMMIT_ONE_PHASE", 2), expected)
        r = other.call(tx_put("tx", 0, b"x", key, 3))
        assert r == ResultReply(500, f"Local transaction '{key}' has not been started.".encode(), 3)
    ok(w, tx_line(key, sid, "ROLLBACK", 4), 4)


def test_disconnect_rolls_back_a_local_transaction(broker: BrokerProcess) -> None:
    key, sid = local()
    with Wire(broker.address) as w:
        ok(w, tx_line(key, sid, "BEGIN", 1), 1)
        put_ok(w, "tx-drop", 0, b"dropped", key, 2)
    with Wire(broker.address) as w2:
        wait_for(lambda: key not in stats(w2, "transactions"), what="disconnect rollback")
    assert read_log(broker.address, "tx-drop", 0) == []


def test_prepare_of_a_local_transaction_is_xaer_rmerr(w: Wire) -> None:
    key, sid = local()
    ok(w, tx_line(key, sid, "BEGIN", 1), 1)
    body = b"XAException:code=-3,msg=Prepare not implemented on Local Transactions."
    w.exact(tx_line(key, sid, "PREPARE", 2), result(500, body, 2))
    ok(w, tx_line(key, sid, "ROLLBACK", 3), 3)


# -- puts inside transactions ------------------------------------------------------------------


def test_put_errors_inside_a_transaction(w: Wire) -> None:
    key, sid = local()
    w.exact(
        tx_put("tx", 0, b"x", key, 1),
        result(500, f"Local transaction '{key}' has not been started.".encode(), 1),
    )
    ok(w, tx_line(key, sid, "BEGIN", 2), 2)
    w.exact(
        tx_put("tx", -1, b"x", key, 3),
        result(500, b"Invalid partition for transaction command:-1", 3),
    )
    bad = b"put tx 0 1 0 12345 %s 4\r\nx" % key.encode()
    expected = b"Checksum failed: expected 12345, computed %d" % checksum(b"x")
    w.exact(bad, result(500, expected, 4))
    r = w.call(tx_put("nosuch", 0, b"x", key, 5))
    assert (r.code, r.body) == (500, b"The topic `nosuch` is not in topics list of the broker")
    r = w.call(tx_put("closed", 0, b"x", key, 6))
    assert (r.code, r.body) == (403, b"The topic `closed` in broker does not accept publish")
    r = w.call(tx_put("tx", 7, b"x", key, 7))
    assert r.code == 500 and r.body.startswith(b"Wrong partition 7"), r
    ok(w, tx_line(key, sid, "ROLLBACK", 8), 8)


def test_null_key_put_is_a_plain_put(broker: BrokerProcess, w: Wire) -> None:
    r = w.call(b"put tx 1 4 0 -1 null 1\r\nnull")
    assert r.code == 200 and not r.body.endswith(b" -1"), r


# -- XA ----------------------------------------------------------------------------------------


def test_xa_two_phase_round_trip(broker: BrokerProcess, w: Wire) -> None:
    x = xid("q-rt")
    ok(w, tx_line(x, "s", "BEGIN", 60, "q-rt", 1), 1)
    ids = [put_ok(w, "tx-xa", 0, b"xa%d" % i, x, 10 + i) for i in range(3)]
    w.send(tx_line(x, "s", "END", "q-rt", 2))
    w.exact(tx_line(x, "s", "PREPARE", "q-rt", 3), result(200, b"0", 3))
    w.exact(tx_line("null", "s", "RECOVER", "q-rt", 4), result(200, x.encode(), 4))
    assert read_log(broker.address, "tx-xa", 0) == []
    with Wire(broker.address) as coordinator:  # any connection may finish an XA branch
        coordinator.exact(tx_line(x, "s2", "COMMIT_TWO_PHASE", "q-rt", 5), result(200, b"", 5))
    assert [r.msg_id for r in log_when(broker.address, "tx-xa", 0, 3)] == ids
    body = f"XAException:code=-4,msg=XA transaction '{x}' has not been started.".encode()
    w.exact(tx_line(x, "s", "COMMIT_TWO_PHASE", "q-rt", 6), result(500, body, 6))


def test_prepare_without_work_is_rdonly_and_finishes(w: Wire) -> None:
    x = xid()
    ok(w, tx_line(x, "s", "BEGIN", "conf", 1), 1)  # 6 tokens, non-numeric slot: the qualifier
    w.exact(tx_line(x, "s", "PREPARE", "conf", 2), result(200, b"3", 2))
    body = f"XAException:code=-4,msg=XA transaction '{x}' has not been started.".encode()
    w.exact(tx_line(x, "s", "ROLLBACK", "conf", 3), result(500, body, 3))


def test_xa_state_machine_errors(w: Wire) -> None:
    x = xid()
    ok(w, tx_line(x, "s", "BEGIN", "conf", 1), 1)
    put_ok(w, "tx", 1, b"sm", x, 2)
    proto = b"XAException:code=-6,msg=Cannot do 2 phase commit if the transaction has not been prepared."
    w.exact(tx_line(x, "s", "COMMIT_TWO_PHASE", "conf", 3), result(500, proto, 3))
    ok(w, tx_line(x, "s", "PREPARE", "conf", 4), 4, b"0")
    again = b"XAException:code=-6,msg=Cannot call prepare now."
    w.exact(tx_line(x, "s", "PREPARE", "conf", 5), result(500, again, 5))
    r = w.call(tx_put("tx", 1, b"late", x, 6))
    assert r == ResultReply(
        500, f"Transaction '{x}' is PREPARED: no more messages can be added to it".encode(), 6
    )
    ok(w, tx_line(x, "s", "COMMIT_ONE_PHASE", "conf", 7), 7)  # one-phase of PREPARED: MetaQ allows


def test_xa_rollback_of_a_prepared_branch(broker: BrokerProcess, w: Wire) -> None:
    x = xid()
    ok(w, tx_line(x, "s", "BEGIN", "conf", 1), 1)
    put_ok(w, "tx-rb", 0, b"rb", x, 2)
    ok(w, tx_line(x, "s", "PREPARE", "conf", 3), 3, b"0")
    w.exact(tx_line(x, "s", "ROLLBACK", "conf", 4), result(200, b"", 4))
    assert b"rb" not in [r.data for r in read_log(broker.address, "tx-rb", 0)]


def test_recover_filters_by_qualifier_and_lists_lowercase_keys(w: Wire) -> None:
    a, b = xid("qa"), xid("qb")
    upper = "XID:1:ABCD:EF:qa"
    for n, key in enumerate([a, b, upper]):
        q = key.rsplit(":", 1)[1]
        ok(w, tx_line(key, "s", "BEGIN", q, 10 + n), 10 + n)
        put_ok(w, "tx", 0, b"r", key, 20 + n)
        ok(w, tx_line(key, "s", "PREPARE", q, 30 + n), 30 + n, b"0")
    w.exact(
        tx_line("null", "s", "RECOVER", "qa", 1),
        result(200, f"{a}\r\nXID:1:abcd:ef:qa".encode(), 1),
    )
    w.exact(tx_line("null", "s", "RECOVER", "qb", 2), result(200, b.encode(), 2))
    everything = w.call(tx_line("null", "s", "RECOVER", 3)).body.split(b"\r\n")  # 5 tokens
    assert {a.encode(), b.encode(), b"XID:1:abcd:ef:qa"} <= set(everything)
    for n, key in enumerate([a, b, "XID:1:abcd:ef:qa"]):
        ok(w, tx_line(key, "s", "ROLLBACK", 40 + n), 40 + n)
    w.exact(tx_line("null", "s", "RECOVER", "qa", 4), result(200, b"", 4))


def test_forget_and_begin_errors(w: Wire) -> None:
    key, sid = local()
    w.exact(
        tx_line(key, sid, "FORGET", 1),
        result(500, f"XAException:code=-4,msg={key} is not a valid xid".encode(), 1),
    )
    w.exact(tx_line(xid(), "s", "FORGET", "conf", 2), result(200, b"", 2))
    body = b"XAException:code=-5,msg=BEGIN needs a transaction key, not null"
    w.exact(tx_line("null", "s", "BEGIN", 3), result(500, body, 3))


def test_stats_count_transactions(w: Wire) -> None:
    before = stats(w)
    key, sid = local()
    x = xid()
    ok(w, tx_line(key, sid, "BEGIN", 1), 1)
    ok(w, tx_line(key, sid, "COMMIT_ONE_PHASE", 2), 2)
    ok(w, tx_line(x, "s", "BEGIN", "conf", 3), 3)
    ok(w, tx_line(x, "s", "ROLLBACK", "conf", 4), 4)
    after = stats(w)
    delta = {
        k: int(after[k]) - int(before[k])
        for k in ("tx_begin", "tx_xa_begin", "tx_commit", "tx_rollback")
    }
    assert delta == {"tx_begin": 2, "tx_xa_begin": 1, "tx_commit": 1, "tx_rollback": 1}


def test_stats_transactions_lists_open_ones(w: Wire) -> None:
    x = xid()
    ok(w, tx_line(x, "s", "BEGIN", 20, "conf", 1), 1)
    put_ok(w, "tx", 1, b"12345", x, 2)
    line = stats(w, "transactions")[x]
    assert line.startswith("state IN_USE xa true messages 1 bytes 25 age_ms ")
    assert line.endswith(" timeout_s 20 partitions tx-1")
    ok(w, tx_line(x, "s", "ROLLBACK", 3), 3)
    assert x not in stats(w, "transactions")


# -- heuristics (operator extension) -----------------------------------------------------------


def prepared(w: Wire, topic: str, payload: bytes) -> str:
    x = xid("heur")
    ok(w, tx_line(x, "s", "BEGIN", "heur", 1), 1)
    put_ok(w, topic, 0, payload, x, 2)
    ok(w, tx_line(x, "s", "PREPARE", "heur", 3), 3, b"0")
    return x


def test_heuristic_commit_then_coordinator_gets_heurcom_then_forget(
    broker: BrokerProcess, w: Wire
) -> None:
    x = prepared(w, "tx-heur", b"decided")
    w.exact(b"txadmin commit %s 10\r\n" % x.encode(), result(200, b"", 10))
    assert [r.data for r in log_when(broker.address, "tx-heur", 0, 1)] == [b"decided"]
    heurcom = (
        f"XAException:code=7,msg=XA transaction '{x}' has been heuristically committed.".encode()
    )
    w.exact(tx_line(x, "s", "COMMIT_TWO_PHASE", "heur", 11), result(500, heurcom, 11))
    w.exact(tx_line("null", "s", "RECOVER", "heur", 12), result(200, x.encode(), 12))
    dupid = f"XAException:code=-8,msg=XA transaction '{x}' has a heuristic outcome; FORGET it first"
    w.exact(tx_line(x, "s", "BEGIN", "heur", 13), result(500, dupid.encode(), 13))
    assert stats(w, "transactions")[x].startswith("state HEURISTIC_COMMIT xa true")
    w.exact(tx_line(x, "s", "FORGET", "heur", 14), result(200, b"", 14))
    w.exact(tx_line("null", "s", "RECOVER", "heur", 15), result(200, b"", 15))
    assert [r.data for r in read_log(broker.address, "tx-heur", 0)] == [b"decided"]


def test_heuristic_rollback_and_admin_errors(broker: BrokerProcess, w: Wire) -> None:
    x = prepared(w, "tx-rb", b"undecided")
    w.exact(b"txadmin rollback %s 20\r\n" % x.encode(), result(200, b"", 20))
    heurrb = (
        f"XAException:code=6,msg=XA transaction '{x}' has been heuristically rolled back.".encode()
    )
    w.exact(tx_line(x, "s", "ROLLBACK", "heur", 21), result(500, heurrb, 21))
    w.exact(b"txadmin forget %s 22\r\n" % x.encode(), result(200, b"", 22))
    assert b"undecided" not in [r.data for r in read_log(broker.address, "tx-rb", 0)]
    unknown = xid("heur")
    body = f"XAException:code=-4,msg=XA transaction '{unknown}' has not been started.".encode()
    w.exact(b"txadmin commit %s 23\r\n" % unknown.encode(), result(500, body, 23))
    ok(w, tx_line(unknown, "s", "BEGIN", "heur", 24), 24)
    body = (
        f"XAException:code=-6,msg=XA transaction '{unknown}' is START: only a PREPARED branch "
        "can be decided heuristically"
    ).encode()
    w.exact(b"txadmin rollback %s 25\r\n" % unknown.encode(), result(500, body, 25))
    key, _ = local()
    body = f"XAException:code=-4,msg={key} is not an XA transaction key".encode()
    w.exact(b"txadmin commit %s 26\r\n" % key.encode(), result(500, body, 26))
