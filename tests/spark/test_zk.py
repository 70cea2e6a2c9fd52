"""Format ``pymetaq`` with ``zk://`` servers: a real ZooKeeper and a broker registered in it.
Spark finds the brokers and partitions through the registry (batch write and read),
``subscribePattern`` matches the registered topics, and a streaming query's ``groupId``
commits show up in ``pymetaq cluster`` (one micro-batch behind the query, as documented)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pymetaq.client.cli.stats import stats_lines
from pymetaq.client.producer.sync import Producer
from pymetaq.client.protocol.zk import ZkPaths
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import ZooKeeperServer

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.zk]

TOPICS = {
    "zk-a": {"numPartitions": 2},
    "zk-b": {"numPartitions": 1},
    "other": {"numPartitions": 1},
    "zk-g": {"numPartitions": 2},
    "g-copy": {"numPartitions": 2},
}


class Cluster(NamedTuple):
    url: str  # zk://hosts/<chroot>/meta
    broker: BrokerProcess


@pytest.fixture(scope="module")
def zk_cluster(
    zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A broker registered under a fresh ZooKeeper root."""
    from kazoo.client import KazooClient

    chroot = f"/t-{uuid.uuid4().hex}"
    admin = KazooClient(hosts=zk_server.hosts)
    admin.start(timeout=10)
    try:
        admin.ensure_path(chroot)
        zk = {
            "zk.zkEnable": "true",
            "zk.zkConnect": zk_server.hosts + chroot,
            "zk.zkSessionTimeoutMs": 5000,
            "zk.zkSyncTimeMs": 200,
        }
        base: Path = tmp_path_factory.mktemp("spark-zk")
        with BrokerProcess.start(base, topics=TOPICS, zookeeper=zk) as broker:
            paths = ZkPaths(chroot + "/meta")
            wait_for(
                lambda: all(admin.exists(paths.topic_sub(t)) for t in TOPICS),
                30,
                "the broker's topics registered in ZooKeeper",
            )
            yield Cluster(f"zk://{zk_server.hosts}{chroot}/meta", broker)
        admin.delete(chroot, recursive=True)
    finally:
        admin.stop()
        admin.close()


def read(spark: Any, url: str, **options: str) -> Any:
    r = spark.read.format("pymetaq").option("pymetaq.servers", url)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_write_and_read_back_through_zookeeper(spark: Any, zk_cluster: Cluster):
    cluster = zk_cluster.url
    rows = [(f"k{i % 5}", f"zk-{i:03d}") for i in range(40)]
    df = spark.createDataFrame(rows, "key string, value string")
    df.write.format("pymetaq").option("pymetaq.servers", cluster).option("topic", "zk-a").mode(
        "append"
    ).save()
    back = read(spark, cluster, subscribe="zk-a")
    assert back.rdd.getNumPartitions() == 2  # one task per registered partition
    got = back.collect()
    assert sorted((r.key, r.value) for r in got) == sorted(
        (k.encode(), v.encode()) for k, v in rows
    )
    assert {r.partition for r in got} == {"0-0", "0-1"}
    for key in {r.key for r in got}:  # the producer's key hashing, through the registry too
        assert len({r.partition for r in got if r.key == key}) == 1


def test_subscribe_pattern_matches_the_registered_topics(spark: Any, zk_cluster: Cluster):
    cluster = zk_cluster.url
    with Producer(cluster) as p:
        p.send_and_wait("zk-b", b"from-b")
        p.send_and_wait("other", b"not-matched")
    got = read(spark, cluster, subscribePattern="zk-[ab]").collect()
    assert {r.topic for r in got} == {"zk-a", "zk-b"}
    assert [r.value for r in got if r.topic == "zk-b"] == [b"from-b"]
    assert read(spark, cluster, subscribePattern="nothing-.*").count() == 0


def cluster_group(url: str, group: str) -> dict[str, Any]:
    """``pymetaq cluster --group G --format json``: the group's rows of topic zk-g."""
    args = ["cluster", "--servers", url, "--group", group, "--format", "json"]
    proc = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    groups = json.loads(proc.stdout)["groups"]
    assert [g["group"] for g in groups] == [group]
    return {r["partition"]: r for r in groups[0]["partitions"] if r["topic"] == "zk-g"}


def test_group_commits_show_the_query_progress(spark: Any, zk_cluster: Cluster, tmp_path: Path):
    cluster = zk_cluster.url
    with Producer(cluster) as p:
        for i in range(30):
            p.send_async("zk-g", b"g-%02d" % i, partition=f"0-{i % 2}")
        assert p.flush(30)
    q = (
        spark.readStream.format("pymetaq")
        .option("pymetaq.servers", cluster)
        .option("subscribe", "zk-g")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10")
        .option("groupId", "spark-g")
        .load()
        .select("value")
        .writeStream.format("pymetaq")
        .option("pymetaq.servers", cluster)
        .option("topic", "g-copy")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(120), "the availableNow query did not finish in 120 s"
        assert q.exception() is None
    finally:
        q.stop()
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    assert sum(b["numInputRows"] for b in batches) == 30 and len(batches) >= 3
    # Spark commits a batch's end when it plans the next one: the group is one batch behind
    behind = json.loads(batches[-2]["sources"][0]["endOffset"])["zk-g"]
    end = json.loads(batches[-1]["sources"][0]["endOffset"])["zk-g"]
    rows = cluster_group(cluster, "spark-g")
    assert {k: r["committed"] for k, r in rows.items()} == behind
    assert {k: r["end"] for k, r in rows.items()} == end
    assert all(r["lag"] == end[k] - behind[k] for k, r in rows.items())
    # the executors' gets carry the group's name: the broker's fetch lag lists the query
    b = zk_cluster.broker
    lag = [line.split()[:4] for line in stats_lines(b.host, b.port, "lag", 10.0)]
    assert ["spark-g", "zk-g", "part", "0"] in lag and ["spark-g", "zk-g", "part", "1"] in lag
