"""server.ini loading: MetaQ's keys and defaults, arithmetic, patterns, and exact error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from pymetaq.server.config import SYSTEM_KEYS, ZK_KEYS, load_config, parse_config
from pymetaq.server.errors import ConfigError
from pymetaq.server.ini import eval_int

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_is_standalone_group_commit_with_example_topics(tmp_path: Path) -> None:
    cfg = load_config(REPO / "conf" / "server.ini", cwd=str(tmp_path))
    assert cfg.zookeeper.enabled is False
    assert cfg.system.unflush_threshold == 0
    assert cfg.system.data_path == str(tmp_path / "data")
    assert cfg.system.max_transfer_size == 1024 * 1024
    assert cfg.topic_config("test") is not None
    pattern = cfg.topic_config("log-nginx")
    assert pattern is not None and pattern.name == "log-*"


def test_metaq_defaults_when_keys_are_absent(tmp_path: Path) -> None:
    cfg = parse_config("[system]\n[topic=t]\n", cwd=str(tmp_path))
    s = cfg.system
    assert (s.broker_id, s.server_port, s.dashboard_http_port) == (0, 8123, 8120)
    assert (s.num_partitions, s.unflush_threshold, s.unflush_interval_ms) == (1, 1000, 10000)
    assert (s.max_segment_size, s.max_transfer_size) == (1 << 30, 1 << 20)
    assert (s.delete_policy, s.delete_when) == ("delete,168", "0 0 6,18 * * ?")
    assert (s.max_tx_timeout_seconds, s.flush_tx_log_at_commit) == (60, 1)
    assert (s.accept_publish, s.accept_subscribe, s.stat, s.update_consumer_offsets) == (
        True,
        True,
        False,
        False,
    )
    assert s.data_path == str(Path.home() / "meta")
    assert s.data_log_path == s.data_path
    assert cfg.zookeeper.enabled is True and cfg.zookeeper.root == "/meta"


def test_every_metaq_key_is_accepted(tmp_path: Path) -> None:
    metaq = [
        "brokerId=1",
        "hostName=127.0.0.1",
        "serverPort=9000",
        "dashboardHttpPort=9001",
        "dataPath=d",
        "dataLogPath=l",
        "appClassPath=p",
        "numPartitions=2",
        "unflushThreshold=0",
        "unflushInterval=1000",
        "maxSegmentSize=1024*1024",
        "maxTransferSize=512*1024",
        "getProcessThreadCount=4",
        "putProcessThreadCount=4",
        "deletePolicy=archive,24,true",
        "deleteWhen=0 0 1 * * ?",
        "quartzThreadCount=5",
        "maxCheckpoints=3",
        "checkpointInterval=60*60*1000",
        "maxTxTimeoutTimerCapacity=30000",
        "maxTxTimeoutInSeconds=60",
        "flushTxLogAtCommit=2",
        "acceptPublish=true",
        "acceptSubscribe=false",
        "stat=true",
        "updateConsumerOffsets=true",
        "loadMessageStoresInParallel=false",
    ]
    zk = [
        "zk.zkEnable=false",
        "zk.zkConnect=a:1,b:2",
        "zk.zkSessionTimeoutMs=30000",
        "zk.zkConnectionTimeoutMs=30000",
        "zk.zkSyncTimeMs=5000",
        "zk.zkRoot=/meta",
    ]
    topic = [
        "numPartitions=3",
        "stat=false",
        "deletePolicy=delete,10",
        "deleteWhen=0 0 2 * * ?",
        "dataPath=t",
        "unflushInterval=100",
        "unflushThreshold=5",
        "acceptSubscribe=true",
        "acceptPublish=false",
        "group.g1=com.example.Filter",
    ]
    text = "\n".join(["[system]", *metaq, "[zookeeper]", *zk, "[topic=orders]", *topic])
    cfg = parse_config(text, cwd=str(tmp_path))
    assert cfg.system.max_segment_size == 1 << 20
    assert cfg.system.checkpoint_interval_ms == 3600000
    assert cfg.zookeeper.connect == "a:1,b:2"
    t = cfg.topic_config("orders")
    assert t is not None
    assert (t.num_partitions, t.unflush_threshold, t.accept_publish) == (3, 5, False)
    assert t.data_path == str(tmp_path / "t")
    assert t.group_filters == (("g1", "com.example.Filter"),)
    assert cfg.system.data_log_path == str(tmp_path / "l")
    assert len(metaq) + 22 == len(SYSTEM_KEYS) and len(zk) == len(ZK_KEYS)  # + pymetaq extensions


def test_topic_keys_inherit_system_and_patterns_match_after_exact_names(tmp_path: Path) -> None:
    text = (
        "[system]\nnumPartitions=4\nunflushThreshold=0\n"
        "[topic=log-*]\nnumPartitions=2\n"
        "[topic=log-special]\n"
        "[topic=*]\nacceptPublish=false\n"
    )
    cfg = parse_config(text, cwd=str(tmp_path))
    special = cfg.topic_config("log-special")
    assert special is not None and (special.num_partitions, special.unflush_threshold) == (4, 0)
    other = cfg.topic_config("log-x")
    assert other is not None and other.name == "log-*" and other.num_partitions == 2
    anything = cfg.topic_config("zzz")
    assert anything is not None and anything.accept_publish is False
    assert cfg.topic_config("log-") is not None and cfg.topic_config("log-").name == "log-*"  # type: ignore[union-attr]


def test_pattern_dots_are_literal(tmp_path: Path) -> None:
    cfg = parse_config("[topic=a.b*]\n", cwd=str(tmp_path))
    assert cfg.topic_config("a.bc") is not None
    assert cfg.topic_config("axbc") is None


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1024*1024", 1 << 20),
        ("10 * 60 * 1000", 600000),
        ("(1+2)*3", 9),
        ("-5", -5),
        ("8/2", 4),
        ("7", 7),
    ],
)
def test_arithmetic(expr: str, value: int) -> None:
    assert eval_int(expr) == value


@pytest.mark.parametrize(
    "expr", ["__import__('os')", "2**10", "1/3", "abc", "1 if 1 else 2", "[1]", "1<<4", "1/0", ""]
)
def test_arithmetic_rejects_everything_else(expr: str) -> None:
    with pytest.raises(ValueError):
        eval_int(expr)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[system]\nbrokerId=0\nnumPartition=2\n[topic=t]\n",
            "cfg.ini:3: unknown key 'numPartition' in section [system]; "
            "did you mean 'numPartitions'?",
        ),
        (
            "[system]\n[topic=t]\nunflushTreshold=0\n",
            "cfg.ini:3: unknown key 'unflushTreshold' in section [topic=t]; "
            "did you mean 'unflushThreshold'?",
        ),
        (
            "[system]\n[topic=t]\nmaxSegmentSize=1\n",
            "cfg.ini:3: unknown key 'maxSegmentSize' in section [topic=t] "
            "(it is a [system]-only key)",
        ),
        (
            "[zookeeper]\nzk.zkConect=x\n[topic=t]\n",
            "cfg.ini:2: unknown key 'zk.zkConect' in section [zookeeper]; "
            "did you mean 'zk.zkConnect'?",
        ),
        (
            "[system]\nserverPort=80a\n[topic=t]\n",
            "cfg.ini:2: bad value for 'serverPort' in section [system]: "
            "'80a' is not a number or simple arithmetic",
        ),
        (
            "[system]\nstat=yes\n[topic=t]\n",
            "cfg.ini:2: bad value for 'stat' in section [system]: "
            "'yes' is not a boolean (true or false)",
        ),
        (
            "[system]\nbrokerId=2000\n[topic=t]\n",
            "cfg.ini:2: bad value for 'brokerId' in section [system]: "
            "2000 must be 0..1023 (10 bits of the message id)",
        ),
        (
            "[sytem]\n[topic=t]\n",
            "cfg.ini:1: unknown section [sytem]; did you mean 'system'?",
        ),
        ("[system]\n", "cfg.ini: no [topic=NAME] section; MetaQ requires at least one topic"),
        ("brokerId=1\n", "cfg.ini:1: 'brokerId=1' is outside any [section]"),
        (
            "[system]\nbrokerId=1\nbrokerId=2\n[topic=t]\n",
            "cfg.ini:3: key 'brokerId' given twice in section [system]",
        ),
        ("[system]\njunk\n", "cfg.ini:2: expected 'key=value', got 'junk'"),
        (
            "[zookeeper]\nzk.zkEnable=true\n[topic=t]\ndeletePolicy=consumed,a,b\n",
            "cfg.ini:4: bad value for 'deletePolicy' in section [topic=t]: 'consumed,a,b' must "
            "look like 'delete,168', 'archive,168,true' or 'consumed,<group>+<group>,1' (the "
            "third field 'b' is not a minimum age N[s|m|h]; several groups are joined with '+' "
            "(consumed,a+b))",
        ),
        (
            "[system]\ndeletePolicy=consumed,a b\n[topic=t]\n",
            "cfg.ini:2: bad value for 'deletePolicy' in section [system]: 'consumed,a b' must "
            "look like 'delete,168', 'archive,168,true' or 'consumed,<group>+<group>,1' (group "
            "name 'a b' contains ' '; MetaQ forbids ' !\"#$%&\\'()*+,./:;<=>?[]^`~' and spaces "
            "in group names)",
        ),
        (
            "[system]\n[topic=t]\nmaxRetention=1w\n",
            "cfg.ini:3: bad value for 'maxRetention' in section [topic=t]: '1w' must be an age "
            "N[s|m|h] (no unit: hours; 0 = no cap) ('1w' is not an age: N[s|m|h] (no unit: "
            "hours))",
        ),
        (
            "[system]\nsegmentWrites=mapped\n[topic=t]\n",
            "cfg.ini:2: bad value for 'segmentWrites' in section [system]: 'mapped' must be "
            "pwrite or mmap",
        ),
        (
            "[system]\nproducersSync=range\n[topic=t]\n",
            "cfg.ini:2: bad value for 'producersSync' in section [system]: 'range' must be "
            "auto or fdatasync",
        ),
        (
            "[system]\noffsetStorage=mysql\n[topic=t]\n",
            "cfg.ini:2: bad value for 'offsetStorage' in section [system]: 'mysql' must be zk "
            "or sql",
        ),
        (
            "[zookeeper]\nzk.zkEnable=false\n[topic=t]\ndeletePolicy=consumed,*\n",
            "cfg.ini:3: [topic=t] (line 3) has deletePolicy=consumed, which reads the "
            "consumers' offsets from ZooKeeper (offsetStorage=zk), but [zookeeper] "
            "zk.zkEnable=false; enable ZooKeeper, or set offsetStorage=sql and offsetStorageUrl",
        ),
        (
            "[system]\noffsetStorage=sql\n[topic=t]\ndeletePolicy=consumed,g\n",
            "cfg.ini:2: [topic=t] (line 3) has deletePolicy=consumed with offsetStorage=sql, "
            "but offsetStorageUrl is empty; set it to the SQLAlchemy URL the consumers commit to",
        ),
        (
            "[system]\nofsetStorageUrl=x\n[topic=t]\n",
            "cfg.ini:2: unknown key 'ofsetStorageUrl' in section [system]; did you mean "
            "'offsetStorageUrl'?",
        ),
        (
            "[system]\noffsetStorageUrl=mysql://x\n[topic=t]\n",
            "cfg.ini:2: bad value for 'offsetStorageUrl' in section [system]: 'mysql://x' must "
            "be a SQLAlchemy URL (sqlite:///..., postgresql+psycopg://...)",
        ),
    ],
)
def test_config_errors_name_file_line_section_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "cfg.ini", cwd="/tmp")
    assert str(info.value) == message


def test_consumed_policy_keys() -> None:
    text = (
        "[system]\noffsetStorage=sql\noffsetStorageUrl=sqlite:///o.db\nmaxRetention=30m\n"
        "[topic=a]\ndeletePolicy=consumed,billing+audit,0.5\n"
        "[topic=b]\ndeletePolicy=consumed,*\nmaxRetention=0\n[topic=c]\n"
    )
    cfg = parse_config(text, "cfg.ini", cwd="/tmp")
    a, b, c = (cfg.topic_config(n) for n in "abc")
    assert a is not None and b is not None and c is not None
    assert (a.store_config().max_retention_seconds, b.store_config().max_retention_seconds) == (
        1800.0,
        0.0,
    )
    assert a.retains_until_consumed and b.retains_until_consumed and not c.retains_until_consumed
    sys_ = cfg.system
    assert (sys_.offset_storage, sys_.offset_storage_table) == (
        "sql",
        "meta_topic_partition_group_offset",
    )


def test_a_consumed_policy_in_system_is_every_topics_default() -> None:
    text = (
        "[system]\ndeletePolicy=consumed,*,2h\n[zookeeper]\nzk.zkEnable=true\n"
        "[topic=a]\n[topic=b]\ndeletePolicy=delete,1\n"
    )
    cfg = parse_config(text, "cfg.ini", cwd="/tmp")
    a, b = cfg.topic_config("a"), cfg.topic_config("b")
    assert a is not None and b is not None
    assert (a.delete_policy, a.retains_until_consumed) == ("consumed,*,2h", True)
    assert (b.delete_policy, b.retains_until_consumed) == ("delete,1", False)
    with pytest.raises(ConfigError, match=r"cfg.ini:2: \[system\] has deletePolicy=consumed \("):
        parse_config(text.replace("zk.zkEnable=true", "zk.zkEnable=false"), "cfg.ini")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.ini")


def test_checksum_is_crc32_of_the_file(tmp_path: Path) -> None:
    import zlib

    text = "[system]\n[topic=t]\n"
    assert parse_config(text, cwd=str(tmp_path)).checksum == zlib.crc32(text.encode())
