"""Byte-level formats: MetaQ's LocalOffsetStorage JSON, the SQL table, ZooKeeper values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from pymetaq.offsets import (
    CorruptOffsetData,
    FileOffsetStore,
    OffsetEntry,
    SqlOffsetStore,
    open_offset_store,
    split_partition_key,
)
from pymetaq.offsets.zk import decode_value, encode_value


def test_file_store_writes_metaq_local_offset_json(tmp_path: Path) -> None:
    path = tmp_path / "meta_offsets"
    store = FileOffsetStore(path)
    store.commit("grp", [OffsetEntry("topic-a", "2-5", 4096, 77), OffsetEntry("b", "0-0", 0)])
    assert json.loads(path.read_text()) == {
        "grp": [
            {"topic": "b", "partition": {"brokerId": 0, "partition": 0}, "offset": 0, "msgId": -1},
            {
                "topic": "topic-a",
                "partition": {"brokerId": 2, "partition": 5},
                "offset": 4096,
                "msgId": 77,
            },
        ]
    }
    # no temp files left behind by the atomic rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta_offsets", "meta_offsets.lock"]


def test_file_store_reads_a_metaq_written_file(tmp_path: Path) -> None:
    path = tmp_path / "meta_offsets"
    path.write_text('{"g":[{"topic":"t","partition":{"brokerId":1,"partition":3},"offset":99}]}')
    assert FileOffsetStore(path).load("g", "t", "1-3") == OffsetEntry("t", "1-3", 99, -1)


def test_file_store_keeps_the_old_file_when_a_write_fails(tmp_path: Path) -> None:
    path = tmp_path / "meta_offsets"
    store = FileOffsetStore(path)
    store.commit("g", [OffsetEntry("t", "0-0", 10)])
    before = path.read_bytes()
    with pytest.raises(ValueError):
        store.commit("g", [OffsetEntry("t", "not-a-key", 20)])
    assert path.read_bytes() == before


def test_file_store_corrupt_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "meta_offsets"
    path.write_text("{not json")
    with pytest.raises(CorruptOffsetData):
        FileOffsetStore(path).load("g", "t", "0-0")


def test_sql_table_layout(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    store = SqlOffsetStore(url)
    store.commit("g", [OffsetEntry("t", "1-2", 333, 44)])
    eng = sa.create_engine(url)
    with eng.connect() as c:
        row = c.exec_driver_sql(
            'SELECT topic, partition, group_id, "offset", msg_id, updated_at IS NOT NULL '
            "FROM meta_topic_partition_group_offset"
        ).one()
        journal = c.exec_driver_sql("PRAGMA journal_mode").scalar()
    eng.dispose()
    store.close()
    assert tuple(row) == ("t", "1-2", "g", 333, 44, 1)
    assert journal == "wal"


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [(b"42-1024", (42, 1024)), (b"-1-1024", (-1, 1024)), (b"1024", (-1, 1024))],
)
def test_zk_value_parses_at_the_last_dash(raw: bytes, parsed: tuple[int, int]) -> None:
    assert decode_value(raw) == parsed


def test_zk_value_encoding() -> None:
    assert encode_value(OffsetEntry("t", "0-1", 1024, 42)) == b"42-1024"
    assert encode_value(OffsetEntry("t", "0-1", 7)) == b"-1-7"
    with pytest.raises(CorruptOffsetData):
        decode_value(b"abc-def")


def test_partition_key_parsing() -> None:
    assert split_partition_key("12-3") == (12, 3)
    with pytest.raises(ValueError):
        split_partition_key("3")


def test_open_offset_store_rejects_unknown_scheme() -> None:
    with pytest.raises(ValueError):
        open_offset_store("redis://x")


@pytest.mark.zk
def test_zk_store_uses_metaq_paths_and_values(zk_hosts: str) -> None:
    from kazoo.client import KazooClient

    store = open_offset_store("zk://" + zk_hosts + "/meta")
    store.commit("grp", [OffsetEntry("topic", "0-1", 2048, 42)])
    store.close()
    client = KazooClient(hosts=zk_hosts)
    client.start(timeout=10)
    try:
        raw, _ = client.get("/meta/consumers/grp/offsets/topic/0-1")
        assert raw == b"42-2048"
        client.create("/meta/consumers/grp/offsets/topic/0-2", b"512")  # pre-1.4 value
    finally:
        client.stop()
        client.close()
    store = open_offset_store("zk://" + zk_hosts + "/meta")
    try:
        assert store.load("grp", "topic", "0-2") == OffsetEntry("topic", "0-2", 512, -1)
    finally:
        store.close()
