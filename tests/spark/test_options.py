"""Unit tests of format ``pymetaq``'s pure parts (no Spark, no broker): option parsing, the
offset JSON, admission limits, data-loss decisions, the header walk, range splitting."""

from __future__ import annotations

import json

import pytest

from pymetaq.client.transport.records import build_record
from pymetaq.client.types import TopicPartition
from pymetaq.spark.offsets import (
    DataLoss,
    canonical,
    check_start,
    from_offsets,
    parse_offsets_option,
    resolve,
    split_budget,
    to_json,
    walk_records,
)
from pymetaq.spark.options import SparkOptionError, read_options, write_options

SERVERS = {"pymetaq.servers": "meta://127.0.0.1:8123"}
A0, A1, B0 = (TopicPartition("a", 0, 0), TopicPartition("a", 0, 1), TopicPartition("b", 1, 0))


def test_read_options_defaults_and_case_insensitive_names():
    o = read_options({**SERVERS, "SUBSCRIBE": "a, b,a"}, streaming=False)
    assert o.subscription.topics == ("a", "b")
    assert (o.starting, o.ending, o.fail_on_data_loss) == ("earliest", "latest", True)
    s = read_options({**SERVERS, "subscribe": "a", "maxBytesPerTrigger": "100"}, streaming=True)
    assert s.starting == "latest" and s.max_bytes_per_trigger == 100


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "a"}, "'pymetaq.servers' is required"),
        ({**SERVERS}, "exactly one of the options"),
        ({**SERVERS, "subscribe": "a", "assign": '{"a":["0-0"]}'}, r"given: subscribe, assign"),
        ({**SERVERS, "subscribe": "a/../b"}, "invalid topic name"),
        ({**SERVERS, "subscribePattern": "("}, "bad regex"),
        ({**SERVERS, "assign": '{"a":["0_0"]}'}, "not a partition key"),
        ({**SERVERS, "assign": "[1]"}, "must be JSON like"),
        ({**SERVERS, "subscribe": "a", "startingOffsets": "soon"}, "must be 'earliest'"),
        ({**SERVERS, "subscribe": "a", "startingOffsets": '{"a":{"0-0":-3}}'}, "bad offset -3"),
        ({**SERVERS, "subscribe": "a", "startingOffsets": '{"a":{"0-0":true}}'}, "bad offset"),
        ({**SERVERS, "subscribe": "a", "endingOffsets": "earliest"}, "cannot be earliest"),
        ({**SERVERS, "subscribe": "a", "startingOffsets": "latest"}, "cannot be latest"),
        ({**SERVERS, "subscribe": "a", "failOnDataLoss": "maybe"}, "'true' or 'false'"),
        ({**SERVERS, "subscribe": "a", "minPartitions": "0"}, "must be >= 1"),
        ({**SERVERS, "subscribe": "a", "minPartitions": "x"}, "must be an integer"),
        ({"pymetaq.servers": "http://x", "subscribe": "a"}, "'pymetaq.servers'"),
    ],
)
def test_bad_read_options(options, message):
    with pytest.raises(SparkOptionError, match=message):
        read_options(options, streaming=False)


def test_streaming_refuses_ending_offsets_and_write_options_check_topic():
    with pytest.raises(SparkOptionError, match="batch reads only"):
        read_options({**SERVERS, "subscribe": "a", "endingOffsets": "latest"}, streaming=True)
    assert write_options({**SERVERS, "topic": "t"}).topic == "t"
    with pytest.raises(SparkOptionError, match="invalid topic name"):
        write_options({**SERVERS, "topic": "a b"})


