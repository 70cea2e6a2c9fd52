"""The access-log pipeline (``examples/access_logs.py``) on a Spark **standalone cluster**: a
master and two workers started from the pyspark distribution on 127.0.0.1, one executor per
worker; the executors fetch from and send to a real broker (the driver runs no task).

```
python examples/spark_cluster.py [--servers meta://127.0.0.1:8123] [--lines 600] [--out DIR] [--json]
```

Needs a broker on the shipped configuration (``pymetaq server``), the ``spark`` extra and
Java 17+. It starts the cluster (``bin/spark-class ...Master`` / ``...Worker``, logs under
``--out/cluster``), ships ``--lines`` access-log lines, runs the pipeline's two streaming
queries (exactly-once to the topic ``log-minutes``, and Parquet), then checks and prints:
which executor read how many log lines (a batch read of ``log-access``, one row per task), and
that the topic holds each Parquet row once. The cluster is stopped on the way out, also on
errors. Exit code 0 when the checks pass, 1 otherwise.

Thread-safety: a script.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JIT = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # faster start on a busy machine
START_TIMEOUT_S = 90.0
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def daemon(args: list[str], log: Path, ready: str, work: Path) -> subprocess.Popen[bytes]:
    """Start ``spark-class <args>``; return once its log shows ``ready`` (bounded)."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_WORKER_DIR=str(work))
    env.update(SPARK_DAEMON_JAVA_OPTS=JIT, SPARK_DAEMON_MEMORY="256m")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(spark_class()), *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"{' '.join(args[:1])} did not start; its log: {log}")
        time.sleep(0.2)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


@contextlib.contextmanager
def standalone(out: Path, workers: int = 2) -> Iterator[str]:
    """A master and ``workers`` workers (1 core, 1 GiB each) on 127.0.0.1; yields the master
    URL. The daemons are this process's children, stopped by their pids."""
    logs = out / "cluster"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    procs = [
        daemon(
            [MASTER, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())],
            logs / "master.log",
            "I have been elected leader",
            logs / "work",
        )
    ]
    try:
        for i in range(workers):
            procs.append(
                daemon(
                    [
                        WORKER,
                        "--host",
                        "127.0.0.1",
                        *("--cores", "1", "--memory", "1g"),
                        "--webui-port",
                        str(free_port()),
                        master_url,
                    ],
                    logs / f"worker-{i}.log",
                    "Successfully registered with master",
                    logs / f"work-{i}",
                )
            )
        yield master_url
    finally:
        for proc in reversed(procs):
            stop(proc)


def session(master_url: str, executors: int) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python workers: this venv
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from pymetaq.spark import register

    spark = (
        SparkSession.builder.master(master_url)
        .appName("pymetaq-access-logs")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(executors))
        .config("spark.executor.memory", "512m")
        .config("spark.executor.extraJavaOptions", JIT)
        .config("spark.driver.extraJavaOptions", JIT)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(executor_ids(spark)) < executors:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{executors} executors did not register in {START_TIMEOUT_S} s")
        time.sleep(0.2)
    return spark


def executor_ids(spark: Any) -> list[str]:
    """The ids of the executors registered with the driver (the driver is not one)."""
    ids = spark.sparkContext._jsc.sc().getExecutorIds().mkString(",")
    return sorted(i for i in str(ids).split(",") if i)


def load_pipeline() -> Any:
    spec = importlib.util.spec_from_file_location("access_logs", HERE / "access_logs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _where(rows: Iterator[Any]) -> Iterator[tuple[str, int]]:
    # a Python worker's working directory is its executor's: <worker dir>/<app id>/<executor id>
    yield Path.cwd().name, sum(1 for _ in rows)


def run(spark: Any, servers: str, lines: int, out: Path, seed: int) -> dict[str, Any]:
    pipeline = load_pipeline()
    pipeline.ship(servers, lines, seed)
    pipeline.pipeline(spark, servers, out)
    logs = spark.read.format("pymetaq").option("pymetaq.servers", servers)
    logs = logs.option("subscribe", "log-access").load()
    per_task = logs.rdd.mapPartitions(_where).collect()
    reads: dict[str, int] = {}
    for executor, n in per_task:
        reads[executor] = reads.get(executor, 0) + n
    table = spark.read.parquet(str(out / "minutes.parquet")).collect()
    topic = spark.read.format("pymetaq").option("pymetaq.servers", servers)
    topic = topic.option("subscribe", "log-minutes")
    # log-* topics are flushed by time on the shipped configuration (unflushInterval, 10 s):
    # committed aggregates become readable at the next flush
    deadline = time.monotonic() + 30
    rows = topic.load().collect()
    while len(rows) < len(table) and time.monotonic() < deadline:
        time.sleep(1)
        rows = topic.load().collect()
    from_topic = sorted(tuple(json.loads(r.value).values()) for r in rows)
    return {
        "executors": executor_ids(spark),
        "log_lines_read_per_executor": reads,
        "parquet_rows": len(table),
        "topic_rows": len(rows),
        "topic_equals_parquet": from_topic
        == sorted((r.minute, r.status, r.requests, r.bytes) for r in table),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spark_cluster.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=os.environ.get("PYMETAQ_SERVERS", "meta://127.0.0.1:8123"))
    ap.add_argument("--lines", type=int, default=600)
    ap.add_argument("--out", type=Path, default=Path("access-logs-cluster"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    t0 = time.monotonic()
    with standalone(out) as master_url:
        spark = session(master_url, executors=2)
        try:
            # with --json, stdout is the report alone: the pipeline's table goes to stderr
            with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
                report = run(spark, args.servers, args.lines, out, args.seed)
        finally:
            spark.stop()
    report["master"] = re.sub(r":\d+$", ":<port>", master_url)
    report["seconds"] = round(time.monotonic() - t0, 1)
    ok = report["topic_equals_parquet"] and len(report["executors"]) == 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
        print("checks passed" if ok else "CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
