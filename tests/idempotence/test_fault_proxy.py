"""The idempotent producer's proof: a seeded fault proxy between producer and broker drops
replies, delays them and cuts connections; the producer retries; in the middle the broker is
SIGKILLed and restarted.  At the end every acknowledged message is in the log exactly once, at
its acknowledged offset, and each partition holds the messages in send order.

The same run with ``idempotence=False`` is the control: the retries store duplicates, so the
proof can fail.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.record import Record, iter_records
from tests._broker import BrokerProcess
from tests.idempotence._helpers import FaultProxy, Faults, NumberedSends, retrying_producer
from tests.server._helpers import Wire

pytestmark = [pytest.mark.integration, pytest.mark.crash]

TOPIC = "exact"
PARTITIONS = 3


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    topics = {TOPIC: {"numPartitions": PARTITIONS}}
    with BrokerProcess.start(tmp_path, topics=topics, system={"idleTimeoutMs": 0}) as b:
        yield b


def read_log(broker: BrokerProcess, partition: int) -> list[Record]:
    out: list[Record] = []
    offset = 0
    with Wire(broker.address) as w:
        while True:
            reply = w.call(b"get %s g %d %d 1048576 1\r\n" % (TOPIC.encode(), partition, offset))
            if isinstance(reply, ResultReply):
                assert reply.code == 404, reply
                return out
            assert isinstance(reply, ValueReply)
            records = list(iter_records(reply.data, offset))
            assert records, "a get returned no whole record"
            out += records
            offset = records[-1].offset + records[-1].size


def run(broker: BrokerProcess, seed: int, idempotence: bool, total: int) -> tuple[int, int]:
    """Send ``total`` messages through the proxy with a SIGKILL + restart after a third of
    them were acknowledged; check the log; returns (acknowledged, duplicates in the log)."""
    rng = random.Random(seed)
    proxy = FaultProxy(lambda: broker.address, rng.randrange(1 << 30), Faults())
    try:
        with retrying_producer(proxy.url, idempotence) as producer:
            sends = NumberedSends(producer, TOPIC, total, PARTITIONS)
            sends.wait_done(total // 3)
            broker.kill()
            broker.restart()
            sends.join()
            assert producer.flush(180), "the producer did not finish"
    finally:
        proxy.close()
    print(f"seed={seed} idempotence={idempotence} proxy={dict(proxy.actions)}")
    results = [h.result(0) for h in sends.handles]
    failed = [r for r in results if not r.success]
    if failed:
        print("FAILED", len(failed), [str(f.error) for f in failed[:3]])
        print(broker.log_text()[-4000:])
    assert not failed, failed[:3]
    dups = 0
    for p in range(PARTITIONS):
        log = read_log(broker, p)
        payloads = [r.data for r in log]
        dups += len(payloads) - len(set(payloads))
        if not idempotence:
            continue
        sent = [b"m%06d" % i for i in range(p, total, PARTITIONS)]
        assert payloads == sent, f"partition {p}: log differs from send order"
        at = {r.data: (r.offset, r.msg_id) for r in log}
        for i in range(p, total, PARTITIONS):
            res = results[i]
            assert at[b"m%06d" % i] == (res.offset, res.msg_id), i
    return len(results), dups


def test_every_acknowledged_message_exactly_once_across_faults_and_sigkill(
    broker: BrokerProcess,
) -> None:
    seed = int(os.environ.get("PYMETAQ_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    acked, dups = run(broker, seed, idempotence=True, total=6000)
    assert acked == 6000 and dups == 0


def test_without_idempotence_the_same_faults_store_duplicates(broker: BrokerProcess) -> None:
    """The control: the proof above can fail (a retry after a dropped reply stores again)."""
    seed = int(os.environ.get("PYMETAQ_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    _, dups = run(broker, seed, idempotence=False, total=3000)
    assert dups > 0
