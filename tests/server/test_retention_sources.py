"""Where ``deletePolicy=consumed`` reads committed offsets (server/retention.py): the SQL table
that SqlOffsetStore writes (SQLite here; PostgreSQL in test_consumed_retention.py) and MetaQ's
ZooKeeper layout (real ZooKeeper), with ``*``, named groups, missing offsets and failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pymetaq.offsets import OffsetEntry, SqlOffsetStore, ZkOffsetStore
from pymetaq.server.config import parse_config
from pymetaq.server.retention import SqlProgress, ZkProgress


def _commit(store: Any) -> None:
    store.commit("fast", [OffsetEntry("t", "3-0", 900), OffsetEntry("t", "3-1", 40)])
    store.commit("slow", [OffsetEntry("t", "3-1", 20)])  # nothing of partition 0
    store.commit("other", [OffsetEntry("u", "3-0", 5)])  # another topic only
    store.commit("elsewhere", [OffsetEntry("t", "4-0", 7)])  # another broker's partition


def test_sql_source(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    store = SqlOffsetStore(url)
    _commit(store)
    store.close()
    src = SqlProgress(url, "meta_topic_partition_group_offset", broker_id=3)
    try:
        assert src.committed("t", 0, None) == {"elsewhere": None, "fast": 900, "slow": None}
        assert src.committed("t", 1, ("slow", "fast", "new")) == {
            "slow": 20,
            "fast": 40,
            "new": None,
        }
        assert src.committed("v", 0, None) == {}
    finally:
        src.close()
    missing = SqlProgress(url, "no_such_table", broker_id=3)
    with pytest.raises(Exception, match="no_such_table"):
        missing.committed("t", 0, None)
    missing.close()


class _Registry:
    def __init__(self, client: Any) -> None:
        self.client = client


def test_zookeeper_source(zk_hosts: str) -> None:
    store = ZkOffsetStore(zk_hosts, root="/meta")
    try:
        _commit(store)
        store.client.create("/meta/consumers/legacy/offsets/t/3-0", b"512", makepath=True)
        cfg = parse_config(
            f"[system]\nbrokerId=3\n[zookeeper]\nzk.zkConnect={zk_hosts}\n[topic=t]\n",
            cwd="/tmp",
        )
        src = ZkProgress(cfg, lambda: _Registry(store.client))
        assert src.committed("t", 0, None) == {
            "elsewhere": None,
            "fast": 900,
            "legacy": 512,  # MetaQ before 1.4 wrote the bare offset
            "slow": None,
        }
        assert src.committed("t", 1, ("slow", "nobody")) == {"slow": 20, "nobody": None}
        store.client.set("/meta/consumers/legacy/offsets/t/3-0", b"garbage")
        with pytest.raises(ValueError):
            src.committed("t", 0, ("legacy",))
    finally:
        store.close()
    with pytest.raises(ConnectionError, match="not connected"):
        src.committed("t", 0, ("fast",))  # the session is gone: never an empty answer
