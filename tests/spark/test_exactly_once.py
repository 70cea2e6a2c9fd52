"""The exactly-once streaming sink (``deliveryGuarantee=exactly-once``) through a real local
SparkSession against a real broker: a task failure mid-batch then a restart, and a replayed
batch (Spark's commit log lost after our commit, as when the driver dies between the two),
both give the input exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.producer.sync import Producer
from tests._broker import BrokerProcess
from tests.spark.conftest import servers

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def send(b: BrokerProcess, values: list[bytes]) -> None:
    with Producer(servers(b)) as p:
        for i, v in enumerate(values):
            p.send_async("eo", v, partition=f"0-{i % 2}")
        assert p.flush(30)


def out_values(spark: Any, b: BrokerProcess) -> list[bytes]:
    df = spark.read.format("pymetaq").option("pymetaq.servers", servers(b))
    return sorted(r.value for r in df.option("subscribe", "eo-out").load().collect())


def run(spark: Any, b: BrokerProcess, ck: Path, fail_flag: Path | None = None) -> Any:
    """One availableNow run eo -> eo-out, exactly-once; returns the query's exception."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    df = (
        spark.readStream.format("pymetaq")
        .option("pymetaq.servers", servers(b))
        .option("subscribe", "eo")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10")
        .load()
    )
    if fail_flag is not None:
        flag = str(fail_flag)

        def maybe_fail(value: bytes, partition: str) -> bytes:
            import os

            # one task of the third batch fails once, after the other task may have prepared
            if partition == "0-1" and value.endswith(b"-25") and os.path.exists(flag):
                os.unlink(flag)
                raise RuntimeError("injected task failure")
            return value

        df = df.withColumn(
            "value", F.udf(maybe_fail, BinaryType(), useArrow=False)("value", "partition")
        )
    q = (
        df.select("value")
        .repartition(2)
        .writeStream.format("pymetaq")
        .option("pymetaq.servers", servers(b))
        .option("topic", "eo-out")
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    from pyspark.errors import StreamingQueryException

    try:
        try:
            q.awaitTermination(120)
        except StreamingQueryException as e:
            return e
        assert not q.isActive, "the availableNow query did not finish in 120 s"
        return q.exception()
    finally:
        q.stop()


def test_task_failure_then_restart_and_replayed_batch_are_exactly_once(
    spark: Any, broker: BrokerProcess, tmp_path: Path
):
    values = [b"eo-%02d" % i for i in range(40)]
    send(broker, values)
    ck = tmp_path / "ck"
    flag = tmp_path / "fail-once"
    flag.write_text("1")
    # spark.task.maxFailures is 1 in local mode: the injected failure fails the query
    assert run(spark, broker, ck, flag) is not None
    assert not flag.exists()
    assert len(out_values(spark, broker)) < 40
    assert run(spark, broker, ck) is None
    assert out_values(spark, broker) == values
    # a replay: Spark's commit of the last batch is lost (the driver died after our commit)
    commits = sorted(
        (ck / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1
    )
    last = commits[-1]
    assert last.name.isdigit()
    last.unlink()
    (ck / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
    send(broker, [b"eo-%02d" % i for i in range(40, 45)])
    assert run(spark, broker, ck) is None
    assert out_values(spark, broker) == values + [b"eo-%02d" % i for i in range(40, 45)]
