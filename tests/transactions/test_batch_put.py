"""pymetaq's transactional ``bput`` (8 tokens): several messages of a transaction in one request.

On the wire: the exact reply, ids, order, invisibility until commit, every error a
transactional ``put`` has plus the batch's own (bad records: nothing held), and a prepared
branch made of batches surviving a broker SIGKILL.  Through the client: a burst of sends
becomes few requests, with every message's id and order kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client import Producer
from pymetaq.client.transaction import XA_OK, Xid
from pymetaq.client.transport.records import build_records
from pymetaq.storage.checksum import checksum
from tests._broker import BrokerProcess
from tests.transactions._helpers import Tap
from tests.transactions._txwire import Wire, log_when, ok, read_log, result, tx_line

pytestmark = pytest.mark.integration

TOPICS = {
    "tb": {"numPartitions": 2},
    "tb-rb": {},
    "tb-crash": {},
    "tb-client": {},
    "tb-rr": {"numPartitions": 2},
}
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("txbput")
    with BrokerProcess.start(tmp, topics=TOPICS, system={"idleTimeoutMs": 0}) as b:
        yield b


def tx_bput(topic: str, partition: int, body: bytes, count: int, key: str, opaque: int) -> bytes:
    line = f"bput {topic} {partition} {len(body)} {count} {checksum(body)} {key} {opaque}\r\n"
    return line.encode() + body


def local() -> tuple[str, str]:
    session = f"127.0.0.1-1700000000001-{next(_ids)}"
    return f"TX:{session}:1", session


def test_a_batch_joins_the_transaction_with_consecutive_ids(broker: BrokerProcess) -> None:
    key, sid = local()
    values = [b"b-%d" % i for i in range(5)]
    with Wire(broker.address) as w:
        ok(w, tx_line(key, sid, "BEGIN", 1), 1)
        r = w.call(tx_bput("tb", 1, build_records(values[:3]), 3, key, 2))
        first, part, offset, count = r.body.split(b" ")
        assert (r.code, r.opaque, part, offset, count) == (200, 2, b"1", b"-1", b"3"), r
        r2 = w.call(tx_bput("tb", 1, build_records(values[3:]), 2, key, 3))
        assert r2.code == 200 and r2.body.endswith(b" 1 -1 2"), r2
        assert read_log(broker.address, "tb", 1) == []  # invisible until commit
        w.exact(tx_line(key, sid, "COMMIT_ONE_PHASE", 4), result(200, b"", 4))
    stored = log_when(broker.address, "tb", 1, 5)
    ids = [int(first) + i for i in range(3)] + [int(r2.body.split(b" ")[0]) + i for i in range(2)]
    assert [(rec.msg_id, rec.data) for rec in stored] == list(zip(ids, values))
    assert ids == sorted(ids) and len(set(ids)) == 5


def test_batch_errors_hold_nothing(broker: BrokerProcess) -> None:
    key, sid = local()
    body = build_records([b"x", b"y"])
    with Wire(broker.address) as w:
        w.exact(
            tx_bput("tb-rb", 0, body, 2, key, 1),
            result(500, f"Local transaction '{key}' has not been started.".encode(), 1),
        )
        ok(w, tx_line(key, sid, "BEGIN", 2), 2)
        w.exact(
            tx_bput("tb-rb", -1, body, 2, key, 3),
            result(500, b"Invalid partition for transaction command:-1", 3),
        )
        r = w.call(tx_bput("nosuch", 0, body, 2, key, 4))
        assert (r.code, r.body) == (500, b"The topic `nosuch` is not in topics list of the broker")
        corrupt = bytearray(body)
        corrupt[-1] ^= 0xFF  # the second record's data no longer matches its CRC
        r = w.call(tx_bput("tb-rb", 0, bytes(corrupt), 2, key, 5))
        assert r.code == 400 and r.body.startswith(b"invalid records: "), r
        bad_sum = b"bput tb-rb 0 %d 2 12345 %s 6\r\n" % (len(body), key.encode()) + body
        w.exact(bad_sum, result(500, b"Checksum failed: batch body checksum mismatch", 6))
        r = w.call(tx_bput("tb-rb", 0, build_records([b"kept"]), 1, key, 7))
        assert r.code == 200, r
        stats = w.call(b"stats transactions 8\r\n").body.decode()
        assert f"{key} state IN_USE xa false messages 1 " in stats, stats
        w.exact(tx_line(key, sid, "COMMIT_ONE_PHASE", 9), result(200, b"", 9))
    assert [rec.data for rec in log_when(broker.address, "tb-rb", 0, 1)] == [b"kept"]


def test_a_prepared_branch_of_batches_survives_a_broker_sigkill(tmp_path: Path) -> None:
    xid_key = "XID:1:0b07:01:crash"
    sid = "127.0.0.1-1700000000002-1"
    batches = [[b"c-%d-%d" % (n, i) for i in range(n + 1)] for n in range(4)]  # 1..4 records
    with BrokerProcess.start(tmp_path, topics=TOPICS) as b:
        with Wire(b.address) as w:
            ok(w, tx_line(xid_key, sid, "BEGIN", 30, "crash", 1), 1)
            for n, values in enumerate(batches):
                r = w.call(
                    tx_bput("tb-crash", 0, build_records(values), len(values), xid_key, 10 + n)
                )
                assert r.code == 200, r
            w.send(tx_line(xid_key, sid, "END", "crash", 2))  # END is never answered
            w.exact(tx_line(xid_key, sid, "PREPARE", "crash", 3), result(200, b"0", 3))
        b.kill()
        b.restart()
        with Wire(b.address) as w:
            recovered = w.call(tx_line("null", sid, "RECOVER", "crash", 4))
            assert recovered.body == xid_key.encode(), recovered
            w.exact(tx_line(xid_key, sid, "COMMIT_TWO_PHASE", "crash", 5), result(200, b"", 5))
        sent = [v for values in batches for v in values]
        assert [rec.data for rec in log_when(b.address, "tb-crash", 0, len(sent))] == sent


def test_the_client_sends_a_burst_in_few_batches_keeping_ids_and_order(
    broker: BrokerProcess,
) -> None:
    n = 3000
    with Tap(broker.address) as tap, Producer(tap.url) as p:
        p.partitions("tb-client")
        xa = p.xa_resource("client")
        xid = Xid(format_id=1, gtrid=b"burst", bqual=b"")
        xa.start(xid)
        handles = [p.send_async("tb-client", b"m-%d" % i) for i in range(n)]
        xa.end(xid)
        assert xa.prepare(xid) == XA_OK
        xa.commit(xid, one_phase=False)
        results = [h.result(10) for h in handles]
        bputs = tap.lines(r"^bput tb-client ")
    assert all(r.success and r.offset == -1 for r in results)
    assert 1 <= len(bputs) < n // 10, len(bputs)  # a burst shares requests
    stored = log_when(broker.address, "tb-client", 0, n)
    assert [(rec.msg_id, rec.data) for rec in stored] == [
        (r.msg_id, b"m-%d" % i) for i, r in enumerate(results)
    ]


def test_a_burst_round_robin_over_two_partitions_keeps_each_partitions_order(
    broker: BrokerProcess,
) -> None:
    n = 2000
    with Tap(broker.address) as tap, Producer(tap.url) as p:
        p.partitions("tb-rr")
        with p.transaction():
            handles = [p.send_async("tb-rr", b"r-%d" % i) for i in range(n)]
        results = [h.result(10) for h in handles]
        bputs = tap.lines(r"^bput tb-rr ")
    assert all(r.success for r in results)
    assert {r.partition for r in results} == {0, 1}  # the round robin alternates
    assert 2 <= len(bputs) < n // 10, len(bputs)  # batched per partition all the same
    for part in (0, 1):
        mine = [(r.msg_id, b"r-%d" % i) for i, r in enumerate(results) if r.partition == part]
        stored = log_when(broker.address, "tb-rr", part, len(mine))
        assert [(rec.msg_id, rec.data) for rec in stored] == mine
