"""docs/replication.md's walkthrough (``examples/replication_walkthrough.sh``: a master with an
asynchronous slave in a real ZooKeeper, then a samsa/gregor pair) runs as written and prints
what the page shows."""

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
