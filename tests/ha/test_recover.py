"""MetaQ's recoverOffset (:mod:`pymetaq.ha.recover`): the position after a msgId in a real
log of several segments, and consumer offset nodes in a real ZooKeeper rewritten by msgId."""

from __future__ import annotations

from pathlib import Path

import pytest

from pymetaq.client.protocol.zk import ZkPaths
from pymetaq.ha.recover import position_after, recover_offsets
from pymetaq.storage.record import encode_record
from tests.cluster.conftest import new_client
from tests.storage._helpers import manager

pytestmark = pytest.mark.integration  # the ZooKeeper test below uses a real server

#: ids 1000, 1010, ..., 1190: twenty 60-byte records (20-byte header + 40 bytes)
IDS = list(range(1000, 1200, 10))
SIZE = 60


def test_position_after_a_msg_id(tmp_path: Path) -> None:
    m = manager(str(tmp_path), segment=SIZE * 4)  # four records per segment
    try:
        plog = m.get_log("orders", 0, start_offset=5000)  # other offsets than the old master
        assert plog is not None
        for i in range(0, len(IDS), 4):
            body = b"".join(encode_record(b"%040d" % rid, 0, rid) for rid in IDS[i : i + 4])
            plog.append_sync(bytearray(body), stamp_ids=False, timeout=10)
        assert len(plog.segments) >= 5
        at = {rid: 5000 + i * SIZE for i, rid in enumerate(IDS)}
        assert position_after(plog, 1000) == (at[1010], 1000)  # the first record
        assert position_after(plog, 1035) == (at[1040], 1030)  # not in the log: the next one
        assert position_after(plog, 1120) == (at[1130], 1120)  # in a later segment
        assert position_after(plog, 1190) == (5000 + 20 * SIZE, 1190)  # the last: the end
        assert position_after(plog, 5000) == (5000 + 20 * SIZE, 1190)  # beyond: the end
        assert position_after(plog, 17) == (5000, -1)  # before everything: the start
    finally:
        m.close()


def test_consumer_offsets_are_mapped_by_msg_id(tmp_path: Path, zk_hosts: str) -> None:
    m = manager(str(tmp_path), segment=SIZE * 4)
    zk = new_client(zk_hosts)
    try:
        plog = m.get_log("orders", 1, start_offset=5000)
        assert plog is not None
        body = b"".join(encode_record(b"%040d" % rid, 0, rid) for rid in IDS)
        plog.append_sync(bytearray(body), stamp_ids=False, timeout=10)
        paths = ZkPaths("/meta")
        nodes = {
            "moved": b"1050-360",  # consumed 1050, which the old master had at 300..360
            "right": b"1050-%d" % (5000 + 6 * SIZE),  # already right: not rewritten
            "no-id": b"-1-360",  # no msgId: left alone (MetaQ skips it too)
            "legacy": b"360",  # a pre-1.4 value: left alone
            "other-broker": b"1050-360",  # brokerId 3's node: not this broker's
        }
        for group, value in nodes.items():
            node = "3-1" if group == "other-broker" else "0-1"
            zk.create(paths.offset(group, "orders", node), value, makepath=True)
        versions = {g: zk.get(paths.offset(g, "orders", "0-1"))[1].version for g in ("right",)}
        done = recover_offsets(zk, paths, 0, [plog])
        assert [(r.path.split("/")[3], r.old, r.new) for r in done] == [
            ("moved", (1050, 360), (1050, 5000 + 6 * SIZE))
        ]
        got = {
            g: zk.get(paths.offset(g, "orders", "3-1" if g == "other-broker" else "0-1"))[0]
            for g in nodes
        }
        assert got == {**nodes, "moved": b"1050-%d" % (5000 + 6 * SIZE)}
        assert zk.get(paths.offset("right", "orders", "0-1"))[1].version == versions["right"]
        assert recover_offsets(zk, paths, 0, [plog]) == []  # a second run changes nothing
    finally:
        zk.stop()
        zk.close()
        m.close()
