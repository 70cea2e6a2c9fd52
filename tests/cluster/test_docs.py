"""docs/cluster.md's examples run as written against real brokers registered in a real
ZooKeeper, and print what the page shows: the two Python examples (two brokers started here) and
the walkthrough (``examples/cluster_walkthrough.sh``: three brokers, a consumer group, a broker
killed and restarted)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import _docs
from tests._broker import BrokerProcess
from tests._helpers import free_port, wait_for
from tests._services import ZooKeeperServer

pytestmark = [pytest.mark.zk, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]


def two_brokers(
    stack: contextlib.ExitStack, tmp_path: Path, zk_hosts: str, zk: Any, partitions: int
) -> list[BrokerProcess]:
    """Brokers 0 and 1 registered under ``zk_hosts`` (a chroot), each with ``orders``."""
    zk_keys = {"zk.zkEnable": "true", "zk.zkConnect": zk_hosts, "zk.zkSyncTimeMs": 100}
    brokers = [
        stack.enter_context(
            BrokerProcess.start(
                tmp_path,
                name=f"b{i}",
                system={"brokerId": i},
                topics={"orders": {"numPartitions": partitions}},
                zookeeper=zk_keys,
            )
        )
        for i in range(2)
    ]

    def registered() -> bool:
        sides = ("topics-pub", "topics-sub")
        return all(len(zk.get_children(f"/meta/brokers/{s}/orders")) == 2 for s in sides)

    wait_for(registered, 30, "both brokers registered orders")
    return brokers


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_cluster_example_runs(
    tmp_path: Path, zk_server: ZooKeeperServer, zk_hosts: str, zk: Any
) -> None:
    text = (ROOT / "docs" / "cluster.md").read_text(encoding="utf-8")
    section = text[text.index("## Using the components") :]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    chroot = zk_hosts[len(zk_server.hosts) :]
    # the brokers' zk.zkConnect carries the chroot; the client URL names the same tree as root
    code = code.replace("zk://127.0.0.1:2181/meta", f"zk://{zk_server.hosts}{chroot}/meta")
    with contextlib.ExitStack() as stack:
        brokers = two_brokers(stack, tmp_path, zk_hosts, zk, 3)
        r = run_python(code, tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    urls = [f"meta://{b.host}:{b.port}" for b in brokers]
    assert lines[:6] == [f"send to {b}-{p} at {urls[b]}" for b in range(2) for p in range(3)]
    first, second = "['0-0', '0-1', '0-2', '1-0', '1-1', '1-2']", "['1-0', '1-1', '1-2']"
    a = [x for x in lines[6:] if x.startswith("a ")]
    assert a == [
        f"a assigned {first}",
        f"a revoked {second}",
        f"a assigned {second}",
        f"a revoked {first}",
    ]
    b_lines = [x for x in lines[6:] if x.startswith("b ")]
    assert b_lines[-1] == f"b revoked {second}"
    got = sorted(p for x in b_lines[:-1] for p in re.findall(r"'(\d-\d)'", x))
    assert got == ["1-0", "1-1", "1-2"] and all("assigned" in x for x in b_lines[:-1])


def test_running_a_cluster_python_example_runs(
    tmp_path: Path, zk_server: ZooKeeperServer, zk_hosts: str, zk: Any
) -> None:
    text = (ROOT / "docs" / "cluster.md").read_text(encoding="utf-8")
    section = text[text.index("## Running a cluster") : text.index("## Using the components")]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    chroot = zk_hosts[len(zk_server.hosts) :]
    code = code.replace("zk://127.0.0.1:2181", f"zk://{zk_server.hosts}{chroot}/meta")
    with contextlib.ExitStack() as stack:
        two_brokers(stack, tmp_path, zk_hosts, zk, 2)
        r = run_python(code, tmp_path)
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.splitlines()
    assert re.fullmatch(r"[01]-[01] 0 b'order-25'", line), line


def test_walkthrough_runs_as_shown(
    tmp_path: Path, zk_server: ZooKeeperServer, zk_hosts: str
) -> None:
    chroot = zk_hosts[len(zk_server.hosts) :]
    fix = {"127.0.0.1:2181": zk_hosts, "ZooKeeper root /meta": f"ZooKeeper root {chroot}/meta"}
    for shown in ("18200", "18201", "18202"):
        fix[shown] = str(free_port())  # five digits both: the tables keep their widths
    assert all(len(fix[p]) == 5 for p in ("18200", "18201", "18202"))
    page = ROOT / "docs" / "cluster.md"
    _docs.run_walkthrough(page, "docs/cluster.md", "cluster_walkthrough.sh", tmp_path, fix)
