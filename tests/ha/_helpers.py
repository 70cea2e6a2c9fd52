"""Helpers of the replication tests: a master and its slaves as real broker processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pymetaq.client.protocol import ResultReply
from tests._broker import BrokerProcess
from tests.server._helpers import Wire

TOPICS: dict[str, dict[str, Any]] = {"orders": {"numPartitions": 2}, "audit": {}}
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
