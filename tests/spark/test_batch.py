"""Batch read and write of format ``pymetaq`` through a real local SparkSession against a real
broker: one task per partition, offset ranges, minPartitions, data-loss both ways, key ->
partition stability, the rows' columns."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.producer.sync import Producer
from pymetaq.client.types import TopicPartition
from pymetaq.spark.fetch import Brokers
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.spark.conftest import servers

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def produce(b: BrokerProcess, topic: str, rows: list[tuple[str, bytes]], **opts: Any) -> list[Any]:
    """Send ``(partition key, value)`` rows; return their SendResults."""
    with Producer(servers(b)) as p:
        return [p.send_and_wait(topic, v, partition=k, **opts) for k, v in rows]


def reader(spark: Any, b: BrokerProcess, **options: str) -> Any:
    r = spark.read.format("pymetaq").option("pymetaq.servers", servers(b))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_one_task_per_partition_and_the_columns(spark: Any, broker: BrokerProcess):
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    sent = produce(broker, "events", [(f"0-{i % 3}", b"ev-%02d" % i) for i in range(30)])
    df = reader(spark, broker, subscribe="events")
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    assert sorted(r.value for r in rows) == sorted(b"ev-%02d" % i for i in range(30))
    by_value = {r.value: r for r in rows}
    for i, res in enumerate(sent):
        r = by_value[b"ev-%02d" % i]
        assert (r.topic, r.partition, r.offset, r.msg_id) == (
            "events",
            res.partition_key,
            res.offset,
            res.msg_id,
        )
        assert r.key is None and r.attribute is None
        stamp = r.timestamp.replace(tzinfo=dt.UTC)  # Spark gives naive times in the session tz
        assert before - dt.timedelta(seconds=2) <= stamp <= dt.datetime.now(dt.UTC)
    # per partition, rows come in offset order
    for key in ("0-0", "0-1", "0-2"):
        offs = [r.offset for r in rows if r.partition == key]
        assert offs == sorted(offs) and len(offs) == 10


def test_batch_read_json_offset_ranges(spark: Any, broker: BrokerProcess):
    res = produce(broker, "keyed", [("0-0", b"k-%02d" % i) for i in range(10)])
    start, end = res[2].offset, res[7].offset  # [2, 7): five messages
    df = reader(
        spark,
        broker,
        assign=json.dumps({"keyed": ["0-0"]}),
        startingOffsets=json.dumps({"keyed": {"0-0": start}}),
        endingOffsets=json.dumps({"keyed": {"0-0": end}}),
    )
    assert [r.value for r in df.orderBy("offset").collect()] == [b"k-%02d" % i for i in range(2, 7)]
    # -2 earliest, -1 latest
    df = reader(
        spark,
        broker,
        assign=json.dumps({"keyed": ["0-0"]}),
        startingOffsets=json.dumps({"keyed": {"0-0": -2}}),
        endingOffsets=json.dumps({"keyed": {"0-0": -1}}),
    )
    assert df.count() == 10


def test_min_partitions_splits_at_segment_starts(spark: Any, broker: BrokerProcess):
    values = [b"%06d" % i + b"x" * 94 for i in range(3000)]  # 3000 x 120 bytes: ~6 segments
    # batches of 500: a batch is never split across segments, and one of the default 4096
    # would hold all 3000 in one segment
    with Producer(servers(broker), batch_messages=500) as p:
        for v in values:
            p.send_async("big", v)
        assert p.flush(60)
    df = reader(spark, broker, subscribe="big", minPartitions="4")
    tp = TopicPartition("big", 0, 0)
    with Brokers(servers(broker), "t") as br:
        first, end = br.bounds(tp)
        starts = sorted({br.nearest(tp, off) for off in range(first, end, 4096)})
    # cut at segment starts only: as many tasks as distinct starts the cuts hit (>1 here)
    print("segment starts", starts, "tasks", df.rdd.getNumPartitions())
    assert len(starts) > 1, starts  # the premise: several segments
    assert 1 < df.rdd.getNumPartitions() <= min(4, len(starts))
    got = [r.value for r in df.collect()]
    assert sorted(got) == sorted(values) and len(got) == len(values)


def test_bad_options_are_clear_errors(spark: Any, broker: BrokerProcess):
    with pytest.raises(Exception, match="exactly one of the options 'subscribe'"):
        reader(spark, broker).collect()
    with pytest.raises(Exception, match="option 'startingOffsets' must be 'earliest'"):
        reader(spark, broker, subscribe="events", startingOffsets="{nope").collect()
    with pytest.raises(Exception, match="has no partition 0-7"):
        reader(spark, broker, assign='{"events": ["0-7"]}').collect()


def test_write_then_read_back_and_key_partition_stability(spark: Any, broker: BrokerProcess):
    rows = [(f"key-{i % 7}", f"value-{i}") for i in range(60)]
    df = spark.createDataFrame(rows, "key string, value string")
    df.write.format("pymetaq").option("pymetaq.servers", servers(broker)).option(
        "topic", "out"
    ).mode("append").save()
    back = reader(spark, broker, subscribe="out").collect()
    assert sorted((r.key, r.value) for r in back) == sorted(
        (k.encode(), v.encode()) for k, v in rows
    )
    # every key landed in one partition: the producer's crc32(key) % 3 over sorted partitions
    with Producer(servers(broker)) as p:
        parts = p.partitions("out")
    import zlib

    for r in back:
        assert r.partition == parts[zlib.crc32(r.key) % len(parts)].key
    with pytest.raises(Exception, match="only appends"):
        df.write.format("pymetaq").option("pymetaq.servers", servers(broker)).option(
            "topic", "out"
        ).mode("overwrite").save()


def test_fail_on_data_loss_both_ways(spark: Any, tmp_path: Path):
    topics = {"ret": {"deletePolicy": "delete,0s", "deleteWhen": "* * * * * ?"}}
    with BrokerProcess.start(tmp_path, system={"maxSegmentSize": 4096}, topics=topics) as b:
        produce(b, "ret", [("0-0", b"first")])
        b.terminate()
        b.launch()  # retention covers the logs that exist when the broker starts
        with Producer(servers(b)) as p:
            for i in range(400):
                p.send_async("ret", b"r-%04d" % i + b"y" * 30)
            assert p.flush(30)
        tp = TopicPartition("ret", 0, 0)

        def first() -> int:
            with Brokers(servers(b), "t") as br:
                return br.bounds(tp)[0]

        wait_for(lambda: first() > 0, 60, "retention deleting a segment")
        with pytest.raises(Exception, match="data loss: ret/0-0 offsets 0\\.\\."):
            reader(spark, b, subscribe="ret", startingOffsets='{"ret": {"0-0": 0}}').collect()
        start = first()
        rows = reader(
            spark, b, subscribe="ret", startingOffsets='{"ret": {"0-0": 0}}', failOnDataLoss="false"
        ).collect()
        assert rows and min(r.offset for r in rows) >= start


def test_format_found_without_register(spark: Any, broker: BrokerProcess):
    """A session nobody called ``register()`` on finds format ``pymetaq`` through the
    ``pyspark_pymetaq`` shim (Spark's lookup of top-level ``pyspark_*`` modules)."""
    produce(broker, "keyed", [("0-1", b"via-shim")])
    fresh = spark.newSession()  # its own data source registry: register() was not called
    assert not registered(fresh, "pymetaq") and registered(spark, "pymetaq")
    rows = (
        fresh.read.format("pymetaq")
        .option("pymetaq.servers", servers(broker))
        .option("assign", '{"keyed": ["0-1"]}')
        .load()
        .collect()
    )
    assert [r.value for r in rows] == [b"via-shim"]
    assert not registered(fresh, "pymetaq")  # still not registered: the shim served it


def registered(session: Any, name: str) -> bool:
    """Whether ``register()`` put ``name`` in this session's registry (the JVM's
    ``runtimeDataSourceBuilders``; the builders found through ``pyspark_*`` modules are kept
    apart, in ``staticDataSourceBuilders``)."""
    manager = session._jsparkSession.sessionState().dataSourceManager()
    field = manager.getClass().getDeclaredField("runtimeDataSourceBuilders")
    field.setAccessible(True)
    return bool(field.get(manager).containsKey(name))
