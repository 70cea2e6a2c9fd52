"""MetaQ's ZooKeeper layout: exact paths, names, values and zk:// URLs (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pymetaq.client.protocol.zk import (
    BrokerNode,
    TopicBroker,
    ZkPaths,
    ZkUrl,
    broker_node_name,
    check_group,
    check_name,
    decode_offset,
    decode_partition_count,
    decode_topic_broker,
    decode_topics,
    encode_offset,
    encode_partition_count,
    encode_topics,
    is_zk_url,
    meta_url,
    parse_broker_node,
    parse_meta_url,
    parse_partition_name,
    parse_zk_url,
    partition_name,
)


def test_every_path_of_metaq_table() -> None:
    p = ZkPaths()
    assert p.broker_ids == "/meta/brokers/ids"
    assert p.broker(3) == "/meta/brokers/ids/3"
    assert p.broker_master(3) == "/meta/brokers/ids/3/master"
    assert p.broker_slave(3, 1) == "/meta/brokers/ids/3/slave1"
    assert p.broker_role(BrokerNode(3, 2)) == "/meta/brokers/ids/3/slave2"
    assert p.broker_checksum(3) == "/meta/brokers/ids/3/master_config_checksum"
    assert p.topic_legacy("t", "3-m") == "/meta/brokers/topics/t/3-m"
    assert p.topic_pub("t", "3-m") == "/meta/brokers/topics-pub/t/3-m"
    assert p.topic_sub("t", "3-s1") == "/meta/brokers/topics-sub/t/3-s1"
    assert p.topic_sub("t") == "/meta/brokers/topics-sub/t"
    assert p.consumer_ids("g") == "/meta/consumers/g/ids"
    assert p.consumer_id("g", "g_c1") == "/meta/consumers/g/ids/g_c1"
    assert p.owners("g", "t") == "/meta/consumers/g/owners/t"
    assert p.owner("g", "t", "3-0") == "/meta/consumers/g/owners/t/3-0"
    assert p.offsets("g") == "/meta/consumers/g/offsets"
    assert p.offset("g", "t", "3-0") == "/meta/consumers/g/offsets/t/3-0"


@pytest.mark.parametrize(
    ("root", "path"),
    [("/meta", "/meta/brokers/ids"), ("/a/b/", "/a/b/brokers/ids"), ("/", "/brokers/ids")],
)
def test_root_is_a_prefix(root: str, path: str) -> None:
    assert ZkPaths(root).broker_ids == path


@pytest.mark.parametrize("bad", ["meta", "/a/../b", "/a//b"])
def test_bad_roots_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        ZkPaths(bad)


def test_values_are_metaq_bytes() -> None:
    assert TopicBroker(4, "3-m").encode() == b'{"numParts":4,"broker":"3-m"}'
    assert decode_topic_broker(b'{"broker":"3-s2","numParts":4}') == TopicBroker(4, "3-s2")
    assert encode_partition_count(12) == b"12" and decode_partition_count(b" 12\n") == 12
    assert encode_offset(-1, 1024) == b"-1-1024" and decode_offset(b"-1-1024") == (-1, 1024)
    assert decode_offset(b"77-2048") == (77, 2048) and decode_offset(b"512") == (-1, 512)
    assert encode_topics(("a", "b")) == b"a,b" and decode_topics(b"a, b,,") == ("a", "b")
    assert decode_topics(None) == () and decode_topics(b"") == ()
    assert meta_url("10.0.0.1", 8123) == "meta://10.0.0.1:8123"
    assert parse_meta_url(b"meta://10.0.0.1:8123") == ("10.0.0.1", 8123)
    assert parse_meta_url("meta://[::1]:8123") == ("::1", 8123)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"[]",
        b'{"numParts":"4","broker":"3-m"}',
        b'{"numParts":true,"broker":"3-m"}',
        b'{"numParts":-1,"broker":"3-m"}',
        b'{"numParts":4,"broker":"x"}',
        b'{"numParts":4}',
        b"\xff\xfe",
    ],
)
def test_hostile_topic_broker_values_raise_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_topic_broker(raw)


@pytest.mark.parametrize("raw", [b"meta://h", b"http://h:1", b"meta://:1", b"meta://h:0", b"x"])
def test_bad_meta_urls(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_meta_url(raw)


def test_node_and_partition_names() -> None:
    assert broker_node_name(3) == "3-m" and broker_node_name(3, 1) == "3-s1"
    assert parse_broker_node("3-m") == BrokerNode(3, None) and BrokerNode(3).is_master
    assert parse_broker_node("12-s0") == BrokerNode(12, 0)
    assert partition_name(3, 7) == "3-7" and parse_partition_name("3-7") == (3, 7)
    for bad in ("3", "m-3", "3-x", "-1-m", "03-m", "3-m ", "3-s", "3-s01"):
        with pytest.raises(ValueError):
            parse_broker_node(bad)
    for bad in ("3", "3-", "-3", "a-1", "3-1-1", "03-1", " 3-1"):
        with pytest.raises(ValueError):
            parse_partition_name(bad)


@given(st.integers(0, 10**9), st.one_of(st.none(), st.integers(0, 10**9)))
def test_broker_node_round_trip(broker_id: int, slave: int | None) -> None:
    assert parse_broker_node(broker_node_name(broker_id, slave)) == BrokerNode(broker_id, slave)


@given(st.integers(-1, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_offset_round_trip(msg_id: int, offset: int) -> None:
    assert decode_offset(encode_offset(msg_id, offset)) == (msg_id, offset)


@given(st.binary(max_size=64))
def test_arbitrary_values_raise_only_value_error(raw: bytes) -> None:
    for fn in (decode_topic_broker, decode_partition_count, decode_offset, parse_meta_url):
        try:
            fn(raw)
        except ValueError:
            pass
    decode_topics(raw)


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "a\x00", "a\nb", "\ud800", "x" * 256, "\u0085"]
)
def test_names_that_cannot_be_znodes(name: str) -> None:
    with pytest.raises(ValueError):
        check_name("topic", name)
    with pytest.raises(ValueError):
        ZkPaths().topic_pub(name)


def test_group_names_as_metaq() -> None:
    assert check_group("meta-group_1") == "meta-group_1"
    for bad in ("a b", "a.b", "a:b", "a/b", "a*", "a,b", ""):
        with pytest.raises(ValueError):
            check_group(bad)


@pytest.mark.parametrize(
    ("url", "hosts", "root"),
    [
        ("zk://127.0.0.1:2181", "127.0.0.1:2181", "/meta"),
        ("zk://a:1,b:2,c:3/meta", "a:1,b:2,c:3", "/meta"),
        ("ZK://a/prod/meta/", "a:2181", "/prod/meta"),
        ("zk://a:1/", "a:1", ""),
        ("zk://[::1]:2181,[fe80::1]/x", "[::1]:2181,[fe80::1]:2181", "/x"),
        (" zk://a:1 , b:2 ", "a:1,b:2", "/meta"),
    ],
)
def test_zk_urls(url: str, hosts: str, root: str) -> None:
    parsed = parse_zk_url(url)
    assert parsed == ZkUrl(hosts, root) and is_zk_url(url)
    assert parse_zk_url(str(parsed)) == parsed


@pytest.mark.parametrize(
    "url",
    ["meta://a:1", "zk://", "zk:///meta", "zk://a:0", "zk://a:65536", "zk://a:x", "zk://a,,b",
     "zk://[::1", "zk://a b:1", "zk://a:1/../x"],
)  # fmt: skip
def test_bad_zk_urls(url: str) -> None:
    with pytest.raises(ValueError):
        parse_zk_url(url)
