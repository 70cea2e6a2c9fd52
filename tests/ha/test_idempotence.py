"""Idempotent producers across replication and failover, with real broker processes.

A samsa master sends a pymetaq gregor slave each idempotent ``bput``'s batch as a ``bsync``
carrying the producer id and sequence; the slave records them in the partition's
``producers.idem`` before it confirms.  After the master is SIGKILLed and the slave promoted
(real ZooKeeper), a producer's retry of a batch the old master stored is answered with the
original reply - by hand on the wire, and for a real idempotent producer behind a seeded
fault proxy (dropped and delayed replies, cut connections) while the master is SIGKILLed - (``put_duplicate`` counted), a gap gets the same 409 the old master would have
sent, and the partition holds each record once.  An async slave that caught up - part of the
batches copied while they were sent, part after it started late - answers the same after a
manual switch (MetaQ's: the master stopped, the slave started as a master on its own data).
A replaced master that rejoins gets the producer state of the batches its successor
acknowledged alone, and answers their retries once promoted in turn.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from pymetaq.client.protocol import BatchPutCommand, ResultReply, encode
from pymetaq.storage.checksum import checksum
from pymetaq.storage.producers import FILE_NAME, ProducerEntry, decode_entries
from pymetaq.storage.record import encode_record
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import free_port
from tests.cluster.conftest import new_client
from tests.ha._helpers import (
    SYSTEM,
    TOPICS,
    offsets,
    records,
    start_gregor,
    start_master,
    start_samsa,
    start_slave,
    stats,
)
from tests.ha.test_failover import failover_line, start_pair
from tests.ha.test_rejoin import rejoined
from tests.idempotence._helpers import FaultProxy, Faults, NumberedSends, retrying_producer
from tests.server._helpers import Wire

pytestmark = [pytest.mark.integration]

PID = "00112233445566778899aabbccddeeff"


def ibput(partition: int, payloads: list[bytes], seq: int, opaque: int, pid: str = PID) -> bytes:
    """An idempotent ``bput`` of ``orders-<partition>`` (the 9-token form)."""
    body = b"".join(encode_record(p) for p in payloads)
    crc = checksum(body)
    return encode(BatchPutCommand("orders", partition, body, len(payloads), crc, opaque, pid, seq))


def ok(reply: object) -> bytes:
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    return reply.body


def send_batches(address: tuple[str, int], n: int, start: int = 0) -> list[bytes]:
    """Batches start..n-1 of PID (three records each) to partition 0: their replies."""
    with Wire(address) as w:
        return [
            ok(w.call(ibput(0, [b"b%d-%d" % (s, i) for i in range(3)], s, s)))
            for s in range(start, n)
        ]


def entries(data: Path) -> list[ProducerEntry]:
    got, _ = decode_entries((data / "orders-0" / FILE_NAME).read_bytes())
    return got


def counter(broker_stats: list[str], name: str) -> int:
    return next(int(ln.split()[1]) for ln in broker_stats if ln.startswith(name + " "))


def assert_answers_as_the_old_master(address: tuple[str, int], replies: list[bytes]) -> None:
    """Retries of the last batches get their original replies, a gap the 409, the next batch
    is stored once after them."""
    n = len(replies)
    with Wire(address) as w:
        for seq in (n - 1, n - 3):
            retry = ibput(0, [b"b%d-%d" % (seq, i) for i in range(3)], seq, 100 + seq)
            assert ok(w.call(retry)) == replies[seq], f"batch {seq} retried"
        gap = w.call(ibput(0, [b"gap"], n + 1, 200))
        assert gap == ResultReply(
            409, f"out of order sequence {n + 1} of producer {PID}: expected {n}".encode(), 200
        )
        nxt = ok(w.call(ibput(0, [b"next"], n, 201)))
        last = replies[-1].split()
        size = sum(20 + len(b"b%d-%d" % (n - 1, i)) for i in range(3))
        assert int(nxt.split()[2]) == int(last[2]) + size, (nxt, last)


def assert_each_once(broker_records: list[tuple[int, int, bytes]], n: int) -> None:
    payloads = [data for _, _, data in broker_records]
    want = [b"b%d-%d" % (s, i) for s in range(n) for i in range(3)] + [b"next"]
    assert payloads == want


def test_gregor_records_the_masters_producer_entries(tmp_path: Path) -> None:
    """Every idempotent batch reaches the slave's producers.idem before the put is acked,
    exactly as the master recorded it; a plain bput adds no entry."""
    port = free_port()
    with start_gregor(tmp_path, port) as slave, start_samsa(tmp_path, port) as master:
        wait_for(lambda: "form bsync" in stats(master, "replication")[0], 30, "bsync detected")
        replies = send_batches(master.address, 6)
        with Wire(master.address) as w:
            ok(w.call(b"bput orders 0 21 1 -1 1\r\n" + encode_record(b"p")))
        # acked => the slave's entries are written (they are synced before its reply)
        theirs, ours = entries(slave.data_path), entries(master.data_path)
        assert theirs == ours and [e.sequence for e in theirs] == list(range(6))
        for entry, reply in zip(theirs, replies, strict=True):
            assert reply == b"%d 0 %d %d" % (entry.first_id, entry.offset, entry.count)
        assert records(slave, 0) == records(master, 0)
        # what an async slave asks: the entries of the batches ending in a range
        with Wire(master.address) as w:
            end = ours[-1].offset + ours[-1].length
            got = ok(w.call(b"producers orders g 0 %d %d 1\r\n" % (ours[1].offset, end)))
            assert got == b"".join(e.encode() for e in ours[1:])
            missing = w.call(b"producers orders g 1 0 100 2\r\n")
            assert missing == ResultReply(
                404, b"The topic `orders` in partition `1` is not exists", 2
            )
            ok(w.call(b"bput orders 1 21 1 -1 3\r\n" + encode_record(b"q")))
            assert ok(w.call(b"producers orders g 1 0 100 4\r\n")) == b""
        assert not (master.data_path / "orders-1" / FILE_NAME).exists()


@pytest.mark.zk
def test_promoted_gregor_answers_a_retry_as_the_old_master(tmp_path: Path, zk_hosts: str) -> None:
    slave, master = start_pair(tmp_path, zk_hosts)
    with slave, master:
        replies = send_batches(master.address, 6)
        master.kill()  # the acks of the last batches may be lost: the producer retries
        wait_for(lambda: failover_line(slave).startswith("epoch 2 state master"), 60, "promoted")
        before = counter(stats(slave, ""), "put_duplicate")
        assert_answers_as_the_old_master(slave.address, replies)
        assert counter(stats(slave, ""), "put_duplicate") == before + 2
        assert_each_once(records(slave, 0), 6)
        slave.kill()  # and after a crash of the promoted slave, from its producers.idem
        slave.restart()
        with Wire(slave.address) as w:
            assert ok(w.call(ibput(0, [b"b5-0", b"b5-1", b"b5-2"], 5, 1))) == replies[5]


@pytest.mark.zk
def test_async_slave_switched_to_master_answers_a_retry_as_the_master(
    tmp_path: Path, zk_hosts: str
) -> None:
    n = 120
    with start_master(tmp_path, zk_hosts) as master:
        replies = send_batches(master.address, n // 2)  # before the slave exists
        with start_slave(tmp_path, zk_hosts) as slave:
            replies += send_batches(master.address, n, start=n // 2)
            key = ("orders", 0)
            wait_for(lambda: offsets(slave).get(key) == offsets(master)[key], 60, "caught up")
            assert entries(slave.data_path) == entries(master.data_path)
            master.kill()
            assert slave.terminate() == 0
    # the manual switch: the slave's data served by a broker started as a master
    system = {**SYSTEM, "dataPath": str(slave.data_path)}
    with BrokerProcess.start(tmp_path, name="switched", system=system, topics=TOPICS) as new:
        assert_answers_as_the_old_master(new.address, replies)
        assert counter(stats(new, ""), "put_duplicate") == 2
        assert_each_once(records(new, 0), n)


@pytest.mark.zk
@pytest.mark.crash
def test_idempotent_producer_through_faults_and_a_failover_stores_each_message_once(
    tmp_path: Path, zk_hosts: str
) -> None:
    """The proof of docs/replication.md: every message acknowledged, each once and in send
    order on the promoted slave, at the offset its acknowledgement named."""
    seed = int(os.environ.get("PYMETAQ_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    total, parts = 3000, 2
    slave, master = start_pair(tmp_path, zk_hosts)
    with slave, master:
        target = [master.address]
        proxy = FaultProxy(lambda: target[0], rng.randrange(1 << 30), Faults())
        try:
            with retrying_producer(proxy.url) as producer:
                sends = NumberedSends(producer, "orders", total, parts)
                sends.wait_done(total // 3)
                master.kill()  # replies in flight are lost: the producer retries
                wait_for(
                    lambda: failover_line(slave).startswith("epoch 2 state master"),
                    60,
                    "promoted",
                )
                target[0] = slave.address  # the proxy's next connections go there
                sends.join()
                assert producer.flush(180), "the producer did not finish"
        finally:
            proxy.close()
        print(f"proxy={dict(proxy.actions)}")
        results = [h.result(0) for h in sends.handles]
        assert all(r.success for r in results), [str(r.error) for r in results if not r.success][:3]
        for p in range(parts):
            log = records(slave, p)
            assert [data for _, _, data in log] == [b"m%06d" % i for i in range(p, total, parts)]
            at = {data: (offset, msg_id) for offset, msg_id, data in log}
            for i in range(p, total, parts):
                assert at[b"m%06d" % i] == (results[i].offset, results[i].msg_id), i


@pytest.mark.zk
def test_a_rejoined_replica_gets_the_producer_state_of_its_gap(
    tmp_path: Path, zk_hosts: str
) -> None:
    """Batches the promoted master acknowledged alone reach the rejoining old master with their
    producer ids (one ``bsync`` each): promoted in turn, it answers their retries as well."""
    new, old = start_pair(tmp_path, zk_hosts)  # the gregor slave will be the new master
    zk = new_client(zk_hosts)
    try:
        with new, old:
            replies = send_batches(old.address, 3)
            old.kill()
            wait_for(lambda: failover_line(new).startswith("epoch 2 state master"), 60, "promoted")
            replies += send_batches(new.address, 8, start=3)  # acknowledged alone: the gap
            old.restart()  # its -Fsamsa command line: it rejoins the new master
            wait_for(lambda: rejoined(old, new, zk), 120, "rejoined and in sync")
            assert entries(old.data_path) == entries(new.data_path)
            new.kill()
            wait_for(lambda: failover_line(old).startswith("epoch 3 state master"), 60, "again")
            assert_answers_as_the_old_master(old.address, replies)
            assert_each_once(records(old, 0), 8)
    finally:
        zk.stop()
        zk.close()
