"""OrderedProducer: order per partition across a broker stop/start (spool, then drain)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pymetaq.client import OrderedProducer, TopicPartition
from pymetaq.client.producer.ordered import parse_layout
from tests._broker import BrokerProcess
from tests.client._helpers import fetch_all, free_port


def test_parse_layout() -> None:
    tp = TopicPartition
    assert parse_layout("t", "1:2;0:1") == [tp("t", 0, 0), tp("t", 1, 0), tp("t", 1, 1)]
    assert parse_layout("t", 2) == [tp("t", 0, 0), tp("t", 0, 1)]
    assert parse_layout("t", ["0-1", tp("x", 0, 0)]) == [tp("t", 0, 0), tp("t", 0, 1)]
    with pytest.raises(ValueError):
        parse_layout("t", "0-4")


@pytest.mark.integration
def test_order_survives_broker_stop_and_start(tmp_path: Path) -> None:
    port = free_port()
    topics = {"seq": {"numPartitions": 2}}
    broker = BrokerProcess.start(tmp_path, system={"serverPort": port}, topics=topics)
    spool_dir = tmp_path / "spool"
    keys = ["alpha", "beta"]  # crc32 % 2 puts them on different partitions
    n_before, n_down, n_after = 30, 40, 30
    counters = dict.fromkeys(keys, 0)
    try:
        with OrderedProducer(
            f"meta://127.0.0.1:{port}",
            spool_dir=spool_dir,
            request_timeout_ms=1000,
            recover_interval_ms=50,
        ) as p:
            placed = {k: p.partitions("seq")[p._choose("seq", k, None).partition] for k in keys}
            assert len(set(placed.values())) == 2

            def send_round(count: int, expect_spooled: bool | None) -> None:
                for _ in range(count):
                    for k in keys:
                        r = p.send("seq", f"{k}:{counters[k]}".encode(), key=k)
                        assert r.success, r
                        if expect_spooled is not None:
                            assert r.spooled is expect_spooled, r
                        counters[k] += 1

            send_round(n_before, expect_spooled=False)
            assert broker.terminate() == 0
            send_round(n_down, expect_spooled=True)  # broker down: all go to the spool
            assert p.backlog("seq") == 2 * n_down
            assert sorted(d.name for d in spool_dir.iterdir()) == ["seq@0-0", "seq@0-1"]
            broker.restart()
            assert broker.port == port
            send_round(
                n_after, expect_spooled=None
            )  # spooled while the backlog drains, then direct
            assert p.flush(60), "spool did not drain"
            send_round(5, expect_spooled=False)
        total = n_before + n_down + n_after + 5
        for k in keys:
            stored = [m.value for m in fetch_all(broker.address, "seq", placed[k].partition)]
            assert stored == [f"{k}:{i}".encode() for i in range(total)]
    finally:
        broker.__exit__(None, None, None)


@pytest.mark.integration
def test_spool_left_by_a_previous_run_is_drained_first(tmp_path: Path) -> None:
    port = free_port()
    spool_dir = tmp_path / "spool"
    url = f"meta://127.0.0.1:{port}"
    # no broker at all: the layout is given, everything is spooled
    with OrderedProducer(url, spool_dir=spool_dir, layout={"seq": 1}, connect_timeout_ms=300) as p:
        for i in range(10):
            assert p.send("seq", f"m{i}".encode(), partition=0).spooled
    with BrokerProcess.start(tmp_path, system={"serverPort": port}, topics={"seq": {}}) as broker:
        with OrderedProducer(url, spool_dir=spool_dir, recover_interval_ms=50) as p:
            assert p.flush(60)
            assert not p.send("seq", b"m10", partition=0).spooled
        stored = [m.value for m in fetch_all(broker.address, "seq", 0)]
    assert stored == [f"m{i}".encode() for i in range(11)]
