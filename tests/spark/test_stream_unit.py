"""The streaming reader's offset decisions, without Spark or a broker (a fake metadata
client): new partitions start at their first offset, ``availableNow`` never goes past its
snapshot, a vanished partition is a data loss (or dropped), limits are honoured and lifted by
``ReadAllAvailable``."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

from pymetaq.client.types import TopicPartition
from pymetaq.offsets import FileOffsetStore
from pymetaq.spark.batch_reader import RangePartition
from pymetaq.spark.offsets import DataLoss
from pymetaq.spark.options import read_options
from pymetaq.spark.stream_reader import StreamReader

A0, A1 = TopicPartition("a", 0, 0), TopicPartition("a", 0, 1)


class FakeBrokers:
    """Partitions and bounds the test sets; record boundaries every 10 bytes."""

    def __init__(self, bounds: dict[TopicPartition, tuple[int, int]]) -> None:
        self.bounds_of = bounds

    def subscribed(self, sub: Any) -> list[TopicPartition]:
        return sorted(self.bounds_of)

    def bounds(self, tp: TopicPartition) -> tuple[int, int]:
        return self.bounds_of[tp]


def reader(fake: FakeBrokers, **opts: str) -> StreamReader:
    options = {"pymetaq.servers": "meta://127.0.0.1:1", "subscribe": "a", **opts}
    r = StreamReader(read_options(options, streaming=True))
    r._brokers = fake  # type: ignore[assignment]
    return r


def test_new_partitions_start_at_their_first_offset_and_latest_is_canonical():
    fake = FakeBrokers({A0: (0, 100)})
    r = reader(fake, startingOffsets="earliest")
    start = r.initialOffset()
    assert start == {"a": {"0-0": 0}}
    fake.bounds_of[A1] = (40, 70)  # a new partition (retention already cut its head)
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"a": {"0-0": 100, "0-1": 70}} and list(end["a"]) == ["0-0", "0-1"]
    parts = [p for p in r.partitions(start, end) if isinstance(p, RangePartition)]
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 0, 100), (1, 40, 70)]


def test_available_now_never_passes_its_snapshot():
    fake = FakeBrokers({A0: (0, 100)})
    r = reader(fake, startingOffsets="earliest")
    r.prepareForTriggerAvailableNow()
    fake.bounds_of[A0] = (0, 500)
    fake.bounds_of[A1] = (0, 30)  # appeared after the snapshot: waits for the next run
    assert r.latestOffset({"a": {"0-0": 0}}, ReadAllAvailable()) == {"a": {"0-0": 100, "0-1": 0}}
    assert r.reportLatestOffset() == {"a": {"0-0": 500, "0-1": 30}}


def test_a_vanished_partition_is_a_data_loss_unless_told_otherwise():
    fake = FakeBrokers({A0: (0, 100)})
    with pytest.raises(DataLoss, match="partitions a/0-1 are gone"):
        reader(fake).latestOffset({"a": {"0-0": 0, "0-1": 5}}, ReadAllAvailable())
    got = reader(fake, failOnDataLoss="false").latestOffset(
        {"a": {"0-0": 0, "0-1": 5}}, ReadAllAvailable()
    )
    assert got == {"a": {"0-0": 100}}


def test_default_read_limit_follows_the_options():
    fake = FakeBrokers({A0: (0, 100)})
    assert isinstance(reader(fake).getDefaultReadLimit(), ReadAllAvailable)
    limit = reader(fake, maxBytesPerTrigger="64").getDefaultReadLimit()
    assert isinstance(limit, ReadMaxBytes) and limit.max_bytes == 64
    assert reader(fake, maxOffsetsPerTrigger="5").getDefaultReadLimit().max_rows == 5  # type: ignore[attr-defined]


def test_commit_records_the_end_under_group_id(tmp_path: Path):
    store = tmp_path / "offsets.json"
    r = reader(FakeBrokers({A0: (0, 100)}), groupId="etl", offsetStore=f"file:{store}")
    r.commit({"a": {"0-0": 40, "0-1": 7}})
    r.commit({"a": {"0-0": 90, "0-1": 7}})
    got = FileOffsetStore(store).load_all("etl")
    assert sorted((e.topic, e.partition, e.offset) for e in got) == [
        ("a", "0-0", 90),
        ("a", "0-1", 7),
    ]
    assert pickle.loads(pickle.dumps(r))._store is None  # the store stays on the driver
    reader(FakeBrokers({A0: (0, 100)})).commit({"a": {"0-0": 40}})  # no groupId: nothing


def test_a_failing_group_commit_is_logged_and_the_query_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    r = reader(FakeBrokers({A0: (0, 100)}), groupId="etl", offsetStore=f"file:{blocker}/x.json")
    with caplog.at_level(logging.WARNING, logger="pymetaq.spark.stream_reader"):
        r.commit({"a": {"0-0": 40}})
    assert "groupId etl: committing" in caplog.text
