"""``zk://`` producers and consumer groups on a real cluster: a real ZooKeeper, three broker
processes and consumer *processes* (``Consumer("zk://...", group)``, listener mode).

The group test walks through a member joining, a member leaving, a member SIGKILLed (its
partitions move once its session expires), a broker SIGKILLed (the producer carries on through
the others; the group drops the broker's partitions, then takes them up again from their
committed offsets when it returns), a live member's session expired (kazoo's same-session-id
trick) and ZooKeeper restarted, all under a steady producer.  After every step the group
settles on MetaQ's DEFAULT assignment.  Then, over the whole history (each member logs every
delivery and when it took and gave up each partition; an outside client reads the owner
nodes in a loop): nothing acknowledged was lost, no partition was processed by two members at
once, and every message delivered twice was first delivered by a member that died or lost its
session before committing it (those are counted and printed).

``test_seeded_rounds`` (slow) repeats random events from a printed seed.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.errors import UnknownTopicOrPartition
from pymetaq.client.producer.sync import Producer
from pymetaq.client.protocol.zk import ZkPaths
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import ZooKeeperServer, expire_session_id
from tests.cluster._procs import OwnerHistory
from tests.cluster._workload import (
    ConsumerMember,
    History,
    LoadProducer,
    check_history,
    group_settled,
    owners,
    partitions,
)
from tests.cluster.conftest import new_client

pytestmark = [pytest.mark.zk, pytest.mark.crash, pytest.mark.integration]

P = ZkPaths()
SESSION_MS = 2000
PARTS = 4  # per broker


class Cluster:
    """Three brokers registered in ``zk``, a group of consumer processes, a producer."""

    def __init__(self, zk_server: ZooKeeperServer, tmp_path: Path) -> None:
        self.zk_server = zk_server
        self.url = f"zk://{zk_server.hosts}/meta"
        self.tmp = tmp_path
        self.admin = new_client(zk_server.hosts, session_timeout_s=10.0)
        self.brokers: list[BrokerProcess] = []
        self.all: list[ConsumerMember] = []
        self.live: list[ConsumerMember] = []
        self.load: LoadProducer | None = None
        self.timings: dict[str, float] = {}

    def start_brokers(self, n: int = 3) -> None:
        keys = {
            "zk.zkEnable": "true",
            "zk.zkConnect": self.zk_server.hosts,
            "zk.zkSessionTimeoutMs": SESSION_MS,
            "zk.zkConnectionTimeoutMs": 20000,
            "zk.zkSyncTimeMs": 200,
        }
        for i in range(n):
            self.brokers.append(
                BrokerProcess.start(
                    self.tmp,
                    name=f"broker{i}",
                    system={"brokerId": i, "hostName": "127.0.0.1"},
                    topics={"t": {"numPartitions": PARTS}},
                    zookeeper=keys,
                )
            )
        self.wait_partitions(n * PARTS, "brokers registered")

    def wait_partitions(self, n: int, what: str) -> None:
        wait_for(lambda: len(partitions(self.admin, P, "t")) == n, 30, what)

    def member(self, name: str) -> ConsumerMember:
        m = ConsumerMember(self.url, "g", name, "t", self.tmp, session_ms=SESSION_MS)
        self.all.append(m)
        self.live.append(m)
        return m.start()

    def by_name(self, name: str) -> ConsumerMember:
        return next(m for m in self.live if m.cid == f"g_{name}")

    def settle(self, what: str, since: float) -> None:
        wait_for(
            lambda: group_settled(self.admin, P, "g", "t", self.live),
            45,
            f"{what}: settled (owners {owners(self.admin, P, 'g', 't')}, "
            f"held {[(m.cid, sorted(m.held())) for m in self.live]})",
        )
        self.timings[what] = time.monotonic() - since

    def progress(self, n: int, what: str) -> None:
        """The producer gets ``n`` more messages acknowledged."""
        load = self.load
        assert load is not None
        goal = load.acked_count() + n
        wait_for(lambda: load.acked_count() >= goal, 30, what)

    def close(self) -> None:
        if self.load is not None:
            with contextlib.suppress(Exception):
                self.load.stop()
        for m in self.all:
            m.cleanup()
        for b in self.brokers:
            b.kill()
            b.__exit__(None, None, None)  # closes its log pipe
        with contextlib.suppress(Exception):
            self.admin.stop()
        self.admin.close()


@pytest.fixture
def cluster(private_zk: ZooKeeperServer, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(private_zk, tmp_path)
    try:
        yield c
    finally:
        c.close()
        print(f"\n[rebalance, session {SESSION_MS} ms] " + ", ".join(
            f"{k}: {v:.2f} s" for k, v in c.timings.items()
        ))  # fmt: skip


def finish(c: Cluster, history: OwnerHistory) -> History:
    """Stop the producer, let the group drain it, stop the members; check the history."""
    load = c.load
    assert load is not None
    load.stop()
    delivered = {d.seq for m in c.all if m not in c.live for d in m.deliveries()}

    def drained() -> bool:
        for m in c.live:
            delivered.update(d.seq for d in m.deliveries())
        return all(s in delivered for s in load.acked)

    try:
        wait_for(drained, 60, "every acknowledged message delivered")
    except AssertionError:
        missing = sorted((load.acked[s], s) for s in load.acked if s not in delivered)
        last: dict[str, int] = {}
        for m in c.all:
            for d in m.deliveries():
                last[d.part] = max(last.get(d.part, -1), d.offset)
        raise AssertionError(
            f"{len(missing)} acknowledged messages not delivered, e.g. {missing[:10]}; "
            f"last offset delivered per partition {sorted(last.items())}; "
            f"owners {owners(c.admin, P, 'g', 't')}; held {[(m.cid, sorted(m.held())) for m in c.live]}"
        ) from None
    for m in list(c.live):
        assert m.terminate() == 0
    c.live.clear()
    history.stop()
    h = check_history(c.all, load.acked)
    print(
        f"\n[history] acked {len(load.acked)}, failed sends {len(load.failed)}, deliveries "
        f"{h.deliveries}, redelivered after a member died {h.duplicates}, owner reads "
        f"{len(history.reads)}"
    )
    assert h.outside == []
    assert h.overlaps == []
    assert h.lost == []
    assert h.unexplained == []
    bad = [
        f"{part}: owner {owner} read at {sent:.3f} while {cid} processed it"
        for part, owner, sent, received in history.reads
        for s0, s1, cid in h.spans.get(part, ())
        if owner is not None and owner != cid and s0 < sent and received < s1
    ]
    assert bad == []
    return h


def test_group_of_processes_through_join_leave_crashes_expiry_and_zk_restart(
    cluster: Cluster,
) -> None:
    c = cluster
    c.start_brokers()
    c.load = LoadProducer(c.url, "t", retries=1, zk_session_timeout_ms=SESSION_MS).start()
    history = OwnerHistory(c.zk_server.hosts, "g", "t").start()
    t0 = time.monotonic()
    c.member("a")
    c.member("b")
    c.settle("start", t0)
    c.progress(100, "messages flow")

    t0 = time.monotonic()
    c.member("c")
    c.settle("join", t0)

    b = c.by_name("b")
    t0 = time.monotonic()
    c.live.remove(b)
    assert b.terminate() == 0
    c.settle("leave", t0)

    a = c.by_name("a")
    t0 = time.monotonic()
    c.live.remove(a)
    a.kill()
    c.settle("sigkill member", t0)  # once its session expired on the server
    c.member("d")
    c.settle("join again", t0)

    # a broker dies: the producer carries on through the other two at once.  The one send
    # that may be in flight at the kill (LoadProducer sends one at a time) cannot move: it is
    # numbered (idempotence is on by default) and may be stored on broker 1, so it reports
    # MessageMayBeStored rather than risk a duplicate elsewhere; nothing else fails.
    failed_before = len(c.load.failed)
    t0 = time.monotonic()
    c.brokers[1].kill()
    c.progress(200, "the producer carries on without broker 1")
    new_failures = c.load.failed[failed_before:]
    assert len(new_failures) <= 1, new_failures
    assert all("MessageMayBeStored" in e and "send to t/1-" in e for _, e in new_failures), (
        new_failures
    )
    c.wait_partitions(2 * PARTS, "broker 1's registration expired")
    c.settle("broker lost", t0)
    t0 = time.monotonic()
    c.brokers[1].launch()
    c.wait_partitions(3 * PARTS, "broker 1 registered again")
    c.settle("broker back", t0)
    c.progress(200, "messages flow to all three brokers")
    back = {pk for pk, _ in list(c.load.acked.values())[-200:]}
    assert any(pk.startswith("1-") for pk in back), back

    d = c.by_name("d")
    sid, pwd = d.session()
    t0 = time.monotonic()
    expire_session_id(c.zk_server.hosts, sid, pwd)
    wait_for(lambda: d.session()[0] != sid, 30, "d has a new session")
    c.settle("session expiry", t0)

    down = time.monotonic()
    c.zk_server.stop(keep_data=True)
    wait_for(
        lambda: all(
            any(e["ev"] == "suspended" and e["t"] > down for e in m.events()) for m in c.live
        ),
        30,
        "every member stopped delivering while ZooKeeper is down",
    )
    c.progress(100, "the producer carries on while ZooKeeper is down")
    c.zk_server.start()
    wait_for(lambda: c.admin.connected, 30, "admin reconnected")
    c.settle("zookeeper restart", down)
    c.progress(100, "messages flow after the restart")

    h = finish(c, history)
    assert c.load.failed == new_failures, c.load.failed  # only the send in flight at the kill
    assert h.deliveries >= len(c.load.acked)


@pytest.mark.slow
def test_seeded_rounds(cluster: Cluster, seed: int) -> None:
    """Random events (join, leave, member SIGKILL, broker SIGKILL and return, session expiry)
    for a bounded number of rounds, from a printed seed; the same checks at the end."""
    rng = random.Random(seed)
    c = cluster
    c.start_brokers()
    c.load = LoadProducer(c.url, "t", retries=1, zk_session_timeout_ms=SESSION_MS).start()
    history = OwnerHistory(c.zk_server.hosts, "g", "t").start()
    names = iter(f"m{i}" for i in range(100))
    for _ in range(3):
        c.member(next(names))
    c.settle("start", time.monotonic())
    for rnd in range(8):
        event = rng.choice(["join", "leave", "kill", "broker", "expire"])
        if event in ("leave", "kill", "expire") and len(c.live) < 2:
            event = "join"
        t0 = time.monotonic()
        if event == "join":
            c.member(next(names))
        elif event in ("leave", "kill"):
            m = rng.choice(c.live)
            c.live.remove(m)
            if event == "kill":
                m.kill()
            else:
                assert m.terminate() == 0
        elif event == "expire":
            m = rng.choice(c.live)
            sid, pwd = m.session()
            expire_session_id(c.zk_server.hosts, sid, pwd)
            wait_for(functools.partial(new_session, m, sid), 30, "new session")
        else:
            broker = c.brokers[rng.randrange(3)]
            broker.kill()
            c.wait_partitions(2 * PARTS, "the broker's registration expired")
            c.settle(f"{rnd}: broker lost", t0)
            broker.launch()
            c.wait_partitions(3 * PARTS, "the broker registered again")
        c.settle(f"{rnd}: {event}", t0)
        c.progress(50, f"round {rnd}: messages flow")
    finish(c, history)


def new_session(m: ConsumerMember, sid: int) -> bool:
    return m.session()[0] != sid


def test_producer_sorts_partitions_and_drops_a_dead_broker_at_once(
    private_zk: ZooKeeperServer, tmp_path: Path
) -> None:
    """Partitions in (brokerId, partition) order; a SIGKILLed broker's partitions leave the
    list at its first failed send (long before its session expires) and the send goes to a live
    partition; a send pinned to it fails at once; it is used again once it registers anew."""
    c = Cluster(private_zk, tmp_path)
    try:
        c.start_brokers()
        with Producer(c.url, zk_session_timeout_ms=SESSION_MS) as p:
            parts = p.partitions("t")
            assert [(tp.broker_id, tp.partition) for tp in parts] == [
                (b, i) for b in range(3) for i in range(PARTS)
            ]
            c.brokers[1].kill()
            t0 = time.monotonic()
            results = [p.send("t", b"x") for _ in range(30)]
            elapsed = time.monotonic() - t0
            assert all(r.success for r in results), [r.error for r in results]
            assert {r.broker_id for r in results} == {0, 2}
            assert elapsed < SESSION_MS / 1000, elapsed  # not waiting for the session to end
            assert {tp.broker_id for tp in p.partitions("t")} == {0, 2}
            with pytest.raises(UnknownTopicOrPartition, match="no partition 1-0"):
                p.send("t", b"pinned", partition="1-0")  # not waiting for it either
            c.wait_partitions(2 * PARTS, "broker 1's registration expired")
            c.brokers[1].launch()
            wait_for(lambda: {tp.broker_id for tp in p.partitions("t")} == {0, 1, 2}, 30, "back")
            assert p.send("t", b"y", partition="1-0").success
    finally:
        c.close()


def test_pattern_topic_found_through_the_brokers(
    private_zk: ZooKeeperServer, tmp_path: Path
) -> None:
    """A topic no broker registered yet (a ``[topic=log-*]`` section) is found by asking the
    registered brokers, and is registered by its first put."""
    keys = {"zk.zkEnable": "true", "zk.zkConnect": private_zk.hosts, "zk.zkSyncTimeMs": 100}
    admin: Any = new_client(private_zk.hosts)
    try:
        with BrokerProcess.start(
            tmp_path, system={"brokerId": 3}, topics={"log-*": {"numPartitions": 2}}, zookeeper=keys
        ):
            wait_for(lambda: admin.exists("/meta/brokers/ids/3/master"), 30, "registered")
            with Producer(f"zk://{private_zk.hosts}") as p:
                assert [tp.key for tp in p.partitions("log-app")] == ["3-0", "3-1"]
                assert p.send("log-app", b"first").success
                wait_for(lambda: partitions(admin, P, "log-app") == ["3-0", "3-1"], 30, "reg")
                with pytest.raises(UnknownTopicOrPartition, match="nothing registered"):
                    p.partitions("nothere")
    finally:
        admin.stop()
        admin.close()
