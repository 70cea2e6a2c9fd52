"""read_cluster: the whole registry as the ``pymetaq cluster`` command will show it."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import pytest

from pymetaq.client.cluster.group import GroupConfig, GroupCoordinator
from pymetaq.client.cluster.snapshot import (
    BrokerInfo,
    GroupInfo,
    PartitionState,
    TopicInfo,
    read_cluster,
)
from pymetaq.offsets import OffsetEntry
from pymetaq.offsets.zk import ZkOffsetStore
from pymetaq.server.config import parse_config
from pymetaq.server.registry import BrokerRegistry
from tests._helpers import wait_for

pytestmark = [pytest.mark.zk, pytest.mark.integration]

INI = """
[system]
brokerId={id}
[zookeeper]
zk.zkEnable=true
zk.zkConnect=unused
[topic=t]
numPartitions={n}
[topic=ro]
acceptPublish=false
"""


def test_snapshot_of_brokers_topics_and_groups(
    zk: Any, clients: Callable[..., Any], tmp_path: Any
) -> None:
    regs = []
    for bid, n in ((0, 2), (10, 1)):
        cfg = parse_config(INI.format(id=bid, n=n), cwd=str(tmp_path))
        reg = BrokerRegistry(
            functools.partial(_same, cfg), "127.0.0.1", 9000 + bid, client=clients()
        )
        reg.start()
        regs.append(reg)
    coord = GroupCoordinator(
        clients(),
        GroupConfig("g", "g_c1", ("t",), retry_delay_ms=200),
        on_assign=lambda p: None,
        on_revoke=lambda p: None,
    )
    coord.start()
    wait_for(coord.settled, what="group settled")
    ZkOffsetStore(client=zk).commit("g", [OffsetEntry("t", "10-0", 4096, 77)])
    try:
        snap = read_cluster(zk)
    finally:
        coord.stop()
        for reg in regs:
            reg.stop()
    crc0 = str(parse_config(INI.format(id=0, n=2), cwd=str(tmp_path)).checksum)
    assert snap.root == "/meta"
    assert snap.brokers[0] == BrokerInfo(0, "meta://127.0.0.1:9000", {}, crc0)
    assert [b.broker_id for b in snap.brokers] == [0, 10]
    assert snap.topics == (
        TopicInfo("ro", {}, {0: 1, 10: 1}),
        TopicInfo("t", {0: 2, 10: 1}, {0: 2, 10: 1}),
    )
    assert snap.groups == (
        GroupInfo(
            "g",
            {"g_c1": ("t",)},
            (
                PartitionState("t", "0-0", "g_c1"),
                PartitionState("t", "0-1", "g_c1"),
                PartitionState("t", "10-0", "g_c1", 4096, 77),
            ),
        ),
    )
    assert json.loads(json.dumps(snap.to_dict()))["groups"][0]["partitions"][2]["committed"] == 4096
    after = read_cluster(zk)  # stopped: brokers gone, the group's committed offset stays
    assert after.brokers == () and after.topics == ()
    assert after.groups[0].members == {}
    assert after.groups[0].partitions == (PartitionState("t", "10-0", None, 4096, 77),)


def _same(cfg: Any) -> Any:
    return cfg
