"""Unit tests of the monitoring logic: the lag map's bounds, MetaQ's realtime formats, the HTTP
head parser against hostile input, the reload guard, closed partitions, the tools' parsers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import pytest

from pymetaq.client.cli.admin import partitions
from pymetaq.client.cli.top import parse_lag, parse_topics
from pymetaq.client.protocol import AdminCommand, LocalProtocolError, encode
from pymetaq.server.config import BrokerConfig, TopicConfig
from pymetaq.server.http.server import Request, _Bad, parse_head
from pymetaq.server.monitor.lag import LagTracker
from pymetaq.server.monitor.ops import ClosedPartitions, is_loopback
from pymetaq.server.stats import Realtime, Stats, java_decimal
from pymetaq.storage import ReadResult, ReadStatus
from pymetaq.storage.ids import EPOCH_MS, TIME_SHIFT
from pymetaq.storage.metrics import StoreMetrics
from pymetaq.storage.record import HEADER


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeRegion:
    data: bytes
    closed: bool = False

    def read_bytes(self) -> bytes:
        return self.data

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeLog:
    """A partition log's reading face: records at known offsets."""

    min_offset: int
    max_offset: int
    records: dict[int, bytes] = field(default_factory=dict)

    def read(self, offset: int, max_size: int) -> ReadResult:
        data = self.records.get(offset, b"\xff" * 20)[:max_size]
        return ReadResult(ReadStatus.OK, offset, FakeRegion(data))  # type: ignore[arg-type]


def record_at(born_s: float, length: int = 5) -> bytes:
    msg_id = (int(born_s * 1000) - EPOCH_MS) << TIME_SHIFT
    return HEADER.pack(length, 0, msg_id, 0) + b"x" * length


def test_lag_map_is_bounded_and_forgets_the_longest_idle() -> None:
    clock = Clock()
    lag = LagTracker(3, clock=clock, wall=clock)
    for i, group in enumerate(("a", "b", "c")):
        clock.now += 1
        lag.record(group, "t", 0, i)
    clock.now += 1
    lag.record("a", "t", 0, 10)  # a is fresh again: b is now the longest idle
    lag.record("d", "t", 0, 0)
    assert (len(lag), lag.evicted) == (3, 1)
    log = FakeLog(0, 100)
    lookup: Any = lambda t, p: log  # noqa: E731 - a fake log for every partition
    assert {r.group for r in lag.rows(lookup)} == {"a", "c", "d"}
    lag.record("x" * 256, "t", 0, 0)  # names over 255 characters are not tracked
    assert (len(lag), lag.refused) == (3, 1)
    clock.now += 25 * 3600  # a day idle: forgotten when next read
    assert lag.rows(lookup) == [] and len(lag) == 0


def test_lag_rows_from_record_ids() -> None:
    clock = Clock()
    clock.now = 1_700_000_100.0
    log = FakeLog(50, 200, {60: record_at(1_700_000_040.5), 75: record_at(1_700_000_099.0)})
    lag = LagTracker(10, clock=clock, wall=clock)
    lag.record("behind", "t", 0, 60)
    lag.record("deleted", "t", 0, 10)  # below the log start: counts from the start
    lag.record("odd", "t", 0, 61)  # not a record start: the age is unknown
    lag.record("done", "t", 0, 200)
    lag.record("gone", "t", 1, 0)  # no such partition any more: dropped
    lookup: Any = lambda t, p: log if p == 0 else None  # noqa: E731
    rows = {r.group: r for r in lag.rows(lookup)}
    assert set(rows) == {"behind", "deleted", "done", "odd"} and len(lag) == 4
    assert (rows["behind"].lag_bytes, rows["behind"].lag_seconds) == (140, 59.5)
    assert rows["deleted"].lag_bytes == 150 and rows["deleted"].fetch_offset == 10
    assert rows["odd"].lag_seconds is None and rows["odd"].lag_bytes == 139
    assert (rows["done"].lag_bytes, rows["done"].lag_seconds) == (0, 0.0)


def test_java_decimal_format() -> None:
    cases = {
        5: "5",
        1.25: "1.25",
        0.125: "0.12",
        0.135: "0.14",
        2 / 3: "0.67",
        0.001: "0",
        1e6: "1000000",
    }
    assert {k: java_decimal(k) for k in cases} == cases
    stat = Realtime()
    assert (
        stat.describe(0.5)
        == "Count=0,Value=0,Value/Count=invalid,Count/Duration=invalid,Duration=0"
    )
    stat.count, stat.value = 4, 5
    assert stat.describe(30.9) == "Count=4,Value=5,Value/Count=1.25,Count/Duration=0.13,Duration=30"


def test_realtime_null_invalid_key_and_reset_keeps_counters() -> None:
    clock = Clock()
    stats = Stats(clock=clock)
    config = BrokerConfig(topics=(TopicConfig("a", stat=True), TopicConfig("b", stat=True)))
    assert b"realtime_put null\r\n" in stats.render("realtime", config, 1, [])
    stats.realtime("put", "a", 3)
    stats.counters["cmd_put"] = 7
    body = stats.render("b", config, 1, []).decode()
    assert "topic_realtime_put Invalid keyTwo:b\r\n" in body
    assert "topic_realtime_get null\r\n" in body
    assert stats.render("reset", config, 1, []) == b"STATS\r\nreset ok\r\nEND\r\n"
    assert stats.counters["cmd_put"] == 7  # MetaQ's reset leaves the counters
    assert "topic_realtime_put Count=0,Value=0," in stats.render("a", config, 1, []).decode()


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /", 400),
        (b"GET / HTTP/2.0", 505),
        (b"GET http://x/ HTTP/1.1", 400),
        (b"GET / HTTP/1.1\r\nno-colon", 400),
        (b"GET / HTTP/1.1\r\n x: folded", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", 501),
        (b"POST / HTTP/1.1\r\nContent-Length: -1", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 99999999999999", 400),
        (b"GET / HTTP/1.1" + b"\r\nh: v" * 101, 431),
    ],
)
def test_http_head_parser_refuses_hostile_heads(head: bytes, status: int) -> None:
    with pytest.raises(_Bad) as err:
        parse_head(head, "127.0.0.1")
    assert err.value.response.status == status


