"""Pure parts of replication: the plugin files, a reply's complete records, ``stats offsets``,
and the two storage hooks a replica uses (a log created at an offset, a forced new segment)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pymetaq.client.protocol import encode
from pymetaq.ha.config import (
    HaConfigError,
    SlaveConfig,
    load_plugins,
    merge_master_topics,
    parse_gregor_config,
    parse_plugin_option,
    parse_properties,
    parse_samsa_config,
    parse_slave_config,
)
from pymetaq.ha.replica import ReplicaError, complete_prefix
from pymetaq.ha.slave import parse_offsets
from pymetaq.ha.sync import encode_syncs, sync_commands, sync_record
from pymetaq.storage.record import encode_record
from tests.storage._helpers import batch, manager, segment_names


def test_slave_properties_as_metaq_reads_them() -> None:
    text = "# MetaQ's sample\nslaveId=2\n! comment\nslaveMaxDelayInMills : 250\nautoSyncMasterConfig true\n"
    assert parse_slave_config(text) == SlaveConfig(
        2, "meta-slave-group_2", 250, True, "async_slave.properties"
    )
    cfg = parse_slave_config("slaveId=0\nslaveGroup=replicas-a\n")
    assert (cfg.slave_group, cfg.max_delay_ms, cfg.auto_sync_master_config) == (
        "replicas-a",
        500,
        False,
    )
    assert parse_properties("  a = b c \n\n#x=y\n", "f") == {"a": ("b c", 1)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slaveGroup=x\n", "slaveId is required"),
        ("slaveId=-1\n", r"slaveId=-1 is outside 0\.\."),
        ("slaveId=one\n", "'one' is not a whole number"),
        ("slaveId=1\nslaveGrup=g\n", r"f:2: unknown key 'slaveGrup' \(did you mean slaveGroup\?\)"),
        ("slaveId=1\nslaveMaxDelayInMills=0\n", "outside 1..600000"),
        ("slaveId=1\nautoSyncMasterConfig=yes\n", "true or false"),
        ("slaveId=1\nslaveGroup=a/b\n", "not a valid group name"),
    ],
)
def test_bad_slave_properties_name_the_line_and_key(text: str, message: str) -> None:
    with pytest.raises(HaConfigError, match=message):
        parse_slave_config(text, "f")


def test_plugin_option() -> None:
    assert parse_plugin_option("metaslave=conf/async_slave.properties") == (
        "metaslave",
        "conf/async_slave.properties",
    )
    with pytest.raises(HaConfigError, match="did you mean metaslave"):
        parse_plugin_option("metaslav=x")
    with pytest.raises(HaConfigError, match="expected -F<plugin>=<file>"):
        parse_plugin_option("metaslave")


def test_complete_prefix_stops_at_a_partial_record() -> None:
    a, b = encode_record(b"x" * 10, 0, 7), encode_record(b"y" * 30, 1, 9)
    assert complete_prefix(a + b) == (len(a) + len(b), 9)
    assert complete_prefix(a + b[:-1]) == (len(a), 7)
    assert complete_prefix(a[:19]) == (0, 0)
    with pytest.raises(ReplicaError, match="negative length"):
        complete_prefix(a + b"\xff" * 20)


def test_parse_offsets_skips_bad_lines() -> None:
    body = (
        b"STATS\r\norders part 0 min_offset 10 max_offset 99\r\n"
        b"orders part x min_offset 1 max_offset 2\r\njunk\r\nEND\r\n"
    )
    assert parse_offsets(body) == {("orders", 0): (10, 99)}


def test_a_replica_log_starts_at_the_masters_first_offset_and_rolls_where_told(
    tmp_path: Path,
) -> None:
    m = manager(str(tmp_path), segment=1 << 16)
    try:
        plog = m.get_log("t", 0, start_offset=4096)
        assert plog is not None and plog.min_offset == plog.write_offset == 4096
        records = batch([b"a" * 50, b"b" * 50])
        for i, rid in enumerate((101, 102)):  # the master's ids, kept
            records[i * 70 + 8 : i * 70 + 16] = rid.to_bytes(8, "big")
        plog.append(records[:70], stamp_ids=False, new_segment=True)  # empty: no roll
        plog.append(records[70:], stamp_ids=False, new_segment=True)
        names = segment_names(plog.directory)
        assert names[0] == f"{4096:020d}.meta" and names[1].startswith(f"{4096 + 70:020d}.meta")
    finally:
        m.close()
    m = manager(str(tmp_path), segment=1 << 16)
    try:  # an existing log opens as it is, whatever start_offset says
        plog = m.get_log("t", 0, start_offset=0)
        assert plog is not None and (plog.min_offset, plog.write_offset) == (4096, 4096 + 140)
    finally:
        m.close()


def test_merge_master_topics_keeps_the_slaves_own_system() -> None:
    own = "; mine\n[system]\nbrokerId=0\ndataPath=/slave\n\n[topic=old]\nnumPartitions=1\n"
    master = (
        "[system]\ndataPath=/master\n[zookeeper]\nzk.zkEnable=true\n[topic=a]\nx=1\n[topic=b]\n"
    )
    merged = merge_master_topics(own, master)
    assert merged == (
        "; mine\n\n[system]\nbrokerId=0\ndataPath=/slave\n\n[topic=a]\nx=1\n\n[topic=b]\n"
    )


def test_samsa_properties() -> None:
    text = "slave=10.0.0.2:8123\nsendToSlaveTimeoutInMills=500\nrecoverOffset=true\ncallbackThreadCount=4\n"
    cfg = parse_samsa_config(text, "s")
    assert (cfg.slave_host, cfg.slave_port, cfg.send_timeout_ms, cfg.recover_offset) == (
        "10.0.0.2",
        8123,
        500,
        True,
    )
    assert (cfg.failure_threshold, cfg.check_interval_ms) == (100, 100)  # MetaQ's defaults
    with pytest.raises(HaConfigError, match="slave=host:port is required"):
        parse_samsa_config("recoverOffset=false\n", "s")
    with pytest.raises(HaConfigError, match="is not host:port"):
        parse_samsa_config("slave=nohost\n", "s")
    with pytest.raises(HaConfigError, match="unknown key 'x'"):
        parse_gregor_config("x=1\n", "g")


def test_one_role_per_broker(tmp_path: Path) -> None:
    a = tmp_path / "a.properties"
    a.write_text("slaveId=0\n")
    g = tmp_path / "g.properties"
    g.write_text("")
    assert load_plugins([f"gregor={g}"]).gregor
    with pytest.raises(HaConfigError, match="one role"):
        load_plugins([f"metaslave={a}", f"gregor={g}"])


def test_sync_commands_carry_the_stored_ids_and_flags() -> None:
    recs = encode_record(b"one", 0, 11) + encode_record(b"two!", 1, 12)
    cmds = sync_commands("t", 3, recs)
    assert [(c.topic, c.partition, c.data, c.flag, c.msg_id) for c in cmds] == [
        ("t", 3, b"one", 0, 11),
        ("t", 3, b"two!", 1, 12),
    ]
    assert b"".join(sync_record(c) for c in cmds) == recs  # the slave stores the same bytes
    bad = cmds[0].__class__("t", 3, b"one", 0, 11, checksum=1)
    with pytest.raises(ValueError, match="checksum mismatch"):
        sync_record(bad)


def test_encode_syncs_writes_what_the_codec_writes() -> None:
    recs = encode_record(b"one", 0, 11) + encode_record(b"two!", 1, 12)
    buf, count = encode_syncs("t", 3, recs, 41)
    want = b"".join(
        encode(dataclasses.replace(c, opaque=41 + i))
        for i, c in enumerate(sync_commands("t", 3, recs))
    )
    assert (bytes(buf), count) == (want, 2)
