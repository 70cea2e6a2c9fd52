"""The exactly-once sink's driver logic against a real broker, without Spark: tasks prepare
branches, the driver dies before committing (no decision), the batch is replayed and
committed -> the leftover branches are rolled back and the output holds the batch once; a
driver that dies after recording its decision, mid-commit -> the next commit finishes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pymetaq.client.consumer.sync import Consumer
from pymetaq.client.producer.sync import Producer
from pymetaq.spark.exactly_once import (
    Branch,
    SinkState,
    commit_batch,
    load_state,
    run_branch,
    save_state,
    sink_identity,
)
from pymetaq.spark.options import SparkOptionError
from tests._broker import BrokerProcess
from tests.spark.conftest import servers

pytestmark = pytest.mark.integration


def prepare(b: BrokerProcess, ident, batch: int, task: int, values: list[bytes]) -> Branch:
    with Producer(servers(b)) as p:
        p.partitions("sink")
        xa = p.xa_resource(ident.qualifier, topics=["sink"])

        def send() -> None:
            for v in values:
                p.send_and_wait("sink", v)

        return run_branch(xa, ident.xid(batch, task, 0), send)


def driver_commit(b: BrokerProcess, ident, batch: int, branches: list[Branch]) -> None:
    with Producer(servers(b)) as p:
        commit_batch(p.xa_resource(ident.qualifier, topics=[]), ident, batch, branches)


def committed(b: BrokerProcess) -> list[bytes]:
    with Consumer(servers(b), None, initial_position="earliest") as c:
        c.subscribe("sink")
        got: list[bytes] = []
        for _ in range(20):  # bounded: 20 polls of up to 0.5 s
            batch = c.poll(0.5)
            if not batch and got:
                break
            got += [m.value for m in batch]
        return sorted(got)


def test_driver_crash_before_and_during_commit(tmp_path: Path):
    ident = sink_identity({"checkpointlocation": str(tmp_path / "ck")})
    with BrokerProcess.start(tmp_path, topics={"sink": {"numPartitions": 2}}) as b:
        rows0 = [b"a-%d" % i for i in range(5)]
        driver_commit(b, ident, 0, [prepare(b, ident, 0, 0, rows0)])
        # batch 1: both tasks prepared, then the driver died (no commit, no decision)
        prepare(b, ident, 1, 0, [b"b-0", b"b-1"])
        prepare(b, ident, 1, 1, [b"b-2"])
        assert committed(b) == rows0  # prepared branches are invisible
        # restart: Spark replays batch 1; the new attempts prepare and the driver commits
        again = [prepare(b, ident, 1, 0, [b"b-0", b"b-1"]), prepare(b, ident, 1, 1, [b"b-2"])]
        driver_commit(b, ident, 1, again)
        assert committed(b) == sorted([*rows0, b"b-0", b"b-1", b"b-2"])
        with Producer(servers(b)) as p:
            assert p.xa_resource(ident.qualifier, topics=[]).recover() == []
        # batch 2: the decision is recorded, then the driver dies before committing
        pending = [prepare(b, ident, 2, 0, [b"c-0"])]
        save_state(ident, SinkState(2, [(x.gtrid, x.bqual, x.broker_id) for x in pending], False))
        # restart: Spark replays batch 2 (its commit log lacks it): the replay's branches are
        # rolled back and the decided one is finished
        driver_commit(b, ident, 2, [prepare(b, ident, 2, 0, [b"c-0"])])
        assert committed(b) == sorted([*rows0, b"b-0", b"b-1", b"b-2", b"c-0"])
        assert load_state(ident).batch == 2


def test_sink_identity_needs_a_local_state_dir(tmp_path: Path):
    a = sink_identity({"checkpointlocation": f"file:{tmp_path}/ck"})
    assert a == sink_identity({"checkpointlocation": str(tmp_path / "ck")})
    assert a.state_dir == str(tmp_path / "ck" / "pymetaq-sink")
    assert a.batch_of(a.xid(7, 1, 0)) == 7 and a.xid(7, 1, 0) != a.xid(7, 1, 0)
    with pytest.raises(SparkOptionError, match="needs a checkpointLocation"):
        sink_identity({})
    with pytest.raises(SparkOptionError, match="local directory"):
        sink_identity({"checkpointlocation": "hdfs://nn/ck"})
