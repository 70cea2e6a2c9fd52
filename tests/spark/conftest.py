"""The one SparkSession of the test session (local[2], loopback only, quiet) and a broker for
the Spark tests.

The session is created on first use and stopped at the end of the test session: starting one
costs 3-8 s, so every Spark test shares it (spark-notes §7). Workers run this interpreter
(``PYSPARK_PYTHON``: the venv has pyarrow); the C1-only JIT flags make a busy 2-core machine
~40% faster at start-up.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._broker import BrokerProcess

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = off
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""

#: topics of the shared broker: "events"/"keyed" 3 partitions, "out" 3 partitions
SESSION_TOPICS = {
    "events": {"numPartitions": 3},
    "keyed": {"numPartitions": 3},
    "out": {"numPartitions": 3},
    "big": {"numPartitions": 1},
    "stream": {"numPartitions": 2},
    "copy": {"numPartitions": 2},
    "eo": {"numPartitions": 2},
    "eo-out": {"numPartitions": 2},
}


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from pymetaq.spark import register

    conf_dir = tmp_path_factory.mktemp("spark-conf")
    (conf_dir / "log4j2.properties").write_text(_LOG4J, encoding="utf-8")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    java = (
        f"-Dlog4j2.configurationFile=file:{conf_dir}/log4j2.properties "
        "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    )
    session = (
        SparkSession.builder.master("local[2]")
        .appName("pymetaq-tests")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", java)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker for one test module (small segments, so ranges can be split)."""
    base: Path = tmp_path_factory.mktemp("spark-broker")
    with BrokerProcess.start(
        base, system={"maxSegmentSize": 65536, "numPartitions": 1}, topics=SESSION_TOPICS
    ) as b:
        yield b


def servers(b: BrokerProcess) -> str:
    return f"meta://{b.host}:{b.port}"