def test_group_id_and_offset_store_options():
    base = {**SERVERS, "subscribe": "a"}
    o = read_options({**base, "GROUPID": "etl"}, streaming=True)
    assert (o.group_id, o.offset_store, o.group) == ("etl", None, "etl")  # gets named by it
    o = read_options({**base, "groupId": "etl", "pymetaq.group": "g2"}, streaming=True)
    assert (o.group_id, o.group) == ("etl", "g2")
    o = read_options({**base, "groupId": "etl", "offsetStore": "file:/tmp/x"}, streaming=True)
    assert o.offset_store == "file:/tmp/x"
    assert read_options(base, streaming=True).group_id is None  # no group: no commits
    assert read_options(base, streaming=True).group == "pymetaq-spark"


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"groupId": "g"}, False, "'groupId' and 'offsetStore' are for streaming reads"),
        ({"groupId": "a b"}, True, "option 'groupId': group name 'a b' contains"),
        ({"groupId": "a/b"}, True, "option 'groupId': group name 'a/b' cannot be"),
        ({"offsetStore": "file:/x"}, True, "'offsetStore' needs 'groupId'"),
        ({"groupId": "g", "offsetStore": "redis://x"}, True, "must be zk://"),
    ],
)
def test_bad_group_options(options, streaming, message):
    with pytest.raises(SparkOptionError, match=message):
        read_options({**SERVERS, "subscribe": "a", **options}, streaming=streaming)


def test_offset_json_is_canonical_and_round_trips():
    offsets = {B0: 7, A1: 5, A0: 3}
    assert list(canonical(offsets)) == ["a", "b"]
    assert list(canonical(offsets)["a"]) == ["0-0", "0-1"]
    text = to_json(offsets)
    assert text == '{"a":{"0-0":3,"0-1":5},"b":{"1-0":7}}'
    assert from_offsets(json.loads(text)) == offsets
    assert to_json(dict(reversed(list(offsets.items())))) == text


def test_resolve_earliest_latest_and_json():
    bounds = {A0: (10, 100), A1: (0, 50)}
    assert resolve("earliest", bounds, what="x") == {A0: 10, A1: 0}
    assert resolve("latest", bounds, what="x") == {A0: 100, A1: 50}
    spec = parse_offsets_option('{"a": {"0-0": -1}}', "x")
    assert resolve(spec, bounds, what="x") == {A0: 100, A1: 0}  # unnamed: earliest
    with pytest.raises(SparkOptionError, match="not read: b/1-0"):
        resolve({"b": {"1-0": 1}}, bounds, what="x")


def test_data_loss_decisions():
    assert check_start(A0, 20, 10, 100, True) == 20
    with pytest.raises(DataLoss, match=r"offsets 5\.\.10 are no longer stored"):
        check_start(A0, 5, 10, 100, True)
    assert check_start(A0, 5, 10, 100, False) == 10
    with pytest.raises(DataLoss, match="log ends at 100"):
        check_start(A0, 150, 10, 100, True)
    assert check_start(A0, 150, 10, 100, False) == 100


def test_split_budget_in_proportion_to_backlog():
    assert split_budget({A0: 100, A1: 300}, 1000) == {A0: 100, A1: 300}
    assert split_budget({A0: 100, A1: 300}, 40) == {A0: 10, A1: 30}
    got = split_budget({A0: 1, A1: 1000, B0: 0}, 10)
    assert got[A0] == 1 and got[B0] == 0 and got[A1] <= 10


def test_walk_records_stops_at_budget_and_takes_one_oversized_record():
    buf = b"".join(build_record(b"x" * 10) for _ in range(5))  # 30 bytes each
    assert walk_records(buf, 100, max_bytes=1000, max_records=3) == (190, 3)
    assert walk_records(buf, 100, max_bytes=65, max_records=99) == (160, 2)
    assert walk_records(buf, 100, max_bytes=5, max_records=99) == (130, 1)
    assert walk_records(buf, 100, max_bytes=5, max_records=99, at_least_one=False) == (100, 0)
    assert walk_records(buf[:-1], 0, max_bytes=1000, max_records=99) == (120, 4)


def test_split_counts_for_min_partitions():
    from pymetaq.spark.batch_reader import split_counts

    assert split_counts([100, 300], None) == [1, 1]
    assert split_counts([100, 300], 2) == [1, 1]
    assert split_counts([100, 300], 8) == [2, 6]
