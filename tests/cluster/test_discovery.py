"""Producer/consumer broker discovery against a real ZooKeeper."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from pymetaq.client.cluster.discovery import BrokerDiscovery, TopicView
from pymetaq.client.cluster.errors import ClusterUnavailable
from pymetaq.client.protocol.zk import TopicBroker, ZkPaths
from pymetaq.client.types import TopicPartition
from tests._helpers import wait_for
from tests._services import ZooKeeperServer
from tests.cluster.conftest import expire_session, new_client

pytestmark = [pytest.mark.zk, pytest.mark.integration]
P = ZkPaths()


def register(zk: Any, broker: int, port: int, topic: str, n: int, side: str = "pub") -> None:
    """What a master broker registers for one topic (ephemeral, on ``zk``'s session)."""
    if not zk.exists(P.broker_master(broker)):
        zk.create(
            P.broker_master(broker), b"meta://127.0.0.1:%d" % port, ephemeral=True, makepath=True
        )
    base = P.topic_pub(topic) if side == "pub" else P.topic_sub(topic)
    zk.create(
        f"{base}/{broker}-m", TopicBroker(n, f"{broker}-m").encode(), ephemeral=True, makepath=True
    )


class Recorder:
    def __init__(self) -> None:
        self.views: list[TopicView] = []
        self.lock = threading.Lock()

    def __call__(self, view: TopicView) -> None:
        with self.lock:
            self.views.append(view)

    def last(self) -> TopicView | None:
        with self.lock:
            return self.views[-1] if self.views else None


def _parts(view: TopicView | None) -> list[tuple[int, int]]:
    return [] if view is None else [(p.broker_id, p.partition) for p in view.partitions]


def test_producer_view_sorted_by_broker_then_partition(
    zk: Any, clients: Callable[..., Any]
) -> None:
    reader = clients()
    rec = Recorder()
    disc = BrokerDiscovery(reader, side="pub", topics=["t"], on_change=rec, retry_delay_s=0.2)
    try:
        empty = disc.wait_view("t", 10)
        assert empty.partitions == () and empty.brokers == {}
        register(zk, 10, 9010, "t", 2)
        register(zk, 2, 9002, "t", 3)
        zk.create(P.topic_pub("t", "2-s1"), TopicBroker(3, "2-s1").encode(), ephemeral=True)
        zk.create(P.topic_pub("t", "junk"), b"whatever", ephemeral=True)
        zk.create(P.topic_pub("t", "7-m"), b"not json", ephemeral=True)
        zk.create(P.topic_pub("t", "8-m"), TopicBroker(1, "8-m").encode(), ephemeral=True)
        want = [(2, 0), (2, 1), (2, 2), (10, 0), (10, 1)]  # numeric, slaves and junk ignored
        wait_for(lambda: _parts(disc.view("t")) == want, what="both brokers seen")
        view = disc.view("t")
        assert view is not None
        assert view.brokers == {2: "meta://127.0.0.1:9002", 10: "meta://127.0.0.1:9010"}
        assert view.url(TopicPartition("t", 10, 1)) == "meta://127.0.0.1:9010"
        assert view.partition_names == ["2-0", "2-1", "2-2", "10-0", "10-1"]
        # broker 8 has no master address: skipped until it registers one
        zk.create(P.broker_master(8), b"meta://127.0.0.1:9008", ephemeral=True, makepath=True)
        wait_for(lambda: (8, 0) in _parts(disc.view("t")), what="broker 8 usable")
        # a broker disappearing
        zk.delete(P.topic_pub("t", "10-m"))
        wait_for(lambda: _parts(disc.view("t")) == [(2, 0), (2, 1), (2, 2), (8, 0)], what="10 gone")
        # a partition count change (config reload) is a data change, not a child change
        zk.set(P.topic_pub("t", "2-m"), TopicBroker(1, "2-m").encode())
        wait_for(lambda: _parts(disc.view("t")) == [(2, 0), (8, 0)], what="count change")
        # views are compared, not events counted: no two equal consecutive callbacks
        assert all(a != b for a, b in zip(rec.views, rec.views[1:]))
        assert rec.views[0] == empty
    finally:
        disc.close()


def test_consumer_view_merges_master_and_slaves(zk: Any, clients: Callable[..., Any]) -> None:
    register(zk, 1, 9001, "t", 2, side="sub")
    zk.create(P.broker_slave(1, 0), b"meta://127.0.0.1:9101", ephemeral=True)
    zk.create(P.topic_sub("t", "1-s0"), TopicBroker(3, "1-s0").encode(), ephemeral=True)
    zk.create(P.broker_slave(4, 2), b"meta://127.0.0.1:9402", ephemeral=True, makepath=True)
    zk.create(P.topic_sub("t", "4-s2"), TopicBroker(1, "4-s2").encode(), ephemeral=True)
    disc = BrokerDiscovery(clients(), side="sub", topics=["t"], retry_delay_s=0.2)
    try:
        view = disc.wait_view("t", 10, lambda v: len(v.partitions) == 4)
        assert _parts(view) == [(1, 0), (1, 1), (1, 2), (4, 0)]
        assert view.brokers == {1: "meta://127.0.0.1:9001", 4: "meta://127.0.0.1:9402"}
    finally:
        disc.close()


def test_wait_view_times_out_with_a_clear_error(clients: Callable[..., Any]) -> None:
    disc = BrokerDiscovery(clients(), side="pub", retry_delay_s=0.2)
    try:
        with pytest.raises(ClusterUnavailable, match=r"topics-pub/nothing within 0\.3 s"):
            disc.wait_view("nothing", 0.3, lambda v: bool(v.partitions))
        with pytest.raises(ValueError):
            disc.add_topic("../x")
    finally:
        disc.close()


def test_survives_session_expiry(zk_server: ZooKeeperServer, zk: Any, zk_hosts: str) -> None:
    reader = new_client(zk_hosts, session_timeout_s=2.0)
    disc = BrokerDiscovery(reader, side="pub", topics=["t"], retry_delay_s=0.2)
    try:
        register(zk, 1, 9001, "t", 1)
        wait_for(lambda: _parts(disc.view("t")) == [(1, 0)], what="first view")
        before = reader.client_id
        expire_session(zk_server, reader)
        wait_for(lambda: reader.connected and reader.client_id != before, what="new session")
        register(zk, 2, 9002, "t", 1)  # only seen if the watches were re-armed
        wait_for(lambda: _parts(disc.view("t")) == [(1, 0), (2, 0)], what="change after expiry")
    finally:
        disc.close()
        reader.stop()
        reader.close()


def test_survives_zookeeper_restart(private_zk: ZooKeeperServer) -> None:
    admin = new_client(private_zk.hosts, session_timeout_s=10.0)
    reader = new_client(private_zk.hosts, session_timeout_s=10.0)
    disc = BrokerDiscovery(reader, side="pub", topics=["t"], retry_delay_s=0.2)
    try:
        register(admin, 1, 9001, "t", 1)
        wait_for(lambda: _parts(disc.view("t")) == [(1, 0)], what="first view")
        private_zk.stop(keep_data=True)
        wait_for(lambda: not reader.connected, what="reader disconnected")
        private_zk.start()
        wait_for(lambda: admin.connected and reader.connected, what="both reconnected")
        register(admin, 2, 9002, "t", 2)
        wait_for(
            lambda: _parts(disc.view("t")) == [(1, 0), (2, 0), (2, 1)], what="change after restart"
        )
    finally:
        disc.close()
        for c in (reader, admin):
            c.stop()
            c.close()
