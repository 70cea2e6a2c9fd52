"""Streaming read (and the at-least-once streaming write) of format ``pymetaq`` through a real
local SparkSession against a real broker: ``availableNow`` with admission control, a restart
from the checkpoint with no duplicates and no gaps, maxBytesPerTrigger."""

from __future__ import annotations

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


def run_available_now(
    spark: Any, b: BrokerProcess, ck: Path, source: str = "stream", sink: str = "copy", **opts: str
) -> list[int]:
    """One availableNow run of source -> sink; the rows of each micro-batch."""
    r = spark.readStream.format("pymetaq").option("pymetaq.servers", servers(b))
    r = r.option("subscribe", source).option("startingOffsets", "earliest")
    for k, v in opts.items():
        r = r.option(k, v)
    q = (
        r.load()
        .select("key", "value")
        .writeStream.format("pymetaq")
        .option("pymetaq.servers", servers(b))
        .option("topic", sink)
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


def test_fail_on_data_loss_both_ways_after_retention(spark: Any, tmp_path: Path):
    """A query stopped at a position, retention deletes the segment holding it, the query
    restarts from its checkpoint: ``failOnDataLoss=true`` fails naming the lost range;
    ``false`` (same checkpoint) goes on from the first stored offset, nothing twice."""
    topics: dict[str, dict[str, Any]] = {
        "ret": {"deletePolicy": "delete,0s", "deleteWhen": "* * * * * ?"},
        "ret-copy": {"numPartitions": 1},
    }
    ck = tmp_path / "ck"
    with BrokerProcess.start(tmp_path / "b", system={"maxSegmentSize": 4096}, topics=topics) as b:
        first_rows = [b"early-%d" % i for i in range(5)]
        send(b, "ret", first_rows)
        assert run_available_now(spark, b, ck, source="ret", sink="ret-copy") == [5]
        tp = TopicPartition("ret", 0, 0)
        with Brokers(servers(b), "t") as br:
            stopped_at = br.bounds(tp)[1]
        lost = [b"lost-%04d" % i + b"y" * 30 for i in range(400)]
        send(b, "ret", lost)  # the rest of the query's segment
        b.terminate()
        b.launch()
        # the restarted broker appends to the segment the lost records end in (whose fill
        # depends on how the producer batched them): one record larger than a segment closes
        # it, alone in a full segment of its own, so every lost record is in a closed segment
        # that retention deletes, and the last records start the active one, which it keeps
        send(b, "ret", [b"filler" + b"f" * 4096])
        with Brokers(servers(b), "t") as br:
            last_start = br.bounds(tp)[1]
        last = [b"last-%d" % i for i in range(10)]
        send(b, "ret", last)

        def first() -> int:
            with Brokers(servers(b), "t") as br:
                return br.bounds(tp)[0]

        wait_for(lambda: first() == last_start, 60, "retention deleting all but the last records")
        assert last_start > stopped_at
        with pytest.raises(Exception, match=f"data loss: ret/0-0 offsets {stopped_at}\\.\\."):
            run_available_now(spark, b, ck, source="ret", sink="ret-copy")
        run_available_now(spark, b, ck, source="ret", sink="ret-copy", failOnDataLoss="false")
        copy = [r.value for r in read_all(spark, b, "ret-copy")]  # one partition: in order
        # the first run's rows, then what is still stored: the deleted range skipped, no repeat
        assert copy == first_rows + last
