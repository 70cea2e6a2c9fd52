"""Helpers of the replication tests: a master and its slaves as real broker processes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from pymetaq.client import Producer
from pymetaq.client.errors import MetaClientError
from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.record import iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire

TOPICS: dict[str, dict[str, Any]] = {"orders": {"numPartitions": 2}, "audit": {}}
#: the topics of a synchronous pair's tests
SYNC_TOPICS: dict[str, dict[str, Any]] = {"orders": {"numPartitions": 2}}
#: small segments, so every run rolls many of them
SYSTEM = {"maxSegmentSize": 16384, "unflushThreshold": 0}


def zk_keys(hosts: str) -> dict[str, Any]:
    return {
        "zk.zkEnable": "true",
        "zk.zkConnect": hosts,
        "zk.zkSessionTimeoutMs": 4000,
        "zk.zkConnectionTimeoutMs": 10000,
        "zk.zkSyncTimeMs": 100,
    }


def start_master(tmp_path: Path, hosts: str, **system: Any) -> BrokerProcess:
    return BrokerProcess.start(
        tmp_path,
        name="master",
        system={**SYSTEM, **system},
        topics=TOPICS,
        zookeeper=zk_keys(hosts),
    )


def start_slave(
    tmp_path: Path, hosts: str, slave_id: int = 0, properties: str | None = None, **system: Any
) -> BrokerProcess:
    props = tmp_path / f"async_slave_{slave_id}.properties"
    props.write_text(
        properties
        if properties is not None
        else f"slaveId={slave_id}\nslaveMaxDelayInMills=200\nautoSyncMasterConfig=false\n",
        encoding="utf-8",
    )
    return BrokerProcess.start(
        tmp_path,
        name=f"slave{slave_id}",
        system={**SYSTEM, **system},
        topics=TOPICS,
        zookeeper=zk_keys(hosts),
        extra_args=[f"-Fmetaslave={props}"],
    )


def stats(broker: BrokerProcess, item: str) -> list[str]:
    with Wire(broker.address) as w:
        reply = w.call(f"stats {item} 1\r\n".encode())
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    return [ln for ln in reply.body.decode().split("\r\n") if ln and ln not in ("STATS", "END")]


def offsets(broker: BrokerProcess) -> dict[tuple[str, int], tuple[int, int]]:
    out = {}
    for line in stats(broker, "offsets"):
        f = line.split()
        out[(f[0], int(f[2]))] = (int(f[4]), int(f[6]))
    return out


def segment_files(data: Path) -> dict[str, bytes]:
    """``<partition dir>/<segment>`` -> bytes of every ``.meta`` segment under ``data``."""
    return {f"{p.parent.name}/{p.name}": p.read_bytes() for p in sorted(data.glob("*/*.meta"))}


def start_gregor(tmp_path: Path, port: int, zk_hosts: str | None = None) -> BrokerProcess:
    """A gregor slave on ``port``; with ``zk_hosts`` it watches its master (failover)."""
    props = tmp_path / "gregor_slave.properties"
    props.write_text("# MetaQ's gregor_slave.properties is empty\n", encoding="utf-8")
    return BrokerProcess.start(
        tmp_path,
        name="gregor",
        system={"serverPort": port},
        topics=SYNC_TOPICS,
        zookeeper=zk_keys(zk_hosts) if zk_hosts else None,
        extra_args=[f"-Fgregor={props}"],
    )


def start_samsa(
    tmp_path: Path, slave_port: int, zk_hosts: str | None = None, **keys: object
) -> BrokerProcess:
    """A samsa master of the gregor slave on ``slave_port`` (registered with ``zk_hosts``)."""
    props = tmp_path / "samsa_master.properties"
    extra = "".join(f"{k}={v}\n" for k, v in keys.items())
    props.write_text(
        f"slave=127.0.0.1:{slave_port}\nsendToSlaveTimeoutInMills=2000\n{extra}", encoding="utf-8"
    )
    return BrokerProcess.start(
        tmp_path,
        name="samsa",
        topics=SYNC_TOPICS,
        zookeeper=zk_keys(zk_hosts) if zk_hosts else None,
        extra_args=[f"-Fsamsa={props}"],
    )


def records(broker: BrokerProcess, partition: int) -> list[tuple[int, int, bytes]]:
    """(offset, msgId, payload) of every record of ``orders-<partition>``."""
    out: list[tuple[int, int, bytes]] = []
    offset = 0
    with Wire(broker.address) as w:
        while True:
            reply = w.call(f"get orders g {partition} {offset} 1048576 1\r\n".encode())
            if not isinstance(reply, ValueReply):
                assert isinstance(reply, ResultReply) and reply.code == 404, reply
                return out
            recs = list(iter_records(reply.data, offset))
            assert recs, "a reply without a complete record"
            for r in recs:
                out.append((r.offset, r.msg_id, bytes(r.data)))
            offset = recs[-1].offset + 20 + len(recs[-1].data)


class Sender:
    """Sends numbered messages (one at a time, no retries) to ``url`` (``meta://`` or
    ``zk://``) and keeps the acknowledged ones; a send that raises (no broker registered for
    the topic during a failover) counts as failed."""

    def __init__(self, url: str) -> None:
        self.producer = Producer(url, retries=0)
        self.acked: list[tuple[int, int, int, bytes]] = []  # (partition, offset, msgId, value)
        self.failed = 0
        self.n = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.n += 1
            value = b"m%d" % self.n
            try:
                r = self.producer.send("orders", value, partition=self.n % 2, timeout_s=10)
            except MetaClientError:
                r = None
            if r is not None and r.success:
                self.acked.append((r.partition, r.offset, r.msg_id, value))
            else:
                self.failed += 1
                self._stop.wait(0.02)  # nobody to send to right now: do not spin

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.producer.close(5)
