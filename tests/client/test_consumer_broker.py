"""The Consumer against real broker processes: order, crashes, retries, broadcast, positions.

Crash tests run a child consumer (``python -m tests.client.test_consumer_broker <mode> ...``,
the ``__main__`` block below), SIGKILL it at seeded random points of its progress and restart
it; the parent then checks what was processed.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pymetaq.client.consumer import AsyncConsumer, Consumer, offset_entry
from pymetaq.client.errors import NoCommittedOffset
from pymetaq.client.types import Message, TopicPartition
from pymetaq.offsets import FileOffsetStore, OffsetEntry, SqlOffsetStore, open_offset_store
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import free_port
from tests.client._helpers import produce, server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOPICS = {
    "order": {"numPartitions": 3},
    "crash": {"numPartitions": 2},
    "misc": {"numPartitions": 1},
    "fail": {"numPartitions": 1},
    "bcast": {"numPartitions": 2},
    "big": {"numPartitions": 1},
}
FAST: dict[str, Any] = dict(max_delay_fetch_ms=100, long_poll_ms=200, commit_interval_s=0.1)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess.start(tmp_path_factory.mktemp("cbroker"), topics=TOPICS) as b:
        yield b


# ---------------------------------------------------------------- order, positions


def test_per_partition_order_listener_mode(broker: BrokerProcess, tmp_path: Path) -> None:
    sent = {p: [b"o%d-%05d" % (p, i) for i in range(1500)] for p in range(3)}
    for p, values in sent.items():
        produce(broker, "order", p, values)
    got: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    ids: dict[int, list[int]] = {0: [], 1: [], 2: []}
    active: dict[int, int] = {0: 0, 1: 0, 2: 0}
    overlap: list[int] = []
    lock = threading.Lock()

    def listener(m: Message) -> None:
        with lock:
            active[m.partition] += 1
            if active[m.partition] > 1:
                overlap.append(m.partition)
        got[m.partition].append(m.value)
        ids[m.partition].append(m.id)
        with lock:
            active[m.partition] -= 1

    store = FileOffsetStore(tmp_path / "o.json")
    with Consumer(server(broker), "ord", store, fetch_max_size=4096, **FAST) as c:
        c.subscribe("order", listener)
        c.start()
        wait_for(lambda: sum(map(len, got.values())) >= 4500, what="all messages")
    assert got == sent  # everything, exactly once here, in log order per partition
    assert all(ids[p] == sorted(ids[p]) for p in ids)
    assert not overlap  # a partition's listener calls never overlap
    ends = {e.partition: e.offset for e in store.load_all("ord")}
    assert ends == {f"0-{p}": sum(20 + len(v) for v in sent[p]) for p in range(3)}


def test_initial_positions_seek_and_301(broker: BrokerProcess, tmp_path: Path) -> None:
    values = [b"pos-%03d" % i for i in range(10)]
    produce(broker, "misc", 0, values)
    tp = TopicPartition("misc", 0, 0)
    store = FileOffsetStore(tmp_path / "o.json")

    def drain(c: Consumer, n: int) -> list[Message]:
        out: list[Message] = []
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            out += c.poll(0.2)
        return out

    with Consumer(server(broker), "early", store, **FAST) as c:  # auto, grouped = earliest
        c.subscribe("misc")
        got = drain(c, 10)
        assert [m.value for m in got] == values
        c.seek(tp, got[4].offset)
        assert [m.value for m in drain(c, 6)] == values[4:]
        c.seek(tp, got[-1].next_offset + 1_000_000)  # beyond the end: 301 -> moved to the end
        assert c.poll(0.3) == []
        assert c.position(tp) == got[-1].next_offset and c.stats["moved"] >= 1
    with Consumer(server(broker), "late", store, initial_position="latest", **FAST) as c:
        c.subscribe("misc")
        assert c.poll(0.3) == []
        produce(broker, "misc", 0, [b"pos-new"])
        assert [m.value for m in drain(c, 1)] == [b"pos-new"]
    with (
        pytest.raises(NoCommittedOffset),
        Consumer(server(broker), "nothing", store, initial_position="none") as c,
    ):
        c.subscribe("misc").poll(0.1)
    with Consumer(server(broker), None, **FAST) as c:  # ungrouped auto = latest
        c.subscribe("misc")
        assert c.poll(0.3) == []
    # a restarted group resumes where it committed
    with Consumer(server(broker), "early", store, **FAST) as c:
        c.subscribe("misc")
        assert [m.value for m in drain(c, 1)] == [b"pos-new"]


def test_real_301_moves_the_offset(tmp_path: Path) -> None:
    """A broker with updateConsumerOffsets answers 301 beyond the end; the consumer jumps."""
    with BrokerProcess.start(
        tmp_path, system={"updateConsumerOffsets": "true"}, topics={"m": {}}
    ) as b:
        produce(b, "m", 0, [b"one", b"two"])
        tp = TopicPartition("m", 0, 0)
        with Consumer(server(b), None, initial_position="earliest", **FAST) as c:
            c.subscribe("m")
            c.seek(tp, 10_000)
            got: list[Message] = []
            deadline = time.monotonic() + 30
            while c.stats["moved"] == 0 and time.monotonic() < deadline:
                got += c.poll(0.2)
            assert got == [] and c.stats["moved"] == 1
            assert c.position(tp) == 2 * 23  # the end
            c.seek(tp, 0)
            while len(got) < 2 and time.monotonic() < deadline:
                got += c.poll(0.2)
            assert [m.value for m in got] == [b"one", b"two"]


def test_offset_below_retention_moves_to_the_first_segment(tmp_path: Path) -> None:
    """A committed offset whose segment retention deleted: 301 -> resume at the new start."""
    topics = {"ret": {"deletePolicy": "delete,0s", "deleteWhen": "* * * * * ?"}}
    system = {"maxSegmentSize": 4096, "serverPort": free_port()}
    with BrokerProcess.start(tmp_path, system=system, topics=topics) as b:
        store = FileOffsetStore(tmp_path / "o.json")
        tp = TopicPartition("ret", 0, 0)
        produce(b, "ret", 0, [b"old-%03d" % i for i in range(10)])
        with Consumer(server(b), "rg", store, **FAST) as c:
            c.subscribe("ret")
            got: list[Message] = []
            for _ in range(30):  # bounded: 30 polls of up to 1 s
                if len(got) >= 3:
                    break
                got += c.poll(1.0, max_records=3 - len(got))
        committed = store.load("rg", "ret", "0-0")
        assert committed is not None and committed.offset == got[2].next_offset
        # restart: the broker's retention schedule covers the logs that exist when it starts
        b.terminate()
        b.launch()
        # roll several segments; retention deletes the immutable ones (keep 0 s, every second)
        for k in range(5):
            produce(b, "ret", 0, [b"new-%d-%03d" % (k, i) for i in range(200)])

        def first_offset() -> int:
            with Consumer(server(b), None, **FAST) as probe:
                probe.subscribe("ret")
                return probe._lt.run(probe._engine.bound(tp, end=False))

        wait_for(lambda: first_offset() > committed.offset, 60, "retention")
        start = first_offset()
        with Consumer(server(b), "rg", store, **FAST) as c:
            c.subscribe("ret")
            batch = c.poll(5.0)
            for _ in range(12):  # bounded: a minute
                if batch:
                    break
                batch = c.poll(5.0)
            assert batch[0].offset >= start and batch[0].value.startswith(b"new-")
            assert c.stats["moved"] == 1


def test_corrupt_record_on_disk_is_never_delivered(tmp_path: Path) -> None:
    """A record whose bytes rot on the broker's disk: the ones before it are delivered once,
    the bad one (and so everything after it, in order) is not; the errors are counted."""
    with BrokerProcess.start(tmp_path, topics={"rot": {}}) as b:
        values = [b"rot-%02d" % i for i in range(10)]
        produce(b, "rot", 0, values)
        seg = next((b.data_path / "rot-0").glob("*.meta"))
        with open(seg, "r+b") as f:  # flip one payload byte of record 5 (26 bytes each)
            f.seek(5 * 26 + 20 + 2)
            byte = f.read(1)
            f.seek(5 * 26 + 20 + 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        with Consumer(server(b), None, initial_position="earliest", **FAST) as c:
            c.subscribe("rot")
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while c.stats["crc_errors"] < 3 and time.monotonic() < deadline:
                got += [m.value for m in c.poll(0.2)]
            assert got == values[:5]
            assert c.stats["crc_errors"] >= 3  # detected, resynced, detected again, ...
            assert c.position(TopicPartition("rot", 0, 0)) == 5 * 26


def test_max_size_grows_for_a_big_record(broker: BrokerProcess) -> None:
    big = os.urandom(5000)
    produce(broker, "big", 0, [b"small", big, b"after"])

    async def go() -> list[bytes]:
        async with AsyncConsumer(
            server(broker), None, initial_position="earliest", fetch_max_size=64, **FAST
        ) as c:
            c.subscribe("big")
            out: list[bytes] = []
            async with asyncio.timeout(60):
                while len(out) < 3:
                    out += [m.value for m in await c.poll(5.0)]
            assert c.stats["grown"] >= 1
            return out

    assert asyncio.run(go()) == [b"small", big, b"after"]


@pytest.mark.crash
def test_survives_a_broker_kill9_and_restart(tmp_path: Path) -> None:
    """The broker dies under a listener consumer and comes back on the same port: every
    acknowledged message is consumed, in order, nothing skipped."""
    port = free_port()
    with BrokerProcess.start(tmp_path, system={"serverPort": port}, topics={"r": {}}) as b:
        first = [b"r-%04d" % i for i in range(500)]
        produce(b, "r", 0, first)
        got: list[bytes] = []
        store = FileOffsetStore(tmp_path / "o.json")
        with Consumer(server(b), "rg", store, **FAST) as c:
            c.subscribe("r", lambda m: got.append(m.value))
            c.start()
            wait_for(lambda: len(got) == 500, what="before the crash")
            b.kill()
            b.launch()  # same config, same port, same data
            second = [b"r-%04d" % i for i in range(500, 800)]
            produce(b, "r", 0, second)
            wait_for(lambda: len(got) >= 800, what="after the restart")
        assert got == first + second
        assert c.stats["errors"] >= 1  # it did see the broker go away


# ---------------------------------------------------------------- failures, spool, broadcast


def test_failing_listener_attempts_spool_and_redelivery(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    produce(broker, "fail", 0, [b"ok-1", b"poison", b"ok-2"])
    attempts = {"poison": 0}
    healed = threading.Event()
    seen: list[bytes] = []

    def listener(m: Message) -> None:
        if m.value == b"poison" and not healed.is_set():
            attempts["poison"] += 1
            raise RuntimeError("cannot process yet")
        seen.append(m.value)

    store = FileOffsetStore(tmp_path / "o.json")
    kw: dict[str, Any] = dict(FAST, max_fetch_retries=3, recover_dir=str(tmp_path / "rec"))
    with Consumer(server(broker), "fg", store, recover_interval_s=3600, **kw) as c:
        c.subscribe("fail", listener)
        c.start()
        wait_for(lambda: seen == [b"ok-1", b"ok-2"], what="the partition moves past the poison")
    assert attempts["poison"] == 1 + 3
    assert any((tmp_path / "rec" / "fail@fg").glob("*.spool"))
    healed.set()
    with Consumer(server(broker), "fg", store, recover_interval_s=0.1, **kw) as c:  # a restart
        c.subscribe("fail", listener)
        c.start()
        wait_for(lambda: b"poison" in seen, what="redelivery from the spool")
    assert seen == [b"ok-1", b"ok-2", b"poison"]  # the log itself was not re-read


def test_broadcast_every_instance_gets_everything(broker: BrokerProcess, tmp_path: Path) -> None:
    values = {p: [b"b%d-%d" % (p, i) for i in range(300)] for p in range(2)}
    for p, v in values.items():
        produce(broker, "bcast", p, v)
    store = FileOffsetStore(tmp_path / "o.json")
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    consumers = []
    for inst in ("a", "b"):
        c = Consumer(server(broker), "news", store, broadcast=True, instance_id=inst, **FAST)
        c.subscribe("bcast", partial(_collect, got[inst]))
        consumers.append(c)
    for c in consumers:
        c.start()
    wait_for(lambda: all(len(v) == 600 for v in got.values()), what="both instances")
    for c in consumers:
        c.close()
    for inst in ("a", "b"):
        assert sorted(got[inst]) == sorted(values[0] + values[1])
        assert {e.partition for e in store.load_all(f"news-{inst}")} == {"0-0", "0-1"}
    assert store.load_all("news") == []


# ---------------------------------------------------------------- crash tests (child process)


def spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.client.test_consumer_broker", *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def kill_loop(
    rng: random.Random,
    start: Callable[[], subprocess.Popen[bytes]],
    progress: Callable[[], int],
    total: int,
    kills: int,
    finished: Callable[[], bool] | None = None,
) -> None:
    """Start, SIGKILL after a random amount of progress, repeat; then run to completion.

    ``finished`` (default: ``progress() >= total``) says the last child is done; a child that
    redelivers an uncommitted tail after a kill may still be replaying a partition when every
    message has been seen once, so at-least-once runs wait until each partition's newest line
    is its last message."""
    done = finished or (lambda: progress() >= total)
    for _ in range(kills):
        before = progress()
        child = start()
        target = min(before + rng.randint(1, total // (kills + 1)), total - 1)
        try:
            wait_for(partial(_progressed, progress, target, child), 60, "progress")
            assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            if child.stderr:
                child.stderr.close()
        print(f"killed at progress {progress()} (target {target} of {total})")
    child = start()
    try:
        wait_for(lambda: done() or child.poll() is not None, 120, "completion")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        if child.stderr:
            child.stderr.close()


def store_spec(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "file":
        return "file:" + str(tmp_path / "offsets.json")
    if kind == "sqlite":
        return "sqlite:///" + str(tmp_path / "offsets.db")
    return str(request.getfixturevalue("pg_url"))


KINDS = [
    pytest.param("file"),
    pytest.param("sqlite"),
    pytest.param("postgresql", marks=pytest.mark.pg),
]


@pytest.mark.crash
@pytest.mark.parametrize("kind", KINDS)
def test_kill9_at_least_once(
    broker: BrokerProcess, tmp_path: Path, seed: int, kind: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seed)
    spec = store_spec(kind, tmp_path, request)
    group = f"crash-{kind}"
    values = {p: [b"c-%s-%d-%05d" % (kind.encode(), p, i) for i in range(1200)] for p in range(2)}
    for p, v in values.items():
        produce(broker, "crash", p, v)
    out = tmp_path / "processed.txt"
    out.touch()
    mine = set(values[0] + values[1])

    def progress() -> int:
        return len(set(out.read_bytes().split(b"\n")) & mine)

    def caught_up() -> bool:
        lines = [x for x in out.read_bytes().split(b"\n") if x in mine]
        if set(lines) != mine:
            return False
        tails = {
            p: [x for x in lines if x.startswith(b"c-%s-%d-" % (kind.encode(), p))][-1]
            for p in values
        }
        return all(tails[p] == values[p][-1] for p in values)

    kill_loop(
        rng,
        lambda: spawn("atleast", server(broker), spec, group, str(out)),
        progress,
        len(mine),
        kills=3,
        finished=caught_up,
    )
    lines = [x for x in out.read_bytes().split(b"\n") if x in mine]
    assert set(lines) == mine  # none skipped (duplicates are allowed: at-least-once)
    for p in range(2):  # and each run processed a partition in log order
        seq = [x for x in lines if x.startswith(b"c-%s-%d-" % (kind.encode(), p))]
        assert seq[-1] == values[p][-1]


@pytest.mark.crash
@pytest.mark.parametrize(
    "kind", [pytest.param("sqlite"), pytest.param("postgresql", marks=pytest.mark.pg)]
)
def test_kill9_exactly_once_with_commit_in(
    broker: BrokerProcess, tmp_path: Path, seed: int, kind: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seed)
    url = store_spec(kind, tmp_path, request)
    group = f"xo-{kind}"
    values = [b"x-%s-%05d" % (kind.encode(), i) for i in range(600)]
    first_offset = produce(broker, "misc", 0, values)[0]
    engine = sa.create_engine(url)
    BUSINESS.create_all(engine)

    def rows() -> list[str]:
        with engine.connect() as conn:
            return list(conn.execute(sa.select(PAYMENTS.c.payload)).scalars())

    # the group starts at the first of our messages (the topic holds other tests' messages)
    store = SqlOffsetStore(url)
    store.reset(group, [OffsetEntry("misc", "0-0", first_offset, -1)])
    store.close()
    kill_loop(
        rng,
        lambda: spawn("exactly", server(broker), url, group),
        lambda: len(rows()),
        len(values),
        kills=4,
    )
    got = rows()
    engine.dispose()
    assert sorted(got) == sorted(v.decode() for v in values)  # no gap
    assert len(got) == len(set(got))  # no duplicate


BUSINESS = sa.MetaData()
PAYMENTS = sa.Table(
    "payments",
    BUSINESS,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("payload", sa.String(64), nullable=False),
)


# ---------------------------------------------------------------- child process


def _child_atleast(srv: str, spec: str, group: str, out: str) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_APPEND)
    store = open_offset_store(spec)

    def listener(m: Message) -> None:
        os.write(fd, m.value + b"\n")

    c = Consumer(srv, group, store, fetch_max_size=2048, **FAST)
    c.subscribe("crash", listener)
    c.start()
    threading.Event().wait()


def _child_exactly(srv: str, url: str, group: str) -> None:
    store = SqlOffsetStore(url)
    engine = store.engine

    def listener(m: Message) -> None:
        with engine.begin() as conn:
            conn.execute(PAYMENTS.insert().values(payload=m.value.decode()))
            store.commit_in(conn, group, [offset_entry(m)])

    c = Consumer(srv, group, store, enable_auto_commit=False, fetch_max_size=1024, **FAST)
    c.subscribe("misc", listener)
    c.start()
    threading.Event().wait()


def _collect(out: list[bytes], m: Message) -> None:
    out.append(m.value)


def _progressed(progress: Callable[[], int], target: int, child: subprocess.Popen[bytes]) -> bool:
    return progress() >= target or child.poll() is not None


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    child = _child_atleast if mode == "atleast" else _child_exactly
    child(*rest)
