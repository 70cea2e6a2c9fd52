"""Streaming read (and the at-least-once streaming write) of format ``pymetaq`` through a real
local SparkSession against a real broker: ``availableNow`` with admission control, a restart
from the checkpoint with no duplicates and no gaps, maxBytesPerTrigger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.producer.sync import Producer
from tests._broker import BrokerProcess
from tests.spark.conftest import servers

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def send(b: BrokerProcess, topic: str, values: list[bytes]) -> None:
    with Producer(servers(b)) as p:
        for i, v in enumerate(values):
            p.send_async(topic, v, key=b"k%d" % (i % 5))
        assert p.flush(30)


def read_all(spark: Any, b: BrokerProcess, topic: str) -> list[Any]:
    return (
        spark.read.format("pymetaq")
        .option("pymetaq.servers", servers(b))
        .option("subscribe", topic)
        .load()
        .collect()
    )


def run_available_now(spark: Any, b: BrokerProcess, ck: Path, **opts: str) -> list[int]:
    """One availableNow run of stream -> copy; the rows of each micro-batch."""
    r = spark.readStream.format("pymetaq").option("pymetaq.servers", servers(b))
    r = r.option("subscribe", "stream").option("startingOffsets", "earliest")
    for k, v in opts.items():
        r = r.option(k, v)
    q = (
        r.load()
        .select("key", "value")
        .writeStream.format("pymetaq")
        .option("pymetaq.servers", servers(b))
        .option("topic", "copy")
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(120), "the availableNow query did not finish in 120 s"
        assert q.exception() is None
    finally:
        q.stop()
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


def test_available_now_with_max_offsets_and_restart_from_checkpoint(
    spark: Any, broker: BrokerProcess, tmp_path: Path
):
    first = [b"s-%03d" % i for i in range(30)]
    send(broker, "stream", first)
    ck = tmp_path / "ck"
    batches = run_available_now(spark, broker, ck, maxOffsetsPerTrigger="12")
    assert sum(batches) == 30 and max(batches) <= 12 and len(batches) >= 3
    second = [b"s-%03d" % i for i in range(30, 45)]
    send(broker, "stream", second)
    batches = run_available_now(spark, broker, ck, maxOffsetsPerTrigger="12")
    assert sum(batches) == 15  # only the new rows
    copy = read_all(spark, broker, "copy")
    assert sorted(r.value for r in copy) == first + second  # no duplicates, no gaps
    # the key travelled along, and so the copy keeps key -> partition
    assert all(r.key == b"k%d" % (int(r.value[2:]) % 5) for r in copy)


def test_max_bytes_per_trigger(spark: Any, broker: BrokerProcess, tmp_path: Path):
    before = len(read_all(spark, broker, "copy"))
    values = [b"b-%03d" % i + b"z" * 75 for i in range(20)]  # 20 + 80 + key attribute bytes
    send(broker, "stream", values)
    # the stream topic already holds 45 rows: from the start, 65 rows in batches of <= 1000 bytes
    batches = run_available_now(spark, broker, tmp_path / "ck2", maxBytesPerTrigger="1000")
    assert sum(batches) == 65 and len(batches) >= 65 * 30 // 1000
    assert len(read_all(spark, broker, "copy")) == before + 65
