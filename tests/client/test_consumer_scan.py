"""The consumer's record scan (runs of equal-length records and the record walk) against a
plain reference walk, and listener delivery in chunks (positions, retries, order)."""

from __future__ import annotations

import random
import struct
import threading
import zlib
from pathlib import Path

import pytest

from pymetaq.client.consumer import Consumer
from pymetaq.client.consumer.batch import MessageBatch
from pymetaq.client.consumer.scan import scan
from pymetaq.client.transport.records import build_record, decode_messages
from pymetaq.client.types import Message, TopicPartition
from pymetaq.offsets import FileOffsetStore
from tests._helpers import wait_for
from tests.client._helpers import FakeLog, FakeTransport, Recording, cfg

TP = TopicPartition("t", 3, 1)
Expected = tuple[list[Message], int, int, int, str]


def record(value: bytes, msg_id: int) -> bytes:
    rec = bytearray(build_record(value))
    struct.pack_into(">q", rec, 8, msg_id)
    return bytes(rec)


def reference(buf: bytes, base: int, max_record: int) -> Expected:
    """What a scan must find: (messages, next_offset, need, corrupt_at, reason)."""
    out: list[Message] = []
    pos = 0
    while pos + 20 <= len(buf):
        length, crc, mid, flag = struct.unpack_from(">iiqi", buf, pos)
        assert flag == 0, "the generator never sets a flag"
        if length < 0 or length > max_record:
            return out, base + pos, 0, base + pos, f"bad length {length}"
        stop = pos + 20 + length
        if stop > len(buf):
            break
        data = buf[pos + 20 : stop]
        if zlib.crc32(data) & 0x7FFFFFFF != crc:
            return out, base + pos, 0, base + pos, "checksum mismatch"
        out.append(Message("t", 1, base + pos, mid, data, None, base + stop, 3))
        pos = stop
    need = 0
    if not out and pos + 20 <= len(buf):
        need = 20 + struct.unpack_from(">i", buf, pos)[0]
    return out, base + pos, need, -1, ""


def lengths(rnd: random.Random) -> list[int]:
    """Record payload lengths: one size, runs of sizes, or every record its own size."""
    sizes = [0, 1, 3, 100, 102, 104, 1000]
    kind = rnd.choice(["fixed", "runs", "random"])
    if kind == "fixed":
        return [rnd.choice(sizes)] * rnd.randint(1, 300)
    if kind == "runs":
        out: list[int] = []
        for _ in range(rnd.randint(1, 6)):
            out += [rnd.choice(sizes)] * rnd.randint(1, 80)
        return out
    return [rnd.randint(0, 300) for _ in range(rnd.randint(1, 200))]


def corrupt(buf: bytearray, starts: list[int], rnd: random.Random) -> None:
    """Flip one byte of one record's length, CRC or payload (never its flag)."""
    i = rnd.randrange(len(starts))
    end = starts[i + 1] if i + 1 < len(starts) else len(buf)
    where = rnd.choice(["length", "crc", "payload"])
    if where == "length":
        buf[starts[i] + rnd.randrange(4)] ^= 1 << rnd.randrange(8)
    elif where == "crc":
        buf[starts[i] + 4 + rnd.randrange(4)] ^= 1 << rnd.randrange(8)
    elif end > starts[i] + 20:
        buf[rnd.randrange(starts[i] + 20, end)] ^= 1 << rnd.randrange(8)