def test_http_head_parser_and_keep_alive() -> None:
    req, length, keep = parse_head(b"GET /topics/a%20b?x=1&x=2 HTTP/1.1\r\nHost: h", "::1")
    assert (req.path, req.query, req.headers, length, keep) == (
        "/topics/a b", {"x": ["1", "2"]}, {"host": "h"}, 0, True,
    )  # fmt: skip
    assert parse_head(b"GET / HTTP/1.1\r\nConnection: close", "x")[2] is False
    assert parse_head(b"GET / HTTP/1.0", "x")[2] is False
    assert parse_head(b"GET / HTTP/1.0\r\nConnection: keep-alive", "x")[2] is True


def test_loopback_and_the_reload_guard() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"]))
    assert not any(map(is_loopback, ["192.0.2.7", "::ffff:192.0.2.7", "2001:db8::1", "?", ""]))
    from pymetaq.server.http.app import DashboardApp

    app = DashboardApp.__new__(DashboardApp)
    app.token = "secret"

    def request(peer: str, body: bytes, **headers: str) -> Request:
        return Request("POST", "/reload-config", {}, {"host": "h:1", **headers}, body, peer)

    assert app.refusal(request("127.0.0.1", b"token=secret")) is None
    assert "loopback" in (app.refusal(request("192.0.2.7", b"token=secret")) or "")
    assert "CSRF" in (app.refusal(request("127.0.0.1", b"token=guess")) or "")
    assert "CSRF" in (app.refusal(request("127.0.0.1", b"")) or "")
    assert "Origin" in (app.refusal(request("::1", b"token=secret", origin="http://evil")) or "")
    assert app.refusal(request("::1", b"token=secret", origin="http://h:1")) is None


def test_closed_partitions_check_put() -> None:
    closed = ClosedPartitions()
    tc = TopicConfig("t", num_partitions=3)

    class B:
        host, port = "127.0.0.1", 8123
        config = BrokerConfig()

    closed.close("t", range(0, 2))
    assert closed.check_put(B(), tc, "t", 2) == (2, None)  # type: ignore[arg-type]
    assert closed.check_put(B(), tc, "t", -1) == (2, None)  # type: ignore[arg-type]
    part, why = closed.check_put(B(), tc, "t", 1)  # type: ignore[arg-type]
    assert part == 1 and why is not None and why.endswith("partition[0-1] has been closed")
    closed.close("t", range(2, 3))
    assert closed.check_put(B(), tc, "t", -1)[1] == "every partition of `t` is closed"  # type: ignore[arg-type]
    assert closed.open("t", range(1, 2)) == [1] and closed.count() == 2
    assert closed.open("t", None) == [0, 2] and not closed


def test_store_metrics_histograms() -> None:
    m = StoreMetrics()
    m.sync_round(0.0004, 4096, 10)
    m.sync_round(20.0, 0, 0)  # beyond the last bucket; no batch (roll work only)
    m.retention_run([("deleted", 100), ("deleted", 50)])
    snap = m.snapshot()
    cumulative = snap.fsync_seconds.cumulative()
    assert cumulative[2] == (0.0005, 1) and cumulative[-1] == (float("inf"), 2)
    assert (snap.batch_bytes.count, snap.batch_messages.total) == (1, 10.0)
    assert (snap.retention_runs, snap.retention_removed) == (1, {"deleted": (2, 150)})


def test_tools_parse_what_the_broker_sends() -> None:
    body = (
        b"STATS\r\ng t part 0 fetch_offset 5 max_offset 9 lag_bytes 4 lag_seconds unknown "
        b"idle_seconds 0.5\r\nEND\r\n"
    )
    (row,) = parse_lag(body)
    assert (row.group, row.topic, row.partition, row.lag_bytes, row.lag_seconds) == (
        "g",
        "t",
        0,
        4,
        None,
    )
    topics = b"STATS\r\nt partitions 2 message_count 7 message_bytes 90 accept_publish true accept_subscribe true\r\ne *Empty*\r\nEND\r\n"
    assert parse_topics(topics) == {"t": (2, 7, 90)}
    assert partitions("3") == ("3", "3") and partitions("0-3") == ("0", "3")
    for bad in ("x", "3-", "-3", "4-2"):
        with pytest.raises(argparse.ArgumentTypeError):
            partitions(bad)
    assert encode(AdminCommand("close", ("t", "0", "1"), 4)) == b"admin close t 0 1 4\r\n"
    with pytest.raises(LocalProtocolError):
        encode(AdminCommand("x", ("1", "2", "3", "4", "5", "6"), 1))
    with pytest.raises(LocalProtocolError):
        encode(AdminCommand("close", ("a b",), 1))
