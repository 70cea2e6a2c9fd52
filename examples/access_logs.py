"""A data pipeline on Spark: web access logs shipped into a pymetaq topic, a Structured
Streaming job that parses them and counts requests and bytes per minute and status class,
written exactly-once to another topic and to Parquet; then the result is printed.

```
python examples/access_logs.py [--servers meta://127.0.0.1:8123] [--lines 600] [--out DIR]
```

Runs against a broker on the shipped configuration (``pymetaq server``): the logs go to
``log-access`` and the aggregates to ``log-minutes`` (``log-*`` topics are created by their
first message). Each run ships a fresh batch of log lines stamped in the past few minutes,
then runs both queries with ``trigger(availableNow=True)`` on checkpoints under ``--out``: a
second run processes only the new lines. A minute is emitted once the watermark (the newest
line's time minus one minute) has passed its end, as a streaming aggregation in append mode
does.

Thread-safety: a script.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from pymetaq.client import Consumer, Producer, TopicPartition

STATUSES = [200] * 16 + [304] * 2 + [404, 500]
PATHS = ["/", "/index.html", "/a.png", "/api/orders", "/login"]


def ship(servers: str, lines: int, seed: int) -> None:
    """Write ``lines`` Common Log Format lines over the last 5 minutes into ``log-access``,
    then wait until readers can see them all (see :func:`wait_readable`)."""
    rng = random.Random(seed)
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    start = now - dt.timedelta(minutes=5)
    with Producer(servers) as p:
        handles = []
        for i in range(lines):
            t = start + dt.timedelta(seconds=300 * i / lines)
            host = f"10.0.0.{rng.randrange(1, 20)}"
            line = (
                f'{host} - - [{t:%d/%b/%Y:%H:%M:%S} +0000] "GET {rng.choice(PATHS)} HTTP/1.1" '
                f"{rng.choice(STATUSES)} {rng.randrange(200, 5000)}"
            )
            handles.append(p.send_async("log-access", line.encode(), key=host))
        p.flush(30)
    ends: dict[TopicPartition, int] = {}
    for h in handles:
        r = h.result(30)
        if not r.success:
            raise SystemExit(f"access_logs.py: shipping failed: {r.error}")
        tp = TopicPartition("log-access", r.broker_id, r.partition)
        ends[tp] = max(ends.get(tp, 0), r.offset + 1)
    wait_readable(servers, ends)


def wait_readable(servers: str, ends: dict[TopicPartition, int], timeout_s: float = 60) -> None:
    """Wait until each partition's readable end has reached ``ends``.

    ``log-*`` topics run in threshold mode on the shipped configuration: a message is
    acknowledged at once and readers see it after the broker's next flush (at most
    ``unflushInterval``, 10 s, later). A query with ``trigger(availableNow=True)`` reads what
    is readable when it starts, so the pipeline waits for the lines it just shipped."""
    deadline = time.monotonic() + timeout_s
    with Consumer(servers, None) as c:
        for attempt in itertools.count():
            behind = [tp for tp, end in c.end_offsets(list(ends)).items() if end < ends[tp]]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"access_logs.py: not readable after {timeout_s:g} s: {behind}")
            if not attempt:
                print("waiting for the broker's next flush (log-* topics: unflushInterval, 10 s)")
            time.sleep(0.5)


def session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pymetaq.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def pipeline(spark: Any, servers: str, out: Path) -> None:
    """Run both queries (availableNow) and print the Parquet table."""
    from pyspark.sql import functions as F

    logs = (
        spark.readStream.format("pymetaq")
        .option("pymetaq.servers", servers)
        .option("subscribe", "log-access")
        .option("startingOffsets", "earliest")
        .load()
    )
    pattern = r'^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+) [^"]*" (\d{3}) (\d+)$'
    line = F.col("value").cast("string")
    parsed = logs.select(
        F.to_timestamp(F.regexp_extract(line, pattern, 2), "dd/MMM/yyyy:HH:mm:ss Z").alias("time"),
        (F.regexp_extract(line, pattern, 5).cast("int") / 100).cast("int").alias("class"),
        F.regexp_extract(line, pattern, 6).cast("long").alias("bytes"),
    )
    minutes = (
        parsed.withWatermark("time", "1 minute")
        .groupBy(F.window("time", "1 minute"), "class")
        .agg(F.count("*").alias("requests"), F.sum("bytes").alias("bytes"))
        .select(
            F.date_format("window.start", "yyyy-MM-dd HH:mm").alias("minute"),
            F.concat(F.col("class").cast("string"), F.lit("xx")).alias("status"),
            "requests",
            "bytes",
        )
    )
    to_topic = (
        minutes.select(F.col("minute").alias("key"), F.to_json(F.struct("*")).alias("value"))
        .writeStream.format("pymetaq")
        .option("pymetaq.servers", servers)
        .option("topic", "log-minutes")
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(out / "checkpoints" / "topic"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    to_parquet = (
        minutes.writeStream.format("parquet")
        .option("path", str(out / "minutes.parquet"))
        .option("checkpointLocation", str(out / "checkpoints" / "parquet"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    for q in (to_topic, to_parquet):
        q.awaitTermination(300)
    table = spark.read.parquet(str(out / "minutes.parquet")).orderBy("minute", "status")
    print(f"per-minute aggregates in {out / 'minutes.parquet'} (also in topic log-minutes):")
    table.show(50, truncate=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="access_logs.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=os.environ.get("PYMETAQ_SERVERS", "meta://127.0.0.1:8123"))
    ap.add_argument("--lines", type=int, default=600)
    ap.add_argument("--out", type=Path, default=Path("access-logs"))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    ship(args.servers, args.lines, args.seed)
    spark = session()
    try:
        pipeline(spark, args.servers, args.out.resolve())
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
