"""``examples/access_logs.py`` (the pipeline docs/spark.md shows) runs as written, on the shared
SparkSession against a broker on the shipped configuration: the log lines it ships are counted
per minute and status class, exactly once, in the topic ``log-minutes`` and in Parquet."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from pymetaq.server.default_config import default_text
from tests._broker import BrokerProcess
from tests._helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("access_logs", ROOT / "examples/access_logs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_access_log_pipeline(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    ex = load_example()
    ini = default_text().replace("serverPort=8123", "serverPort=0")
    ini = ini.replace("dashboardHttpPort=8120", "dashboardHttpPort=0")
    with BrokerProcess.start(tmp_path, ini_text=ini, name="shipped") as b:
        servers = f"meta://{b.host}:{b.port}"
        ex.ship(servers, 600, seed=1)
        ex.pipeline(spark, servers, tmp_path / "out")
        printed = capsys.readouterr().out
        assert "per-minute aggregates in" in printed and "|minute" in printed
        table = spark.read.parquet(str(tmp_path / "out" / "minutes.parquet")).collect()
        reader = (
            spark.read.format("pymetaq")
            .option("pymetaq.servers", servers)
            .option("subscribe", "log-minutes")
        )

        # log-* topics run in threshold mode on the shipped configuration: readers see the
        # committed messages after the next flush (unflushInterval, 10 s)
        def readable() -> list[Any] | None:
            rows: list[Any] = reader.load().collect()
            return rows if len(rows) >= len(table) > 0 else None

        topic = wait_for(readable, 30, "the aggregates readable in log-minutes") or []
    # the topic holds each emitted (minute, status) once, equal to the Parquet rows
    from_topic = sorted(tuple(json.loads(r.value).values()) for r in topic)
    from_parquet = sorted((r.minute, r.status, r.requests, r.bytes) for r in table)
    assert from_topic == from_parquet and from_parquet
    assert len({(m, s) for m, s, _, _ in from_topic}) == len(from_topic)
    # 600 lines over 5 minutes; the watermark holds back only the newest minute(s)
    assert 300 <= sum(r[2] for r in from_topic) < 600
    assert {s for _, s, _, _ in from_topic} <= {"2xx", "3xx", "4xx", "5xx"}
