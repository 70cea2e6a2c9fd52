"""The group coordinator against a real ZooKeeper, members as threads of this process.

Multi-process scenarios (SIGKILL, forced expiry, ZooKeeper restart) are in
``test_group_processes.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pymetaq.client.cluster.errors import MembershipConflict
from pymetaq.client.cluster.group import (
    GroupConfig,
    GroupCoordinator,
    make_consumer_id,
)
from pymetaq.client.protocol.zk import TopicBroker, ZkPaths
from pymetaq.client.types import TopicPartition
from tests._helpers import wait_for
from tests._services import ZooKeeperServer
from tests.cluster.conftest import expire_session, new_client

pytestmark = [pytest.mark.zk, pytest.mark.integration]
P = ZkPaths()


def publish_partitions(zk: Any, topic: str, layout: dict[int, int]) -> None:
    """topics-sub entries as brokers register them: {brokerId: numPartitions}."""
    for broker, n in layout.items():
        zk.create(
            P.topic_sub(topic, f"{broker}-m"),
            TopicBroker(n, f"{broker}-m").encode(),
            ephemeral=True,
            makepath=True,
        )


class Member:
    """A coordinator plus a log of its callbacks: (time, member, event, partitions)."""

    def __init__(self, client: Any, config: GroupConfig, log: list[tuple[Any, ...]], **kw: Any):
        self.log = log
        self.revoke_delay = kw.pop("revoke_delay", 0.0)
        self.fail_assign = kw.pop("fail_assign", 0)
        self.client = client
        self.coord = GroupCoordinator(
            client, config, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lost
        )

    def _rec(self, ev: str, parts: frozenset[TopicPartition]) -> None:
        self.log.append((time.monotonic(), self.coord.me, ev, parts))

    def _assign(self, parts: frozenset[TopicPartition]) -> None:
        if self.fail_assign:
            self.fail_assign -= 1
            raise RuntimeError("offset store down")
        self._rec("assign", parts)

    def _revoke(self, parts: frozenset[TopicPartition]) -> None:
        self._rec("revoke", parts)
        time.sleep(self.revoke_delay)  # the consumer committing offsets
        self._rec("revoked", parts)

    def _lost(self, parts: frozenset[TopicPartition]) -> None:
        self._rec("lost", parts)

    def held(self) -> set[str]:
        return {f"{tp.topic}:{tp.key}" for tp in self.coord.assignment}


@pytest.fixture
def group(zk_hosts: str) -> Iterator[Callable[..., Member]]:
    made: list[Member] = []
    log: list[tuple[Any, ...]] = []

    def make(name: str, topics: tuple[str, ...] = ("t",), **kw: Any) -> Member:
        client = kw.pop("client", None) or new_client(zk_hosts, kw.pop("session_timeout_s", 4.0))
        cfg = GroupConfig(
            "g",
            make_consumer_id("g", name),
            topics,
            strategy=kw.pop("strategy", "DEFAULT"),
            broadcast=kw.pop("broadcast", False),
            retry_delay_ms=200,
        )
        m = Member(client, cfg, log, **kw)
        made.append(m)
        return m

    make.log = log  # type: ignore[attr-defined]
    yield make
    for m in made:
        m.coord.stop(10)
        m.client.stop()
        m.client.close()


def owners(zk: Any, topic: str = "t") -> dict[str, str]:
    from kazoo.exceptions import NoNodeError

    out = {}
    try:
        for name in zk.get_children(P.owners("g", topic)):
            try:
                out[name] = zk.get(P.owner("g", topic, name))[0].decode()
            except NoNodeError:
                pass
    except NoNodeError:
        pass
    return out


def test_registers_and_claims_metaq_nodes(zk: Any, group: Callable[..., Member]) -> None:
    publish_partitions(zk, "a", {0: 2, 1: 1})
    publish_partitions(zk, "b", {0: 1})
    m = group("c1", topics=("a", "b"))
    m.coord.start()
    wait_for(m.coord.settled, what="settled")
    assert zk.get(P.consumer_id("g", "g_c1"))[0] == b"a,b"
    assert zk.exists(P.consumer_id("g", "g_c1")).ephemeralOwner == m.client.client_id[0]
    assert owners(zk, "a") == {"0-0": "g_c1", "0-1": "g_c1", "1-0": "g_c1"}
    assert owners(zk, "b") == {"0-0": "g_c1"}
    assert m.held() == {"a:0-0", "a:0-1", "a:1-0", "b:0-0"}
    assert m.coord.may_deliver(TopicPartition("a", 1, 0))
    assert not m.coord.may_deliver(TopicPartition("a", 1, 1))
    view = m.coord.view("a")
    assert view is not None and view.partition_names == ["0-0", "0-1", "1-0"]


def test_claims_only_after_the_old_owner_node_is_gone(
    zk: Any, clients: Callable[..., Any], group: Callable[..., Member]
) -> None:
    publish_partitions(zk, "t", {0: 3})
    zombie = clients()
    zombie.create(P.owner("g", "t", "0-1"), b"g_old", ephemeral=True, makepath=True)
    m = group("c1")
    m.coord.start()
    wait_for(lambda: m.held() == {"t:0-0", "t:0-2"}, what="free partitions claimed")
    assert m.coord.stats()["pending"] == [TopicPartition("t", 0, 1)]
    assert not m.coord.settled() and owners(zk)["0-1"] == "g_old"
    zombie.delete(P.owner("g", "t", "0-1"))
    t0 = time.monotonic()
    wait_for(m.coord.settled, what="claimed after release")
    assert time.monotonic() - t0 < 2.0  # a watch, not the 200 ms retry loop alone
    assert owners(zk) == {"0-0": "g_c1", "0-1": "g_c1", "0-2": "g_c1"}


def test_fenced_hand_off_between_two_members(zk: Any, group: Callable[..., Member]) -> None:
    publish_partitions(zk, "t", {0: 4, 1: 2})
    a = group("a", revoke_delay=0.5)
    a.coord.start()
    wait_for(a.coord.settled, what="a holds all")
    b = group("b")
    b.coord.start()
    wait_for(lambda: a.coord.settled() and b.coord.settled(), what="split")
    # DEFAULT over sorted ["0-0","0-1","0-2","0-3","1-0","1-1"]: a first three, b the rest
    assert a.held() == {"t:0-0", "t:0-1", "t:0-2"} and b.held() == {"t:0-3", "t:1-0", "t:1-1"}
    log = group.log  # type: ignore[attr-defined]
    revoked_done = next(t for t, who, ev, _ in log if who == "g_a" and ev == "revoked")
    b_assign = [(t, parts) for t, who, ev, parts in log if who == "g_b" and ev == "assign"]
    moved = {TopicPartition("t", 0, 3), TopicPartition("t", 1, 0), TopicPartition("t", 1, 1)}
    assert set().union(*(p for _, p in b_assign)) == moved
    for t, _parts in b_assign:
        assert t >= revoked_done, "b delivered before a finished revoking"
    # a was never interrupted for the partitions it kept
    a_events = [(ev, parts) for _, who, ev, parts in log if who == "g_a"]
    assert [ev for ev, _ in a_events] == ["assign", "revoke", "revoked"]
    assert a_events[1][1] == moved


def test_leave_deletes_the_ids_node_before_revoking(zk: Any, group: Callable[..., Member]) -> None:
    publish_partitions(zk, "t", {0: 2})
    a, b = group("a"), group("b")
    a.coord.start()
    b.coord.start()
    wait_for(lambda: a.coord.settled() and b.coord.settled(), what="split")
    seen: list[Any] = []
    a.coord.on_revoke = lambda parts: seen.append(zk.exists(P.consumer_id("g", "g_a")))
    a.coord.stop()
    assert seen == [None]
    wait_for(lambda: b.held() == {"t:0-0", "t:0-1"} and b.coord.settled(), what="b took over")
    assert owners(zk) == {"0-0": "g_b", "0-1": "g_b"}


def test_topics_sub_changes_rebalance(zk: Any, group: Callable[..., Member]) -> None:
    publish_partitions(zk, "t", {0: 1})
    a, b = group("a"), group("b")
    a.coord.start()
    b.coord.start()
    wait_for(lambda: a.held() == {"t:0-0"} and b.coord.settled(), what="one partition")
    publish_partitions(zk, "t", {1: 3})
    wait_for(
        lambda: a.held() == {"t:0-0", "t:1-0"} and b.held() == {"t:1-1", "t:1-2"},
        what="new broker's partitions assigned",
    )


def test_broadcast_members_get_everything_without_owner_nodes(
    zk: Any, group: Callable[..., Member]
) -> None:
    publish_partitions(zk, "t", {0: 2})
    a, b = group("a", broadcast=True), group("b", broadcast=True)
    a.coord.start()
    b.coord.start()
    wait_for(lambda: a.coord.settled() and b.coord.settled(), what="both settled")
    assert a.held() == b.held() == {"t:0-0", "t:0-1"}
    assert not zk.exists(P.owners("g"))


def test_a_failing_on_assign_releases_and_retries(zk: Any, group: Callable[..., Member]) -> None:
    publish_partitions(zk, "t", {0: 1})
    m = group("a", fail_assign=2)
    m.coord.start()
    wait_for(m.coord.settled, what="assigned on the third try")
    assert m.held() == {"t:0-0"} and m.coord.rounds >= 3


def test_a_live_duplicate_consumer_id_is_refused(group: Callable[..., Member]) -> None:
    a = group("same")
    a.coord.start()
    b = group("same")
    with pytest.raises(MembershipConflict, match="already registered in group 'g'"):
        b.coord.start(timeout=0.5)


def test_session_loss_stops_delivery_at_once(
    zk_server: ZooKeeperServer, zk: Any, group: Callable[..., Member]
) -> None:
    publish_partitions(zk, "t", {0: 2})
    m = group("a", session_timeout_s=2.0)
    m.coord.start()
    wait_for(m.coord.settled, what="settled")
    before = m.client.client_id
    stopped = threading.Event()
    m.client.add_listener(lambda s: stopped.set() if s != "CONNECTED" else None)
    expire_session(zk_server, m.client)
    wait_for(stopped.is_set, what="state change seen")
    wait_for(lambda: not m.coord.may_deliver(TopicPartition("t", 0, 0)), timeout_s=1, what="stop")
    wait_for(lambda: m.client.client_id != before and m.coord.settled(), what="back")
    events = [ev for _, _, ev, _ in group.log]  # type: ignore[attr-defined]
    assert events == ["assign", "lost", "assign"]
    assert zk.exists(P.consumer_id("g", "g_a")).ephemeralOwner == m.client.client_id[0]
    assert owners(zk) == {"0-0": "g_a", "0-1": "g_a"}


def test_group_config_validation() -> None:
    with pytest.raises(ValueError, match="forbids"):
        GroupConfig("bad group", "x", ("t",))
    with pytest.raises(ValueError, match="at least one topic"):
        GroupConfig("g", "g_x", ())
    with pytest.raises(ValueError, match="unknown assignment strategy"):
        GroupConfig("g", "g_x", ("t",), strategy="nope")
    with pytest.raises(ValueError):
        GroupConfig("g", "g_x", ("a,b",))
    cfg = GroupConfig("g", "g_x", ("b", "a", "b"), strategy="consist")
    assert cfg.topics == ("b", "a") and cfg.assignor.name == "CONSIST"
    assert make_consumer_id("g", "x") == "g_x" and make_consumer_id("g").startswith("g_")
