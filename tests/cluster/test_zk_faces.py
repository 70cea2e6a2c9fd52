"""``servers="zk://..."`` in every face and command a user has: AsyncProducer, AsyncConsumer
(its default offset store is ZooKeeper), OrderedProducer, broadcast consumers (no owner
nodes), and ``pymetaq produce / consume / offsets / cluster`` — against two real brokers
registered in a real ZooKeeper."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.consumer import AsyncConsumer, Consumer
from pymetaq.client.producer.aio import AsyncProducer
from pymetaq.client.producer.ordered import OrderedProducer
from pymetaq.client.producer.sync import Producer
from pymetaq.client.protocol.zk import ZkPaths
from pymetaq.offsets import FileOffsetStore
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import ZooKeeperServer, free_port
from tests.cluster.conftest import new_client

pytestmark = [pytest.mark.zk, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Registry:
    url: str  # zk://hosts/<chroot>/meta
    paths: ZkPaths
    admin: Any
    brokers: list[BrokerProcess]


@pytest.fixture(scope="module")
def reg(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    chroot = f"/t-{uuid.uuid4().hex}"
    admin = new_client(zk_server.hosts, session_timeout_s=10.0)
    admin.ensure_path(chroot)
    keys = {"zk.zkEnable": "true", "zk.zkConnect": zk_server.hosts + chroot, "zk.zkSyncTimeMs": 100}
    tmp = tmp_path_factory.mktemp("zkfaces")
    with contextlib.ExitStack() as stack:
        brokers = [
            stack.enter_context(
                BrokerProcess.start(
                    tmp,
                    name=f"b{i}",
                    system={"brokerId": i, "hostName": "127.0.0.1"},
                    topics={
                        "t": {"numPartitions": 2},
                        "o": {"numPartitions": 2},
                        "c": {"numPartitions": 2},
                    },
                    zookeeper=keys,
                )
            )
            for i in range(2)
        ]
        paths = ZkPaths(chroot + "/meta")
        wait_for(lambda: len(admin.get_children(paths.topic_sub("o"))) == 2, 30, "registered")
        yield Registry(f"zk://{zk_server.hosts}{chroot}/meta", paths, admin, brokers)
    admin.delete(chroot, recursive=True)
    admin.stop()
    admin.close()


def test_async_producer_and_async_consumer_group(reg: Registry) -> None:
    async def main() -> list[bytes]:
        async with AsyncProducer(reg.url) as p:
            parts = await p.publish("t")
            assert [tp.key for tp in parts] == ["0-0", "0-1", "1-0", "1-1"]
            for i in range(20):
                assert (await p.send("t", b"a%d" % i)).success
        got: list[bytes] = []
        async with AsyncConsumer(reg.url, "ag", zk_sync_time_ms=100) as c:
            c.subscribe("t")
            while len(got) < 20:
                got += [m.value for m in await c.poll(1.0)]
            assert c.membership is not None
            ids = reg.admin.get_children(reg.paths.consumer_ids("ag"))
            assert ids == [c.membership.consumer_id]
            await c.commit()
        return got

    got = asyncio.run(main())
    assert sorted(got) == sorted(b"a%d" % i for i in range(20))
    # the default offset store of a zk:// group is ZooKeeper, MetaQ's layout
    offsets = reg.paths.offsets("ag", "t")
    values = {p: reg.admin.get(f"{offsets}/{p}")[0] for p in reg.admin.get_children(offsets)}
    assert sorted(values) == ["0-0", "0-1", "1-0", "1-1"]
    assert all(v.decode().rpartition("-")[2].isdigit() for v in values.values())
    assert reg.admin.get_children(reg.paths.consumer_ids("ag")) == []  # left on close


def test_ordered_producer_through_zookeeper(reg: Registry, tmp_path: Path) -> None:
    with OrderedProducer(reg.url, spool_dir=tmp_path / "spool") as p:
        assert [tp.key for tp in p.partitions("o")] == ["0-0", "0-1", "1-0", "1-1"]
        results = [p.send("o", b"x%d" % i, key="k") for i in range(5)]
    assert all(r.success and not r.spooled for r in results)
    assert len({r.partition_key for r in results}) == 1
    offsets = [r.offset for r in results]
    assert offsets == sorted(offsets)


def test_broadcast_members_get_everything_without_owner_nodes(
    reg: Registry, tmp_path: Path
) -> None:
    with Producer(reg.url) as p:
        for i in range(12):
            assert p.send("t", b"b%d" % i).success
    consumers = [
        Consumer(
            reg.url,
            "bc",
            FileOffsetStore(tmp_path / f"{name}.json"),
            broadcast=True,
            instance_id=name,
            zk_sync_time_ms=100,
        )
        for name in ("one", "two")
    ]
    try:
        for c in consumers:
            c.subscribe("t")
        seen: list[set[bytes]] = [set(), set()]

        def everything() -> bool:
            for i, c in enumerate(consumers):
                seen[i].update(m.value for m in c.poll(0.2))
            return all({b"b%d" % i for i in range(12)} <= s for s in seen)

        wait_for(everything, 60, "each broadcast member read everything")
        for group in ("bc-one", "bc-two"):
            assert len(reg.admin.get_children(reg.paths.consumer_ids(group))) == 1
            assert not reg.admin.exists(reg.paths.owners(group))
            assert not reg.admin.exists(reg.paths.offsets(group))  # MetaQ: a local store
    finally:
        for c in consumers:
            c.close()


def cli(
    *args: str, stdin: str | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_commands_through_zookeeper(reg: Registry) -> None:
    r = cli("produce", "--server", reg.url, "--topic", "c", "--no-progress", stdin="c1\nc2\nc3\n")
    assert r.returncode == 0, r.stderr
    r = cli("consume", "--server", reg.url, "--topic", "c", "--group", "cg", "--from", "earliest",
            "--count", "3", "--idle-timeout", "30", "--format", "json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    values = [json.loads(line)["value"] for line in r.stdout.splitlines()]
    assert len(values) == 3
    # the group's offsets are in ZooKeeper (the consumer's default store for zk://)
    r = cli("offsets", "show", "--store", reg.url, "--group", "cg", "--server", reg.url)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0] == ["topic", "partition", "offset", "msg_id", "first", "end", "lag"]
    assert {row[1] for row in rows[1:]} <= {"0-0", "0-1", "1-0", "1-1"} and len(rows) > 1

    r = cli("cluster", "--servers", reg.url)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    lines = [line.split() for line in text.splitlines()]
    for i, b in enumerate(reg.brokers):
        assert [str(i), "master", f"meta://{b.host}:{b.port}"] == lines[4 + i][:3]
    assert ["c", "4", "0:2", "1:2", "0:2", "1:2"] in lines
    assert "group cg: 0 members" in text
    assert ["c", "0-0", "-", "66", "66", "0"] in lines  # 3 messages of 22 bytes, all read
    r = cli("cluster", "--servers", reg.url, "--group", "cg", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    r = cli("cluster", "--servers", reg.url, "--group", "cg", "--json")  # the other commands' flag
    assert r.returncode == 0 and json.loads(r.stdout)["brokers"] == doc["brokers"], r.stderr
    assert [b["broker_id"] for b in doc["brokers"]] == [0, 1]
    assert {t["topic"]: t["subscribe"] for t in doc["topics"]}["c"] == {"0": 2, "1": 2}
    (group,) = doc["groups"]
    parts = {row["partition"]: row for row in group["partitions"]}
    assert sorted(parts) == ["0-0", "0-1", "1-0", "1-1"]
    committed = [row for row in parts.values() if row["committed"] is not None]
    assert committed and all(row["lag"] == row["end"] - row["committed"] for row in committed)
    assert all(row["owner"] is None for row in parts.values())

    r = cli("cluster", "--servers", "zk://")
    assert r.returncode == 2 and "without hosts" in r.stderr and "Traceback" not in r.stderr
    r = cli("cluster", "--servers", f"zk://127.0.0.1:{free_port()}", "--timeout", "1")
    assert r.returncode == 1 and "cannot connect to ZooKeeper" in r.stderr
    assert "Traceback" not in r.stderr


def test_broker_commands_find_brokers_through_zookeeper(reg: Registry) -> None:
    # stats: every registered master, each under its own header
    r = cli("stats", "topics", "--servers", reg.url)
    assert r.returncode == 0, r.stderr
    headers = [line for line in r.stdout.splitlines() if line.startswith("== ")]
    assert headers == [f"== meta://{b.host}:{b.port} ==" for b in reg.brokers]
    # commands that talk to one broker refuse a registry with two, naming both
    r = cli("admin", "closed", "--servers", reg.url)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    names = ", ".join(f"meta://{b.host}:{b.port}" for b in reg.brokers)
    assert r.stderr.splitlines() == [
        f"pymetaq admin closed: --servers names 2 brokers ({names}); admin talks to one",
        "hint: give one: --servers meta://host:port",
    ]
    r = cli("tx", "list", "--servers", reg.url)
    assert r.returncode == 2 and "); tx list talks to one" in r.stderr
    # an empty registry is an error that says so
    r = cli("stats", "--servers", reg.url.rsplit("/", 1)[0] + "/nothing-here")
    assert r.returncode == 1 and "no broker is registered under" in r.stderr, r.stderr
