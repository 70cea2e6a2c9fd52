"""The asynchronous slave ("metaslave") with real broker processes and a real ZooKeeper.

The proof the issue asks for: after the slave catches up - under load, and after it was
SIGKILLed and restarted mid-stream - its segment files are byte-identical to the master's
(same names: the same offsets, the master's msgIds and flags).  Also: an empty slave starts at
the master's first offset, the slave registers as ``slave<n>`` / ``<id>-s<n>``, refuses puts,
and shows its lag in ``stats replication`` (the master shows its slave there too).
"""

from __future__ import annotations

import os
import random
import signal
import threading
from pathlib import Path

import pytest

from pymetaq.client import Consumer, Producer
from pymetaq.client.protocol import ResultReply
from pymetaq.offsets import FileOffsetStore
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.cluster.conftest import new_client
from tests.ha._helpers import offsets, segment_files, start_master, start_slave, stats
from tests.server._helpers import Wire

pytestmark = [pytest.mark.zk, pytest.mark.integration]


class Load:
    """A producer thread sending numbered messages to every partition until stopped."""

    def __init__(self, address: tuple[str, int], seed: int) -> None:
        self.rng = random.Random(seed)
        self.producer = Producer(f"meta://{address[0]}:{address[1]}")
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in range(50):
                topic = "orders" if self.rng.random() < 0.8 else "audit"
                size = self.rng.randrange(10, 700)
                self.producer.send_async(topic, os.urandom(size // 2).hex().encode())
                self.sent += 1
            self.producer.flush(30)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.producer.flush(30)
        self.producer.close()

    def __exit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            self.stop()


def _caught_up(master: BrokerProcess, slave: BrokerProcess) -> bool:
    m = offsets(master)
    return bool(m) and offsets(slave) == m


def test_slave_copies_the_master_byte_for_byte_through_a_crash(
    tmp_path: Path, zk_hosts: str
) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    with start_master(tmp_path, zk_hosts) as master:
        with Load(master.address, seed) as load:
            wait_for(lambda: load.sent >= 600, 60, "messages before the slave starts")
            # the master's retention deleted its first segment: its log starts later
            load.stop()
        master.terminate()
        first = sorted((master.data_path / "orders-0").glob("*.meta"))
        assert len(first) > 2, "small segments: several files"
        first[0].unlink()
        master.restart()
        lo = offsets(master)[("orders", 0)][0]
        assert lo > 0
        with start_slave(tmp_path, zk_hosts) as slave:
            with Load(master.address, seed + 1) as load:
                wait_for(lambda: (slave.data_path / "orders-0").exists(), 60, "the slave's log")
                wait_for(lambda: load.sent >= 1500, 60, "load while the slave follows")
                slave.kill()  # mid-stream
                slave.restart()
                wait_for(lambda: load.sent >= 2500, 60, "load after the slave's restart")
                load.stop()
            wait_for(lambda: _caught_up(master, slave), 60, "the slave to catch up")
            assert offsets(slave)[("orders", 0)][0] == lo  # started at the master's first offset
            rows = stats(slave, "replication")
            assert rows[0].startswith("slave_id 0 group meta-slave-group_0 master meta://")
            assert len(rows) == 4  # head + orders-0, orders-1, audit-0
            for row in rows[1:]:
                f = row.split()
                assert f[f.index("lag_bytes") + 1] == "0", row
                assert f[f.index("lag_seconds") + 1] == "0.000", row
            on_master = stats(master, "replication")
            assert {ln.split()[1] + "-" + ln.split()[3] for ln in on_master} == {
                "orders-0",
                "orders-1",
                "audit-0",
            }
            assert all(ln.startswith("meta-slave-group_0 ") for ln in on_master)
            assert "slave true" in stats(slave, "")
            assert "slave false" in stats(master, "")
            assert slave.terminate() == 0
        assert master.terminate() == 0
        theirs, ours = segment_files(master.data_path), segment_files(slave.data_path)
        assert sorted(ours) == sorted(theirs)
        assert len(ours) > 10
        for name in theirs:
            assert ours[name] == theirs[name], f"{name} differs"


def test_slave_registers_as_slave_and_refuses_puts(tmp_path: Path, zk_hosts: str) -> None:
    with (
        start_master(tmp_path, zk_hosts) as master,
        start_slave(tmp_path, zk_hosts, slave_id=3) as slave,
    ):
        _registered_and_read_only(master, slave, zk_hosts)


def _registered_and_read_only(master: BrokerProcess, slave: BrokerProcess, zk_hosts: str) -> None:
    zk = new_client(zk_hosts)
    try:
        wait_for(lambda: zk.exists("/meta/brokers/ids/0/slave3"), 30, "slave3's node")
        url, _ = zk.get("/meta/brokers/ids/0/slave3")
        assert url.decode() == f"meta://127.0.0.1:{slave.port}"
        master_url, _ = zk.get("/meta/brokers/ids/0")
        assert master_url.decode() == f"meta://127.0.0.1:{master.port}"  # the master's
        subs = sorted(zk.get_children("/meta/brokers/topics-sub/orders"))
        assert subs == ["0-m", "0-s3"]
        value, _ = zk.get("/meta/brokers/topics-sub/orders/0-s3")
        assert value == b'{"numParts":2,"broker":"0-s3"}'
        with Wire(slave.address) as w:
            reply = w.call(b"put orders 0 5 0 7\r\nhello")
        assert isinstance(reply, ResultReply) and reply.code == 403
        assert b"slave3" in reply.body and b"send messages to the master" in reply.body
        with Producer(f"meta://127.0.0.1:{master.port}") as p:
            r = p.send("orders", b"replicated", partition=1, raise_on_error=True)
        wait_for(lambda: _caught_up(master, slave), 30, "the slave to copy the message")
        with Wire(slave.address) as w:
            got = w.call(f"get orders g 1 {r.offset} 4096 2\r\n".encode())
        assert b"replicated" in getattr(got, "data", b"")
    finally:
        zk.stop()
        zk.close()


def test_bad_slave_properties_are_a_config_error(tmp_path: Path, zk_hosts: str) -> None:
    props = "slaveId=1\nslaveGrup=x\n"
    with pytest.raises(
        RuntimeError, match=r"unknown key 'slaveGrup' \(did you mean slaveGroup\?\)"
    ):
        start_slave(tmp_path, zk_hosts, slave_id=1, properties=props)


def test_consumers_read_from_the_slave_when_asked(tmp_path: Path, zk_hosts: str) -> None:
    """``read_from_slaves=True`` fetches from the slave; the default from the master (MetaQ)."""
    with (
        start_master(tmp_path, zk_hosts) as master,
        start_slave(tmp_path, zk_hosts, slave_id=1) as slave,
    ):
        with Producer(f"meta://127.0.0.1:{master.port}") as p:
            for i in range(20):
                assert p.send("audit", b"m%d" % i).success
        wait_for(lambda: _caught_up(master, slave), 30, "the slave to copy the messages")
        url = f"zk://{zk_hosts}/meta"  # hosts/<chroot> + the registry root
        for group, reads_slave in (("on-slave", True), ("on-master", False)):
            store = FileOffsetStore(tmp_path / f"{group}.json")
            with Consumer(
                url,
                group,
                store,
                read_from_slaves=reads_slave,
                initial_position="earliest",
                zk_sync_time_ms=100,
            ) as c:
                c.subscribe("audit")
                seen: list[bytes] = []

                def everything(c: Consumer = c, seen: list[bytes] = seen) -> bool:
                    seen.extend(m.value for m in c.poll(0.2))
                    return len(seen) >= 20

                wait_for(everything, 60, f"{group} to read everything")
            assert seen == [b"m%d" % i for i in range(20)]  # in order, exactly once
            where, other = (slave, master) if reads_slave else (master, slave)
            assert any(ln.startswith(f"{group} audit part 0") for ln in stats(where, "lag"))
            assert not any(ln.startswith(f"{group} ") for ln in stats(other, "lag"))


def test_auto_sync_master_config_takes_the_masters_topics(tmp_path: Path, zk_hosts: str) -> None:
    props = "slaveId=2\nslaveMaxDelayInMills=200\nautoSyncMasterConfig=true\n"
    with start_master(tmp_path, zk_hosts) as master:
        ini = master.config_path.read_text(encoding="utf-8")
        master.config_path.write_text(ini + "\n[topic=late]\nnumPartitions=3\n", encoding="utf-8")
        master.signal(signal.SIGHUP)  # the master reloads: a new topic, a new checksum
        with Producer(f"meta://127.0.0.1:{master.port}") as p:
            wait_for(lambda: p.send("late", b"x", partition=2).success, 30, "the new topic")
        with start_slave(tmp_path, zk_hosts, slave_id=2, properties=props) as slave:
            wait_for(lambda: ("late", 2) in offsets(slave), 30, "the slave to take the topic")
            wait_for(lambda: _caught_up(master, slave), 30, "the slave to copy it")
            text = slave.config_path.read_text(encoding="utf-8")
            assert "[topic=late]" in text
            assert f"dataPath={slave.data_path}" in text  # its own [system] stays
