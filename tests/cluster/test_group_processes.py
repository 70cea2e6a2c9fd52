"""Consumer-group members as real processes on a real ZooKeeper: join, leave, SIGKILL, forced
session expiry, a broker appearing, ZooKeeper restarted.  After every step the group settles on
the expected assignment, and over the whole history no partition was ever delivered by two
members at once (each member logs when it starts and stops delivering; a SIGKILLed member's
deliveries end when the process is reaped)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.cluster.assignors import get_assignor
from pymetaq.client.protocol.zk import TopicBroker, ZkPaths
from tests._helpers import wait_for
from tests._services import ZooKeeperServer, expire_session_id
from tests.cluster._procs import (
    MemberProcess,
    OwnerHistory,
    members,
    overlaps,
    owners,
    settled,
)
from tests.cluster.conftest import new_client

pytestmark = [pytest.mark.zk, pytest.mark.crash, pytest.mark.integration]
P = ZkPaths()
SESSION_S = 2.0


def publish(zk: Any, topic: str, layout: dict[int, int]) -> None:
    for broker, n in layout.items():
        zk.create(
            P.topic_sub(topic, f"{broker}-m"), TopicBroker(n, f"{broker}-m").encode(), makepath=True
        )


def parts_of(layout: dict[int, int]) -> list[str]:
    return [f"{b}-{p}" for b, n in layout.items() for p in range(n)]


class Scenario:
    def __init__(self, hosts: str, zk: Any, workdir: Path, strategy: str) -> None:
        self.hosts, self.zk, self.workdir, self.strategy = hosts, zk, workdir, strategy
        self.all: list[MemberProcess] = []
        self.live: list[MemberProcess] = []
        self.layout: dict[int, int] = {}
        self.timings: dict[str, float] = {}

    def member(self, name: str) -> MemberProcess:
        m = MemberProcess(
            self.hosts, "g", name, "t", self.workdir, strategy=self.strategy,
            session_timeout_s=SESSION_S,
        )  # fmt: skip
        self.all.append(m)
        self.live.append(m)
        return m.start()

    def settle(self, what: str, since: float) -> None:
        parts = parts_of(self.layout)
        assignor = get_assignor(self.strategy)
        expect = None
        if not assignor.uses_owners:
            expect = assignor.assign([m.cid for m in self.live], parts, {})
        wait_for(
            lambda: settled(self.zk, "g", "t", self.live, parts, expect),
            timeout_s=30,
            what=f"{what}: settled (members {members(self.zk, 'g')}, "
            f"owners {owners(self.zk, 'g', 't')}, held {[m.held() for m in self.live]})",
        )
        self.timings[what] = time.monotonic() - since
        assert overlaps(self.all) == []


@pytest.fixture
def scenario(
    request: pytest.FixtureRequest, zk_hosts: str, zk: Any, tmp_path: Path
) -> Iterator[Scenario]:
    s = Scenario(zk_hosts, zk, tmp_path, request.param)
    try:
        yield s
    finally:
        for m in s.all:
            m.cleanup()
        print(f"\n[rebalance {request.param}, session {SESSION_S} s] " + ", ".join(
            f"{k}: {v:.2f} s" for k, v in s.timings.items()
        ))  # fmt: skip


@pytest.mark.parametrize("scenario", ["DEFAULT", "STICKY"], indirect=True)
def test_join_leave_crash_expiry_and_new_partitions(
    scenario: Scenario, zk: Any, zk_server: ZooKeeperServer
) -> None:
    s = scenario
    s.layout = {0: 4, 1: 4, 2: 4}
    publish(zk, "t", s.layout)
    history = OwnerHistory(s.hosts, "g", "t").start()
    t0 = time.monotonic()
    for name in ("a", "b", "c"):
        s.member(name)
    s.settle("start", t0)

    t0 = time.monotonic()
    d = s.member("d")
    s.settle("join", t0)
    assert d.held()

    b = next(m for m in s.live if m.cid == "g_b")
    t0 = time.monotonic()
    s.live.remove(b)
    assert b.terminate() == 0
    s.settle("leave", t0)

    c = next(m for m in s.live if m.cid == "g_c")
    t0 = time.monotonic()
    s.live.remove(c)
    c.kill()
    s.settle("sigkill", t0)  # after the session expires on the server

    a = next(m for m in s.live if m.cid == "g_a")
    sid, pwd = a.session()
    t0 = time.monotonic()
    expire_session_id(zk_server.hosts, sid, pwd)
    wait_for(lambda: a.session()[0] != sid, what="a has a new session")
    s.settle("expiry", t0)
    evs = [e["ev"] for e in a.events()]
    assert "lost" in evs and evs.count("session") == 2

    t0 = time.monotonic()
    publish(zk, "t", {3: 3})
    s.layout[3] = 3
    s.settle("new broker", t0)

    for m in list(s.live):
        assert m.terminate() == 0
    s.live.clear()
    wait_for(lambda: not owners(zk, "g", "t") and not members(zk, "g"), what="all left")
    history.stop()
    assert overlaps(s.all) == []
    # the owner nodes as an outside observer read them agree with every delivery period
    two_owners, unowned = history.violations(s.all)
    assert two_owners == []
    print(f"\n[owner history] {len(history.reads)} reads, unowned-while-delivering: {unowned}")
    assert history.handoffs() >= 4 and len(history.reads) > 1000


def test_zookeeper_restart_under_members(private_zk: ZooKeeperServer, tmp_path: Path) -> None:
    admin = new_client(private_zk.hosts, session_timeout_s=10.0)
    layout = {0: 3, 1: 3}
    publish(admin, "t", layout)
    s = Scenario(private_zk.hosts, admin, tmp_path, "DEFAULT")
    s.layout = layout
    try:
        t0 = time.monotonic()
        for name in ("a", "b", "c"):
            s.member(name)
        s.settle("start", t0)
        down = time.monotonic()
        private_zk.stop(keep_data=True)
        wait_for(
            lambda: all("lost" in [e["ev"] for e in m.events() if e["t"] > down] for m in s.live),
            what="every member stopped delivering while ZooKeeper is down",
        )
        assert all(not m.held() for m in s.live)
        private_zk.start()
        wait_for(lambda: admin.connected, what="admin reconnected")
        s.settle("zookeeper restart", down)
        assert overlaps(s.all) == []
    finally:
        for m in s.all:
            m.cleanup()
        with contextlib.suppress(Exception):
            admin.stop()
        admin.close()
