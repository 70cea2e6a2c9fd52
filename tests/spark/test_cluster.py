"""``examples/spark_cluster.py``: the access-log pipeline on a Spark standalone cluster (a
master and two workers from the pyspark distribution, loopback only) against a real broker on
the shipped configuration. The script is the driver, in its own process (a pytest process
holds one SparkContext: the suite's local session). Slow: three more JVMs and two executors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pymetaq.server.default_config import default_text
from tests._broker import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_pipeline_on_a_standalone_cluster(tmp_path: Path):
    ini = default_text().replace("serverPort=8123", "serverPort=0")
    ini = ini.replace("dashboardHttpPort=8120", "dashboardHttpPort=0")
    with BrokerProcess.start(tmp_path / "broker", ini_text=ini, name="shipped") as b:
        args = ["--json", "--servers", f"meta://{b.host}:{b.port}", "--out", str(tmp_path / "out")]
        proc = subprocess.run(
            [sys.executable, str(ROOT / "examples/spark_cluster.py"), *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    print(proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["executors"] == ["0", "1"]
    # every log line was read by an executor's task (the driver runs none)
    reads = report["log_lines_read_per_executor"]
    assert set(reads) <= {"0", "1"} and sum(reads.values()) == 600
    assert report["topic_equals_parquet"] and report["parquet_rows"] > 0
    assert report["topic_rows"] == report["parquet_rows"]
