"""The idempotent ``bput`` on the wire, against a real broker: duplicates answered with the
original result and stored once, gaps and too-old duplicates refused with 409, a duplicate of a
batch still on its way answered when it is durable, and the memory rebuilt after a SIGKILL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.checksum import checksum
from pymetaq.storage.producers import FILE_NAME
from pymetaq.storage.record import encode_record, iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire

pytestmark = pytest.mark.integration

PID = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


def ibput(
    topic: str, partition: int, payloads: list[bytes], seq: int, opaque: int, pid: str = PID
) -> bytes:
    body = b"".join(encode_record(p) for p in payloads)
    return (
        b"bput %s %d %d %d %d %s %d %d\r\n"
        % (
            topic.encode(),
            partition,
            len(body),
            len(payloads),
            checksum(body),
            pid.encode(),
            seq,
            opaque,
        )
        + body
    )


def stored(w: Wire, topic: str, partition: int) -> list[bytes]:
    reply = w.call(b"get %s g %d 0 1048576 99\r\n" % (topic.encode(), partition))
    if isinstance(reply, ResultReply):
        assert reply.code == 404, reply
        return []
    assert isinstance(reply, ValueReply)
    return [bytes(r.data) for r in iter_records(reply.data)]


def ok(reply: object) -> bytes:
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    return reply.body


@pytest.fixture(params=["auto", "fdatasync"])
def broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    """A broker in either ``producersSync`` mode (``auto`` is in place on ext4 and XFS)."""
    topics = {"idem": {"numPartitions": 2}}
    system = {"idleTimeoutMs": 0, "producersSync": request.param}
    with BrokerProcess.start(tmp_path, topics=topics, system=system) as b:
        yield b


def test_duplicate_answered_with_the_original_result_and_stored_once(
    broker: BrokerProcess,
) -> None:
    with Wire(broker.address) as w:
        first = ok(w.call(ibput("idem", 0, [b"a", b"b"], 0, 1)))
        again = ok(w.call(ibput("idem", 0, [b"a", b"b"], 0, 2)))
        assert again == first and first.endswith(b" 0 0 2")
        nxt = ok(w.call(ibput("idem", 0, [b"c"], 1, 3)))
        assert nxt.split()[2] == b"42"  # after two 21-byte records
        # another producer numbers its own batches; a plain bput is untouched
        ok(w.call(ibput("idem", 0, [b"d"], 0, 4, pid=OTHER)))
        plain = b"bput idem 0 21 1 -1 5\r\n" + encode_record(b"e")
        ok(w.call(plain))
        ok(w.call(plain))
        assert stored(w, "idem", 0) == [b"a", b"b", b"c", b"d", b"e", b"e"]
        stats = ok(w.call(b"stats  6\r\n"))
        assert b"\r\nput_duplicate 1\r\n" in stats


def test_gap_and_too_old_duplicate_are_409_and_store_nothing(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        ok(w.call(ibput("idem", 1, [b"s0"], 0, 1)))
        gap = w.call(ibput("idem", 1, [b"s2"], 2, 2))
        assert gap == ResultReply(
            409, f"out of order sequence 2 of producer {PID}: expected 1".encode(), 2
        )
        for seq in range(1, 7):
            ok(w.call(ibput("idem", 1, [b"s%d" % seq], seq, 10 + seq)))
        old = w.call(ibput("idem", 1, [b"s1"], 1, 20))
        assert isinstance(old, ResultReply) and old.code == 409
        assert old.body.startswith(b"duplicate sequence 1 of producer")
        assert stored(w, "idem", 1) == [b"s%d" % i for i in range(7)]
        # malformed producer ids and sequences are 400, the connection stays
        bad = ibput("idem", 1, [b"x"], 7, 21, pid="XYZ" * 10 + "ab")
        reply = w.call(bad)
        assert isinstance(reply, ResultReply) and reply.code == 400, reply
        neg = ibput("idem", 1, [b"x"], 7, 22).replace(b" 7 22\r\n", b" -7 22\r\n")
        reply = w.call(neg)
        assert isinstance(reply, ResultReply) and reply.code == 400, reply
        ok(w.call(ibput("idem", 1, [b"s7"], 7, 23)))


def test_pipelined_window_then_duplicates_of_every_batch(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        frames = [ibput("idem", 0, [b"p%d" % s] * 3, s, s) for s in range(5)]
        w.send(b"".join(frames + frames))  # five in flight, then all five again
        replies = [w.reply() for _ in range(10)]
        assert all(isinstance(r, ResultReply) and r.code == 200 for r in replies), replies
        by_opaque: dict[int, set[bytes]] = {}
        for r in replies:
            assert isinstance(r, ResultReply)
            by_opaque.setdefault(r.opaque, set()).add(r.body)
        assert all(len(bodies) == 1 for bodies in by_opaque.values()), by_opaque
        assert stored(w, "idem", 0) == [b"p%d" % s for s in range(5) for _ in range(3)]


def test_memory_survives_sigkill_and_restart(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        results = [ok(w.call(ibput("idem", 0, [b"k%d" % s], s, s))) for s in range(8)]
    broker.kill()
    broker.restart()
    assert (broker.data_path / "idem-0" / FILE_NAME).exists()
    with Wire(broker.address) as w:
        # the last five are remembered with their results; older ones are 409, never stored
        for s in range(3, 8):
            assert ok(w.call(ibput("idem", 0, [b"k%d" % s], s, 100 + s))) == results[s]
        old = w.call(ibput("idem", 0, [b"k2"], 2, 200))
        assert isinstance(old, ResultReply) and old.code == 409
        gap = w.call(ibput("idem", 0, [b"k9"], 9, 201))
        assert isinstance(gap, ResultReply) and gap.code == 409
        ok(w.call(ibput("idem", 0, [b"k8"], 8, 202)))
        assert stored(w, "idem", 0) == [b"k%d" % s for s in range(9)]
