"""Format ``pymetaq`` on Spark, measured in one run against one real broker (local[2]):

* **read**: rows/s of a batch read of N 100-byte messages through Spark (``sum(length(value))``
  over ``spark.read.format("pymetaq")``) against the plain ``Consumer`` reading the same topic;
* **sink**: rows/s of a streaming copy of the topic (``availableNow``, ``maxOffsetsPerTrigger``
  rows per micro-batch: ``--per-trigger``) with the at-least-once sink against the exactly-once
  sink (XA branches + the driver's commit);
* **latency**: append-to-sink time of a streaming copy at a fixed trigger (200 ms): one
  message appended at a time, the time until it is readable in the sink topic.

```
python -m bench.spark [--messages 1000000] [--latency-samples 10] [--per-trigger 100000] [--json]
```

Prints a table, or JSON with ``--json``. Timings on a shared 2-core machine are noisy: run it
twice and compare within one run only.

Thread-safety: a script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pymetaq.client.consumer.sync import Consumer
from pymetaq.client.producer.sync import Producer
from tests._broker import BrokerProcess

TOPICS = {"src": {"numPartitions": 2}, "alo": {"numPartitions": 2}, "eo": {"numPartitions": 2}}
TOPICS |= {"lat-in": {"numPartitions": 1}, "lat-out": {"numPartitions": 1}}


def session() -> Any:
    from pyspark.sql import SparkSession

    from pymetaq.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "resolves to a loopback" warning
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def fill(servers: str, n: int) -> None:
    value = b"v" * 100
    with Producer(servers) as p:
        for _ in range(n):
            p.send_async("src", value)
        assert p.flush(600)


def consumer_rate(servers: str, n: int) -> float:
    with Consumer(servers, None, initial_position="earliest") as c:
        c.subscribe("src")
        got, t0 = 0, time.perf_counter()
        deadline = t0 + 600
        while got < n and time.perf_counter() < deadline:
            got += len(c.poll(1.0, max_records=100_000))
        return got / (time.perf_counter() - t0)


def spark_read_rate(spark: Any, servers: str, n: int) -> float:
    df = spark.read.format("pymetaq").option("pymetaq.servers", servers).option("subscribe", "src")
    t0 = time.perf_counter()
    total = df.load().selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0]
    elapsed = time.perf_counter() - t0
    assert total.n == n, total
    return n / elapsed


def copy_rate(
    spark: Any, servers: str, n: int, topic: str, guarantee: str, ck: Path, per_trigger: int
) -> float:
    q = (
        spark.readStream.format("pymetaq")
        .option("pymetaq.servers", servers)
        .option("subscribe", "src")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_trigger))
        .load()
        .select("value")
        .writeStream.format("pymetaq")
        .option("pymetaq.servers", servers)
        .option("topic", topic)
        .option("deliveryGuarantee", guarantee)
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    query = q.start()
    query.awaitTermination(1200)
    elapsed = time.perf_counter() - t0
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    assert rows == n, rows
    return n / elapsed


def latency(spark: Any, servers: str, samples: int, ck: Path) -> list[float]:
    query = (
        spark.readStream.format("pymetaq")
        .option("pymetaq.servers", servers)
        .option("subscribe", "lat-in")
        .load()
        .select("value")
        .writeStream.format("pymetaq")
        .option("pymetaq.servers", servers)
        .option("topic", "lat-out")
        .option("checkpointLocation", str(ck))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    out: list[float] = []
    try:
        with Producer(servers) as p, Consumer(servers, None, initial_position="latest") as c:
            c.subscribe("lat-out")
            c.poll(0.5)
            time.sleep(5)  # the query's first (empty) micro-batches: class loading, JIT
            for i in range(samples):
                value = b"lat-%d" % i
                t0 = time.perf_counter()
                p.send_and_wait("lat-in", value)
                seen = False
                while not seen and time.perf_counter() - t0 < 30:
                    seen = any(m.value == value for m in c.poll(0.05))
                out.append(time.perf_counter() - t0 if seen else float("inf"))
    finally:
        query.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--latency-samples", type=int, default=10)
    ap.add_argument(
        "--per-trigger",
        type=int,
        default=100_000,
        help="maxOffsetsPerTrigger of the streaming copies (an exactly-once task must send its "
        "share within the broker's transaction timeout, maxTxTimeoutInSeconds=60)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with (
        tempfile.TemporaryDirectory() as tmp,
        BrokerProcess.start(Path(tmp), topics=TOPICS) as broker,
    ):
        servers = f"meta://{broker.host}:{broker.port}"
        fill(servers, args.messages)
        spark = session()
        try:
            spark_read_rate(spark, servers, args.messages)  # warm-up: workers, JIT
            result: dict[str, Any] = {
                "messages": args.messages,
                "per_trigger": args.per_trigger,
                "read_consumer_rows_s": consumer_rate(servers, args.messages),
                "read_spark_rows_s": spark_read_rate(spark, servers, args.messages),
                "sink_at_least_once_rows_s": copy_rate(
                    spark,
                    servers,
                    args.messages,
                    "alo",
                    "at-least-once",
                    Path(tmp) / "ck1",
                    args.per_trigger,
                ),
                "sink_exactly_once_rows_s": copy_rate(
                    spark,
                    servers,
                    args.messages,
                    "eo",
                    "exactly-once",
                    Path(tmp) / "ck2",
                    args.per_trigger,
                ),
            }
            lat = sorted(latency(spark, servers, args.latency_samples, Path(tmp) / "ck3"))
            result["append_to_sink_s"] = {"p50": lat[len(lat) // 2], "max": lat[-1]}
        finally:
            spark.stop()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{args.messages} messages of 100 bytes, 2 partitions, local[2], "
        f"copies at maxOffsetsPerTrigger={args.per_trigger}"
    )
    print(f"{'case':<36}{'rows/s':>12}")
    for key in ("read_consumer", "read_spark", "sink_at_least_once", "sink_exactly_once"):
        print(f"{key:<36}{result[key + '_rows_s']:>12,.0f}")
    a = result["append_to_sink_s"]
    print(f"append-to-sink at a 200 ms trigger: p50 {a['p50']:.2f} s, max {a['max']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
