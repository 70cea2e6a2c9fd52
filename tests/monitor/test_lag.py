"""Consumer lag computed by the broker agrees with the truth the test computes itself.

Two groups read the same topic at different speeds: ``fast`` is pymetaq's own Consumer (it
drains everything, then long-polls at the end), ``slow`` is MetaQ's raw ``get`` on a socket
(it stops part-way).  The truth comes from the test's own acknowledged puts (every offset,
size and id) and its own gets; ``stats lag``, ``/metrics`` (parsed with
``prometheus_client.parser``) and ``/api/groups`` must each say exactly that.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from pathlib import Path

import pytest

from pymetaq.client import Consumer
from pymetaq.offsets import FileOffsetStore
from tests._broker import BrokerProcess
from tests._helpers import free_port, wait_for
from tests.monitor._helpers import Ledger, RawGroup, fill, labels, scrape, stats_lag, within
from tests.server._helpers import Wire

pytestmark = pytest.mark.integration

TOPICS = {"lagt": {"numPartitions": 2, "stat": "true"}, "rawonly": {}}


def test_lag_from_gets_agrees_with_the_truth(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    system = {"dashboardHttpPort": free_port()}
    with BrokerProcess.start(tmp_path, topics=TOPICS, system=system) as broker:
        ledger = Ledger()
        fill(broker.address, ledger, "lagt", 2, 300, rng)
        fill(broker.address, ledger, "rawonly", 1, 40, rng)
        ends = {p: ledger.end("lagt", p) for p in (0, 1)}

        # slow: MetaQ's raw get, a few small fetches per partition, then it stops; each fetch
        # holds at least one whole record (fill's largest is 20 + 299 bytes: a smaller
        # max_size would get only part of it, and MetaQ's client would then ask for more)
        slow = RawGroup(broker.address, "slow")
        try:
            for partition, fetches in ((0, 5), (1, 2)):
                for _ in range(fetches):
                    assert slow.fetch("lagt", partition, max_size=rng.randrange(320, 900)) > 0
            while slow.fetch("rawonly", 0) > 0:  # reads all of it: bytes out are known exactly
                pass

            # fast: pymetaq's Consumer drains the topic and waits at the end
            store = FileOffsetStore(tmp_path / "offsets.json")
            servers = f"meta://{broker.host}:{broker.port}"
            fast = Consumer(servers, "fast", store, recover_dir=str(tmp_path / "recover"))
            try:
                fast.subscribe("lagt")
                got = 0
                deadline = time.monotonic() + 60
                while got < 300 and time.monotonic() < deadline:
                    got += len(fast.poll(1.0).values())
                assert got == 300
                with Wire(broker.address) as w:
                    # the fast group's next get is at the end of each partition
                    wait_for(
                        lambda: all(
                            (r := stats_lag(w).get(("fast", "lagt", p)))
                            and r.fetch_offset == ends[p]
                            for p in (0, 1)
                        ),
                        30,
                        "the fast group's get at the end",
                    )
                    before = time.time()
                    lag = stats_lag(w)
                    after = time.time()
                _check_stats_lag(lag, ledger, slow, ends, before, after)
                before = time.time()
                metrics = scrape(broker.http_url)
                after = time.time()
                _check_metrics(metrics, ledger, slow, ends, before, after)
                with urllib.request.urlopen(broker.http_url + "api/groups", timeout=30) as reply:
                    groups = {g["group"]: g for g in json.load(reply)}
                _check_api(groups, slow, ends)
            finally:
                fast.close()
        finally:
            slow.close()


def _truth_seconds(ledger: Ledger, slow: RawGroup, partition: int, t: float) -> float:
    return t - ledger.born("lagt", partition, slow.last_get[("lagt", partition)])


def _check_stats_lag(lag, ledger, slow, ends, before, after) -> None:  # type: ignore[no-untyped-def]
    assert {k for k in lag if k[0] in ("fast", "slow")} == {
        ("fast", "lagt", 0), ("fast", "lagt", 1), ("slow", "lagt", 0), ("slow", "lagt", 1),
        ("slow", "rawonly", 0),
    }  # fmt: skip
    for p in (0, 1):
        fast = lag[("fast", "lagt", p)]
        assert (fast.fetch_offset, fast.max_offset, fast.lag_bytes, fast.lag_seconds) == (
            ends[p], ends[p], 0, 0.0,
        )  # fmt: skip
        row = lag[("slow", "lagt", p)]
        position = slow.last_get[("lagt", p)]
        assert 0 < position < ends[p]
        assert (row.fetch_offset, row.max_offset, row.lag_bytes) == (
            position, ends[p], ends[p] - position,
        )  # fmt: skip
        lo, hi = _truth_seconds(ledger, slow, p, before), _truth_seconds(ledger, slow, p, after)
        assert within(row.lag_seconds, lo, hi), (row.lag_seconds, lo, hi)
    raw = lag[("slow", "rawonly", 0)]
    end = ledger.end("rawonly", 0)
    assert (raw.fetch_offset, raw.max_offset, raw.lag_bytes, raw.lag_seconds) == (end, end, 0, 0.0)


def _check_metrics(m, ledger, slow, ends, before, after) -> None:  # type: ignore[no-untyped-def]
    for p in (0, 1):
        part = labels(topic="lagt", partition=p)
        assert m["pymetaq_partition_messages_in_total"][part] == ledger.count("lagt", p)
        assert m["pymetaq_partition_bytes_in_total"][part] == ledger.nbytes("lagt", p)
        assert m["pymetaq_partition_log_end_offset"][part] == ends[p]
        assert m["pymetaq_partition_log_start_offset"][part] == 0
        for group, position in (("fast", ends[p]), ("slow", slow.last_get[("lagt", p)])):
            key = labels(group=group, topic="lagt", partition=p)
            assert m["pymetaq_consumer_fetch_offset"][key] == position
            assert m["pymetaq_consumer_lag_bytes"][key] == ends[p] - position
        key = labels(group="slow", topic="lagt", partition=p)
        lo, hi = _truth_seconds(ledger, slow, p, before), _truth_seconds(ledger, slow, p, after)
        assert within(m["pymetaq_consumer_lag_seconds"][key], lo, hi)
    raw = labels(topic="rawonly", partition=0)
    assert m["pymetaq_partition_bytes_out_total"][raw] == slow.bytes_got[("rawonly", 0)]
    assert m["pymetaq_messages_total"][()] == 340
    assert m["pymetaq_fsync_duration_seconds_count"][()] >= 1
    assert m["pymetaq_group_commit_batch_messages_sum"][()] == 340  # every message fsynced once
    assert m["pymetaq_lag_entries"][()] == 5


def _check_api(groups, slow, ends) -> None:  # type: ignore[no-untyped-def]
    rows = {(r["topic"], r["partition"]): r for r in groups["slow"]["partitions"]}
    for p in (0, 1):
        position = slow.last_get[("lagt", p)]
        assert rows[("lagt", p)]["fetch_offset"] == position
        assert rows[("lagt", p)]["lag_bytes"] == ends[p] - position
    assert groups["slow"]["lag_bytes"] == sum(ends[p] - slow.last_get[("lagt", p)] for p in (0, 1))
    assert groups["fast"]["lag_bytes"] == 0
