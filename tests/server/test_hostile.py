"""Hostile input at a live broker: fuzzed frames, broken connections, limits.

After every attack the broker must still be running, a fresh connection must round-trip, and
every byte stored must be complete, checksummed records (never a partial record).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply, VersionCommand
from pymetaq.server.broker import Broker
from pymetaq.server.config import parse_config
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import encode_record, iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, bput_frame, put_line, result, wait_for

pytestmark = pytest.mark.integration

TOPICS = {"fuzz": {"numPartitions": 2}, "cut": {}, "flood": {}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess.start(tmp_path_factory.mktemp("hostile"), topics=TOPICS) as b:
        yield b


def valid_frames(rng: random.Random) -> list[bytes]:
    data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
    op = rng.randrange(1 << 20)
    return [
        put_line("fuzz", rng.randrange(2), data, op, checksum(data)),
        b"put fuzz 0 %d 0 %d\r\n" % (len(data), op) + data,
        bput_frame("fuzz", 1, [data, data[::-1]], op),
        b"get fuzz g 0 0 1024 %d\r\n" % op,
        b"get fuzz g 1 0 1024 5 %d\r\n" % op,
        b"offset fuzz g 0 0 %d\r\n" % op,
        b"stats topics %d\r\n" % op,
        b"version %d\r\n" % op,
        b"transaction TX:a:1 a BEGIN %d\r\n" % op,
    ]


def mutate(frame: bytes, rng: random.Random) -> bytes:
    b = bytearray(frame)
    kind = rng.randrange(7)
    if kind == 0 and b:
        b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 1:
        del b[rng.randrange(len(b) + 1) :]
    elif kind == 2:
        pos = rng.randrange(len(b) + 1)
        b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 10)))
    elif kind == 3:
        tokens = bytes(b).split(b" ")
        i = rng.randrange(len(tokens))
        tokens[i] = rng.choice([b"-1", b"0", b"99999999999999999999", b"", b"\xff", b"-2147483648"])
        b = bytearray(b" ".join(tokens))
    elif kind == 4:
        b = bytearray(bytes(b).replace(b"\r\n", b"\n", 1))
    elif kind == 5:
        b = b + b
    else:
        b = bytearray(rng.randbytes(rng.randrange(1, 200)))
    return bytes(b)


def attack(address: tuple[str, int], payload: bytes, rng: random.Random) -> None:
    sock = socket.create_connection(address, timeout=10)
    try:
        pos = 0
        while pos < len(payload):  # arbitrary chunking
            step = rng.randrange(1, 64)
            sock.sendall(payload[pos : pos + step])
            pos += step
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):  # the broker answers what it can, then closes on EOF
            pass
    except OSError:  # reset, broken pipe, not connected: the broker closed on garbage
        pass
    finally:
        sock.close()


def assert_alive_and_intact(broker: BrokerProcess) -> None:
    assert broker.proc is not None and broker.proc.poll() is None, broker.log_text()
    with Wire(broker.address) as w:
        data = b"still alive"
        reply = w.call(put_line("fuzz", 0, data, 1, checksum(data)))
        assert isinstance(reply, ResultReply) and reply.code == 200, reply
        for partition in (0, 1):
            offset = 0
            while True:
                got = w.call(b"get fuzz g %d %d 1048576 2\r\n" % (partition, offset))
                if isinstance(got, ResultReply):
                    assert got.code == 404, got
                    break
                assert isinstance(got, ValueReply)
                records = list(iter_records(got.data, offset, verify=True))
                assert records, "a slice that holds no complete record"
                offset = records[-1].offset + records[-1].size


def test_fuzzed_frames_never_crash_or_corrupt(broker: BrokerProcess, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        frames = [rng.choice(valid_frames(rng)) for _ in range(rng.randrange(1, 6))]
        payload = b"".join(mutate(f, rng) if rng.random() < 0.7 else f for f in frames)
        attack(broker.address, payload, rng)
    assert_alive_and_intact(broker)


def test_random_bytes_never_crash(broker: BrokerProcess, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(30):
        attack(broker.address, rng.randbytes(rng.randrange(1, 5000)), rng)
    assert_alive_and_intact(broker)


def test_disconnect_mid_body_stores_nothing(broker: BrokerProcess) -> None:
    data = b"x" * 1000
    for frame in (put_line("cut", 0, data, 7, checksum(data)), bput_frame("cut", 0, [data] * 3, 8)):
        for cut in (len(frame) - 1, len(frame) - 500, frame.index(b"\r\n") + 2):
            sock = socket.create_connection(broker.address, timeout=10)
            sock.sendall(frame[:cut])
            sock.close()
    with Wire(broker.address) as w:
        reply = w.call(b"version 9\r\n")  # the broker has processed the closes before this
        assert isinstance(reply, ResultReply) and reply.code == 200
        reply = w.call(b"stats offsets 10\r\n")
        assert isinstance(reply, ResultReply)
        assert b"cut part" not in reply.body, reply.body


def test_max_connections(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, system={"maxConnections": 2}) as broker:
        first, second = Wire(broker.address), Wire(broker.address)
        assert first.call(b"version 1\r\n").opaque == 1  # type: ignore[union-attr]
        assert second.call(b"version 2\r\n").opaque == 2  # type: ignore[union-attr]
        with Wire(broker.address) as third:
            try:
                third.send(b"version 3\r\n")
                assert third.read_until_closed() == b""  # closed at accept, no reply
            except ConnectionResetError:
                pass
        first.close()

        def fourth_works() -> bool:
            with Wire(broker.address) as w:
                try:
                    return w.call(b"version 4\r\n").opaque == 4  # type: ignore[union-attr]
                except ConnectionError:
                    return False

        wait_for(fourth_works, what="a free connection slot")
        second.close()
        # the broker's log is read by a reader thread: wait for the line, don't race it
        wait_for(lambda: "maxConnections reached" in broker.log_text(), what="the refusal logged")


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    with (
        BrokerProcess.start(tmp_path, system={"idleTimeoutMs": 300}) as broker,
        Wire(broker.address) as w,
    ):
        assert w.call(b"version 1\r\n").opaque == 1  # type: ignore[union-attr]
        assert w.read_until_closed(timeout=30) == b""


def test_handler_exception_is_500_and_the_broker_keeps_serving(tmp_path: Path) -> None:
    config = parse_config(
        f"[system]\nserverPort=0\ndashboardHttpPort=0\ndataPath={tmp_path}\nunflushThreshold=0\n"
        "[zookeeper]\nzk.zkEnable=false\n[topic=t]\n",
        cwd=str(tmp_path),
    )
    with Broker(config) as broker:
        assert broker.dispatcher is not None

        def boom(conn: object, cmd: object) -> None:
            raise RuntimeError("boom")

        broker.dispatcher._table[VersionCommand] = boom
        with Wire(broker.address) as w:
            w.send(b"version 5\r\n")
            expected = result(500, b"internal error: RuntimeError('boom')", 5)
            assert w.read_exact(len(expected)) == expected
            data = b"ok"
            reply = w.call(put_line("t", 0, data, 6, checksum(data)))
            assert isinstance(reply, ResultReply) and reply.code == 200
            got = w.call(b"get t g 0 0 100 7\r\n")
            assert isinstance(got, ValueReply)
            assert [r.data for r in iter_records(got.data)] == [data]
            assert encode_record(data)[:8] == got.data[:8]


def test_a_flood_of_pipelined_gets_is_answered_in_full(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        data = b"g" * 50
        reply = w.call(put_line("flood", 0, data, 1, checksum(data)))
        assert isinstance(reply, ResultReply) and reply.code == 200
        offset = int(reply.body.split()[2])
        n = 3000
        w.send(b"".join(b"get flood g 0 %d 4096 %d\r\n" % (offset, 10 + i) for i in range(n)))
        seen = set()
        for _ in range(n):
            got = w.reply()
            assert isinstance(got, ValueReply), got
            assert [r.data for r in iter_records(got.data)][:1] == [data]
            seen.add(got.opaque)
        assert seen == set(range(10, 10 + n))