def test_scan_matches_a_plain_walk_on_random_replies(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(300):
        buf = bytearray()
        starts: list[int] = []
        for n in lengths(rnd):
            starts.append(len(buf))
            buf += record(rnd.randbytes(n), rnd.randrange(1 << 63))
        if rnd.random() < 0.4:
            corrupt(buf, starts, rnd)
        if rnd.random() < 0.4:
            del buf[rnd.randrange(len(buf) + 1) :]
        data, base = bytes(buf), rnd.randrange(1 << 40)
        max_record = rnd.choice([1 << 30, 1 << 30, 500])
        msgs, nxt, need, bad, reason = reference(data, base, max_record)
        sc = scan(data, TP, base, max_record=max_record)
        assert list(sc.messages) == msgs
        assert (sc.next_offset, sc.need, sc.corrupt_at, sc.reason) == (nxt, need, bad, reason)
        batch = sc.messages
        assert isinstance(batch, MessageBatch) and batch.values() == [m.value for m in msgs]
        for i, m in enumerate(msgs):
            assert batch[i] == m
            assert (batch.offset_at(i), batch.next_offset_at(i), batch.id_at(i)) == (
                m.offset,
                m.next_offset,
                m.id,
            )


@pytest.mark.parametrize("size", [100, 101, 102, 104])  # id columns read 8/1/2/4 bytes at once
def test_run_reads_exact_ids_offsets_and_stops_at_a_bad_crc(size: int) -> None:
    ids = [(1 << 62) + 7 * i + (i << 33) for i in range(40)]
    buf = bytearray(b"".join(record(bytes([i]) * size, ids[i]) for i in range(40)))
    stride = 20 + size
    buf[25 * stride + 20 + size // 2] ^= 0x10  # payload of record 25
    sc = scan(bytes(buf), TP, 5000)
    assert [(m.offset, m.next_offset, m.id) for m in sc.messages] == [
        (5000 + i * stride, 5000 + (i + 1) * stride, ids[i]) for i in range(25)
    ]
    assert [m.value for m in sc.messages] == [bytes([i]) * size for i in range(25)]
    assert (sc.corrupt_at, sc.next_offset, sc.reason) == (
        5000 + 25 * stride,
        5000 + 25 * stride,
        "checksum mismatch",
    )
    assert list(scan(bytes(buf), TP, 5000, verify=False).messages)[25].value != bytes([25]) * size


def test_attribute_record_inside_a_run_decodes_the_reply_eagerly() -> None:
    plain = [record(b"p%03d" % i, i + 1) for i in range(50)]
    attr = bytearray(build_record(b"with-attr", "k=v"))
    struct.pack_into(">q", attr, 8, 999)
    buf = b"".join(plain[:30]) + bytes(attr) + b"".join(plain[30:])
    sc = scan(buf, TP, 0)
    expected, nxt = decode_messages(buf, "t", 1, 0, broker_id=3)
    assert list(sc.messages) == expected and sc.next_offset == nxt == len(buf)
    assert sc.messages[30].attribute == "k=v" and sc.messages[30].id == 999
    assert [m.value for m in sc.messages][29:32] == [b"p029", b"with-attr", b"p030"]


def test_message_is_an_immutable_named_tuple_with_the_documented_fields() -> None:
    m = Message("t", 1, 40, 9, b"v", None, 62, 3)
    assert (m.topic, m.partition, m.offset, m.id, m.value, m.attribute) == (
        "t",
        1,
        40,
        9,
        b"v",
        None,
    )
    assert (m.next_offset, m.broker_id, m.partition_key) == (62, 3, "3-1")
    assert Message("t", 1, 40, 9, b"v") == Message("t", 1, 40, 9, b"v", None, 0, 0)
    with pytest.raises(AttributeError):
        m.value = b"other"  # type: ignore[misc]
    assert m._replace(value=b"w").value == b"w" and m.value == b"v"


# ---------------------------------------------------------------- listener chunks


def test_listener_chunks_keep_order_retry_the_failed_message_and_commit_the_end(
    tmp_path: Path,
) -> None:
    tp = TopicPartition("t", 0, 0)
    log = FakeLog()
    for i in range(700):  # more than two delivery chunks
        log.append(b"m%d" % i)
    seen: list[bytes] = []
    failed_once: set[bytes] = set()
    lock = threading.Lock()

    def listener(m: Message) -> None:
        with lock:
            if m.value in (b"m300", b"m511", b"m256") and m.value not in failed_once:
                failed_once.add(m.value)
                raise RuntimeError("once")
            if m.value == b"m600":
                raise RuntimeError("always")
            seen.append(m.value)

    policy = Recording()
    store = FileOffsetStore(tmp_path / "o.json")
    c = Consumer(
        group="g",
        offset_store=store,
        config=cfg(max_fetch_retries=2, max_delay_fetch_ms=10),
        transport=FakeTransport({tp: log}),
        reject_policy=policy,
    )
    c.subscribe("t", listener)
    c.start()
    wait_for(lambda: len(seen) == 699)
    c.close()
    assert seen == [b"m%d" % i for i in range(700) if i != 600]
    assert [m.value for m, _ in policy.rejected] == [b"m600"]
    assert c.failures == 3 + 3  # three failed once, m600 on all 1 + 2 attempts
    entry = store.load("g", "t", "0-0")
    assert entry is not None and (entry.offset, entry.msg_id) == (log.max_offset, 700)
