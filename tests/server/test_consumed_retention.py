"""Retention by consumer progress on real brokers, with the consumers' offsets in real
ZooKeeper and in real PostgreSQL (``deletePolicy=consumed,...``, docs/retention.md).

Groups consume with the real ``pymetaq consume --group G --count N --offset-store SPEC``
(which commits exactly what it printed) at different speeds; the broker checks retention every
second (``deleteWhen=every 1s``) with 4 KiB segments.  Age is the segment file's mtime, as for
MetaQ's time policies: the tests set it (``os.utime``) instead of waiting hours, and count
retention runs on ``/metrics`` (``pymetaq_retention_runs_total``) to know the broker looked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client import Producer
from tests._broker import BrokerProcess
from tests._helpers import free_port, wait_for
from tests.ha._helpers import stats
from tests.monitor._helpers import labels, scrape

pytestmark = pytest.mark.integration

N_MESSAGES = 18
VALUE = b"v" * 1000


@dataclass
class Backend:
    """Where the consumers commit (``spec`` for the CLI) and the broker's keys to read it."""

    name: str
    spec: str
    system: dict[str, Any]
    zookeeper: dict[str, Any]


@pytest.fixture(params=["zk", "pg"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "zk":
        hosts = str(request.getfixturevalue("zk_hosts"))
        zk = {"zk.zkEnable": "true", "zk.zkConnect": hosts, "zk.zkSyncTimeMs": 100}
        yield Backend("zk", f"zk://{hosts}/meta", {"offsetStorage": "zk"}, zk)
    else:
        url = str(request.getfixturevalue("pg_url"))
        system = {"offsetStorage": "sql", "offsetStorageUrl": url}
        yield Backend("pg", url, system, {})


def start(tmp_path: Path, backend: Backend, topics: dict[str, dict[str, Any]]) -> BrokerProcess:
    system = {
        "maxSegmentSize": 4096,
        "deleteWhen": "every 1s",
        "dashboardHttpPort": free_port(),
        **backend.system,
    }
    return BrokerProcess.start(tmp_path, system=system, topics=topics, zookeeper=backend.zookeeper)


def produce(b: BrokerProcess, topic: str) -> None:
    with Producer(f"meta://127.0.0.1:{b.port}") as p:
        for _ in range(N_MESSAGES):
            assert p.send(topic, VALUE, partition=0).success


def consume(b: BrokerProcess, backend: Backend, topic: str, group: str, n: int) -> list[int]:
    """``n`` messages for ``group`` with the real CLI; the next_offset of each."""
    cmd = [sys.executable, "-m", "pymetaq.server.cli", "consume", "--topic", topic]
    cmd += ["--group", group, "--count", str(n), "--offset-store", backend.spec]
    cmd += ["--servers", f"meta://127.0.0.1:{b.port}", "--format", "json"]
    cmd += ["--from", "earliest"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=b.cwd)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = [json.loads(line)["next_offset"] for line in proc.stdout.splitlines()]
    assert len(out) == n, proc.stdout
    return out


def segments(b: BrokerProcess, topic: str) -> list[int]:
    """Start offsets of the topic's partition-0 segment files, in order."""
    return sorted(int(p.name.split(".")[0]) for p in (b.data_path / f"{topic}-0").glob("*.meta"))


def age(b: BrokerProcess, topic: str, seconds: float) -> None:
    """Make every segment of ``topic`` look ``seconds`` old (what the policy reads)."""
    t = time.time() - seconds
    for p in (b.data_path / f"{topic}-0").glob("*.meta"):
        os.utime(p, (t, t))


def runs(b: BrokerProcess) -> float:
    return scrape(b.http_url)["pymetaq_retention_runs_total"][()]


def let_retention_run(b: BrokerProcess, n: int = 2) -> None:
    """Wait for ``n`` more retention runs: what they would delete is deleted afterwards."""
    r0 = runs(b)
    wait_for(lambda: runs(b) >= r0 + n, 30, f"{n} retention runs")


def test_a_segment_goes_only_after_the_slower_group_passes_it(
    tmp_path: Path, backend: Backend
) -> None:
    topics = {"t": {"deletePolicy": "consumed,fast+slow,1"}}  # min-age: one hour
    with start(tmp_path, backend, topics) as b:
        produce(b, "t")
        starts = segments(b, "t")
        assert len(starts) >= 5, starts  # closed segments and the active one
        fast = consume(b, backend, "t", "fast", N_MESSAGES)
        in_first = sum(1 for end in fast if end <= starts[1])
        assert consume(b, backend, "t", "slow", in_first)[-1] == starts[1]
        let_retention_run(b)
        assert segments(b, "t") == starts  # both passed the first segment: younger than 1 h
        age(b, "t", 7200)
        wait_for(lambda: segments(b, "t") == starts[1:], 30, "the first segment deleted")
        let_retention_run(b)
        assert segments(b, "t") == starts[1:]  # fast passed them all; slow is at their start
        consume(b, backend, "t", "slow", 1)  # slow inside the second segment: not past it
        let_retention_run(b)
        assert segments(b, "t") == starts[1:]
        in_next_two = sum(1 for end in fast if starts[1] < end <= starts[3])
        assert consume(b, backend, "t", "slow", in_next_two - 1)[-1] == starts[3]
        wait_for(lambda: segments(b, "t") == starts[3:], 30, "slow passed two more")
        assert stats(b, "retention") == []  # nothing was lost by any group
        lost = scrape(b.http_url)["pymetaq_retention_unconsumed_messages_total"]
        assert lost == {labels(topic="t", group=g): 0 for g in ("fast", "slow")}  # named: at 0
        assert "retention: t-0: deleted the segment at offset 0" in b.log_text()
        assert "(every named group consumed it)" in b.log_text()


def test_a_stalled_group_and_the_time_cap_report_the_loss(tmp_path: Path, backend: Backend) -> None:
    # '*': the groups with offsets for the topic in the store (fast and stalled)
    topics = {"s": {"deletePolicy": "consumed,*", "maxRetention": "1"}}
    with start(tmp_path, backend, topics) as b:
        produce(b, "s")
        starts = segments(b, "s")
        # stalled commits first: '*' knows only the groups that have committed something
        [stalled] = consume(b, backend, "s", "stalled", 1)
        fast = consume(b, backend, "s", "fast", N_MESSAGES)
        let_retention_run(b)
        assert segments(b, "s") == starts  # stalled has not passed anything; not yet 1 h old
        age(b, "s", 7200)  # older than maxRetention
        wait_for(lambda: segments(b, "s") == starts[-1:], 30, "the cap deleting closed segments")
        closed_end = starts[-1]
        lost_msgs = sum(1 for end in fast if end <= closed_end) - 1
        lost = (len(starts) - 1, closed_end - stalled, lost_msgs)
        line = (
            f"s stalled unconsumed_segments {lost[0]} unconsumed_bytes {lost[1]} "
            f"unconsumed_messages {lost[2]}"
        )  # fast had consumed everything the cap removed: no line for it
        # counted when the run ends, just after its last unlink
        wait_for(lambda: stats(b, "retention") == [line], 10, "the loss in stats retention")
        metrics = scrape(b.http_url)
        key = labels(topic="s", group="stalled")
        assert [
            metrics[f"pymetaq_retention_unconsumed_{unit}_total"][key]
            for unit in ("segments", "bytes", "messages")
        ] == list(lost)
        assert (
            labels(topic="s", group="fast")
            not in metrics["pymetaq_retention_unconsumed_segments_total"]
        )
        assert "(older than maxRetention)" in b.log_text()
        assert "group stalled had not consumed 1 message(s)" not in b.log_text()
        assert f"group stalled had not consumed {in_seg(fast, starts, 0) - 1} message(s)" in (
            b.log_text()
        )


def in_seg(ends: list[int], starts: list[int], k: int) -> int:
    """How many of the messages (given by their end offsets) lie in segment ``k``."""
    return sum(1 for end in ends if starts[k] < end <= starts[k + 1])


def test_an_offset_store_that_cannot_be_read_deletes_nothing(tmp_path: Path) -> None:
    dead = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere"
    backend = Backend("dead", dead, {"offsetStorage": "sql", "offsetStorageUrl": dead}, {})
    topics = {"t": {"deletePolicy": "consumed,*", "maxRetention": "0"}}
    with start(tmp_path, backend, topics) as b:
        produce(b, "t")
        starts = segments(b, "t")
        age(b, "t", 10**7)
        let_retention_run(b, 3)
        assert segments(b, "t") == starts
        assert "t-0: cannot read the consumers' offsets" in b.log_text()
        assert "keeping the data" in b.log_text()
