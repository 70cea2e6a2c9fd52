"""docs/replication.md's walkthroughs run as written and print what the page shows:
``examples/replication_walkthrough.sh`` (a master with an asynchronous slave in a real
ZooKeeper, then a samsa/gregor pair) and ``examples/failover_walkthrough.sh`` (a pair with
ZooKeeper: the master hung, the slave promoted, the old master rejoining it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import _docs
from tests._helpers import free_port

pytestmark = [pytest.mark.zk, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
SHOWN_PORTS = ("18300", "18301", "18302", "18303")


def test_walkthrough_runs_as_shown(tmp_path: Path, zk_hosts: str) -> None:
    fix = {"127.0.0.1:2181": zk_hosts}
    for shown in SHOWN_PORTS:
        fix[shown] = str(free_port())  # five digits both: the tables keep their widths
    assert all(len(fix[p]) == 5 for p in SHOWN_PORTS)
    page = ROOT / "docs" / "replication.md"
    _docs.run_walkthrough(page, "docs/replication.md", "replication_walkthrough.sh", tmp_path, fix)


def test_failover_walkthrough_runs_as_shown(tmp_path: Path, zk_hosts: str) -> None:
    fix = {"127.0.0.1:2181": zk_hosts}
    for shown in ("18310", "18311"):
        fix[shown] = str(free_port())
    assert all(len(fix[p]) == 5 for p in ("18310", "18311"))
    page = ROOT / "docs" / "replication.md"
    _docs.run_walkthrough(page, "docs/replication.md", "failover_walkthrough.sh", tmp_path, fix)
