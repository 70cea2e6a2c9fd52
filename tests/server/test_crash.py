"""Crash loop: SIGKILL a broker mid-stream; every acknowledged message survives, in both modes.

Each round pipelines puts and batch puts over a raw socket (several hundred in flight), kills
the broker with SIGKILL after a seeded random number of acknowledgements, restarts it on the
same data and fetches every partition: each acknowledged record must be at its acknowledged
offset with its id and bytes intact.  Segments are 16 KiB, so every round rolls several times;
group commit and threshold mode (acknowledged before the fsync) both run.  (SIGKILL tests a
process crash: the kernel keeps the written pages; power loss is storage's fault-injection
suite.)  The default run keeps a few rounds per mode; the ``slow`` variant runs many.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

import pytest

from pymetaq.client.protocol import NEED_DATA, Parser, ResultReply, Role
from pymetaq.storage.record import HEADER_SIZE, iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, bput_frame, put_line, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 2
WINDOW = 300
SEGMENT = 16384
MODES = {"group_commit": 0, "threshold": 1000}


class Producer(threading.Thread):
    """Pipelines frames; records (partition, offset, msg_id, payload) of every 200 reply."""

    def __init__(self, address: tuple[str, int], rng: random.Random, round_no: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(address, timeout=30)
        self.rng = rng
        self.round_no = round_no
        self.sent: dict[int, list[bytes]] = {}
        self.acked: list[tuple[int, int, int, bytes]] = []
        self.errors: list[ResultReply] = []
        self.lock = threading.Lock()
        self.window = threading.Semaphore(WINDOW)
        self.reader = threading.Thread(target=self.read_replies, daemon=True)

    def frame(self, opaque: int) -> bytes:
        partition = self.rng.randrange(PARTITIONS)
        if self.rng.random() < 0.3:
            payloads = [
                b"r%d-o%d-%d-" % (self.round_no, opaque, i) + b"b" * self.rng.randrange(200)
                for i in range(self.rng.randrange(1, 20))
            ]
            self.sent[opaque] = payloads
            return bput_frame("crash", partition, payloads, opaque)
        payload = b"r%d-o%d-" % (self.round_no, opaque) + b"p" * self.rng.randrange(300)
        self.sent[opaque] = [payload]
        return put_line("crash", partition, payload, opaque)

    def run(self) -> None:
        self.reader.start()
        opaque = 0
        try:
            while True:
                chunk = []
                for _ in range(20):
                    while not self.window.acquire(timeout=0.05):
                        if not self.reader.is_alive():
                            return
                    opaque += 1
                    chunk.append(self.frame(opaque))
                self.sock.sendall(b"".join(chunk))
        except OSError:
            return

    def read_replies(self) -> None:
        parser = Parser(Role.CLIENT)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return
                parser.feed(data)
                while (event := parser.next_event()) is not NEED_DATA:
                    assert isinstance(event, ResultReply)
                    self.window.release()
                    self.record(event)
        except OSError:
            return

    def record(self, reply: ResultReply) -> None:
        if reply.code != 200:
            self.errors.append(reply)
            return
        fields = [int(x) for x in reply.body.split()]
        msg_id, partition, offset = fields[:3]
        with self.lock:
            for i, payload in enumerate(self.sent[reply.opaque]):
                self.acked.append((partition, offset, msg_id + i, payload))
                offset += HEADER_SIZE + len(payload)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def fetch_all(broker: BrokerProcess, partition: int) -> dict[int, tuple[int, bytes]]:
    out: dict[int, tuple[int, bytes]] = {}
    offset = 0
    with Wire(broker.address) as w:
        while True:
            reply = w.call(b"get crash g %d %d 1048576 1\r\n" % (partition, offset))
            if isinstance(reply, ResultReply):
                assert reply.code == 404, reply
                return out
            records = list(iter_records(reply.data, offset))
            assert records
            for r in records:
                out[r.offset] = (r.msg_id, r.data)
            offset = records[-1].offset + records[-1].size


def crash_loop(tmp_path: Path, seed: int, threshold: int, rounds: int) -> tuple[int, int]:
    """(acknowledged, lost) over ``rounds`` kill/restart rounds."""
    rng = random.Random(seed)
    system = {"unflushThreshold": threshold, "maxSegmentSize": SEGMENT}
    topics = {"crash": {"numPartitions": PARTITIONS}}
    broker = BrokerProcess.start(tmp_path, topics=topics, system=system)
    all_acked: list[tuple[int, int, int, bytes]] = []
    lost: set[tuple[int, int]] = set()
    with broker:
        for round_no in range(rounds):
            producer = Producer(broker.address, rng, round_no)
            producer.start()
            target = rng.randrange(400, 3000)  # >= 400 records of ~150 bytes: rolls every round
            wait_for(
                lambda p=producer, t=target: p.count() >= t or p.errors,  # type: ignore[misc]
                timeout_s=120,
                what=f"{target} acks",
            )
            assert not producer.errors, producer.errors[:3]
            broker.kill()
            producer.reader.join(30)
            producer.sock.close()
            producer.join(30)
            all_acked += producer.acked
            broker.launch()
            stored = {p: fetch_all(broker, p) for p in range(PARTITIONS)}
            for partition, offset, msg_id, payload in all_acked:
                if stored[partition].get(offset) != (msg_id, payload):
                    lost.add((partition, offset))
    return len(all_acked), len(lost)


@pytest.mark.crash
@pytest.mark.parametrize("mode", list(MODES))
def test_sigkill_loses_no_acknowledged_message(tmp_path: Path, seed: int, mode: str) -> None:
    acked, lost = crash_loop(tmp_path, seed, MODES[mode], rounds=5)
    print(f"[crash] broker {mode}: 5 rounds, {acked} acknowledged, {lost} lost")
    assert acked >= 5 * 400 and lost == 0


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("mode", list(MODES))
def test_sigkill_loop_many_rounds(tmp_path: Path, seed: int, mode: str) -> None:
    acked, lost = crash_loop(tmp_path, seed, MODES[mode], rounds=10)
    print(f"[crash] broker {mode}: 10 rounds, {acked} acknowledged, {lost} lost")
    assert lost == 0
