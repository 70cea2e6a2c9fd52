"""Issue 8, defect 5 (client side): a CRC-valid record the consumer cannot decode goes to the
reject policy, is counted, and the partition moves on — it is never retried forever.

The poison records are written into the data directory with the storage API *before* the
broker starts (the broker refuses such flags on put, so a client cannot store them any more);
the broker then serves them as it serves any stored bytes. Every consumer face and both
policies are run against that real broker.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client import AsyncConsumer, Consumer, Message
from pymetaq.client.consumer import DropPolicy, LocalRecoverPolicy, UndecodableRecord
from pymetaq.client.consumer.recover import dead_letter_name
from pymetaq.client.spool import Spool
from pymetaq.offsets import FileOffsetStore
from pymetaq.storage.record import FLAG_ATTRIBUTE, FLAG_LZ4_BATCH, encode_record
from pymetaq.storage.segment import segment_name
from tests._broker import BrokerProcess
from tests._helpers import wait_for

pytestmark = pytest.mark.integration

TOPIC = "poison"
GOOD = [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
#: (data, flag, why) of CRC-valid records no client can decode
POISON = [
    (b"not an lz4 frame", FLAG_LZ4_BATCH, "lz4 flag on data that is not lz4"),
    (struct.pack(">i", 9999) + b"x", FLAG_ATTRIBUTE, "attribute length beyond the data"),
    (b"\xff" * 8, -1, "flag -1"),
]
#: the stored order: good records around and between the poison ones
LAYOUT: list[bytes | int] = [GOOD[0], GOOD[1], 0, GOOD[2], 1, 2, GOOD[3], GOOD[4], GOOD[5]]


def _store(data_path: Path) -> list[bytes]:
    """Write LAYOUT as the segment file of ``<data_path>/poison-0``, the bytes an older broker
    (or a damaged client talking to one) could have stored: the storage API and the broker now
    refuse such flags, recovery only checks framing and CRCs.  Returns the poison records in
    log order."""
    records: list[tuple[bytes, int]] = []
    msg_id = 1 << 40  # any non-zero ids (0 is the zero-filled tail)
    for item in LAYOUT:
        data, flag = (item, 0) if isinstance(item, bytes) else POISON[item][:2]
        records.append((encode_record(data, flag, msg_id), flag))
        msg_id += 1
    directory = data_path / f"{TOPIC}-0"
    directory.mkdir(parents=True)
    (directory / segment_name(0)).write_bytes(b"".join(r for r, _ in records))
    return [r for r, flag in records if flag != 0]


@pytest.fixture
def poisoned(tmp_path: Path) -> Iterator[tuple[BrokerProcess, list[bytes]]]:
    poison = _store(tmp_path / "broker" / "data")
    assert len(poison) == len(POISON)
    with BrokerProcess.start(tmp_path, topics={TOPIC: {"numPartitions": 1}}) as broker:
        yield broker, poison


FAST: dict[str, Any] = dict(max_delay_fetch_ms=100, long_poll_ms=100, initial_position="earliest")


def _poll_all(c: Consumer, n: int) -> list[Message]:
    got: list[Message] = []

    def more() -> bool:
        got.extend(c.poll(0.2))
        return len(got) >= n

    wait_for(more, 60, f"{n} messages")
    return got


def test_poll_mode_drops_undecodable_records_counts_them_and_commits_past(
    poisoned: tuple[BrokerProcess, list[bytes]], tmp_path: Path
) -> None:
    broker, _poison = poisoned
    store = FileOffsetStore(tmp_path / "offsets.json")
    policy = DropPolicy()
    url = f"meta://{broker.host}:{broker.port}"
    with Consumer(url, "g", store, reject_policy=policy, **FAST) as c:
        c.subscribe(TOPIC)
        got = _poll_all(c, len(GOOD))
        assert [m.value for m in got] == GOOD  # in order, nothing after a poison record lost
        assert c.stats["undecodable"] == len(POISON)
        assert policy.dropped == len(POISON)
        c.commit()
        end = got[-1].next_offset
    entry = store.load("g", TOPIC, "0-0")
    assert entry is not None and entry.offset == end  # committed past every poison record
    # a restart resumes at the end: the poison records are not met (nor rejected) again
    policy2 = DropPolicy()
    with Consumer(url, "g", store, reject_policy=policy2, **FAST) as c:
        c.subscribe(TOPIC)
        assert c.poll(0.5) == []
        assert policy2.dropped == 0
    store.close()


def test_listener_mode_dead_letters_the_exact_records(
    poisoned: tuple[BrokerProcess, list[bytes]], tmp_path: Path
) -> None:
    broker, poison = poisoned
    recover = tmp_path / "recover"
    seen: list[bytes] = []
    done = threading.Event()

    def listener(m: Message) -> None:
        seen.append(m.value)
        if len(seen) == len(GOOD):
            done.set()

    url = f"meta://{broker.host}:{broker.port}"
    store = FileOffsetStore(tmp_path / "offsets.json")
    policy = LocalRecoverPolicy(recover, 3600)
    with Consumer(url, "g", store, reject_policy=policy, **FAST) as c:
        c.subscribe(TOPIC, listener)
        c.start()
        assert done.wait(60), f"only {seen} delivered"
        wait_for(lambda: c.stats["undecodable"] == len(POISON), 30, "all poison rejected")
        assert policy.dead_lettered == len(POISON)
        assert policy.pending() == 0  # never queued for redelivery to the listener
    assert seen == GOOD
    store.close()
    with Spool(recover / dead_letter_name(TOPIC, "g")) as dead:
        kept = dead.pending()
    assert [e.record for e in kept] == poison  # byte for byte, ids included
    assert [e.topic for e in kept] == [TOPIC] * len(POISON)


def test_async_consumer_hands_undecodable_records_to_its_policy(
    poisoned: tuple[BrokerProcess, list[bytes]],
) -> None:
    broker, poison = poisoned
    rejected: list[tuple[Message, BaseException]] = []

    class Recording(DropPolicy):
        def reject(self, message: Message, error: BaseException) -> None:
            rejected.append((message, error))

    async def run() -> list[bytes]:
        url = f"meta://{broker.host}:{broker.port}"
        out: list[bytes] = []
        async with AsyncConsumer(url, None, reject_policy=Recording(), **FAST) as c:
            c.subscribe(TOPIC)
            async with asyncio.timeout(60):
                while len(out) < len(GOOD):
                    out += (await c.poll(0.2)).values()
            assert c.stats["undecodable"] == len(POISON)
        return out

    assert asyncio.run(run()) == GOOD
    assert [type(e) for _, e in rejected] == [UndecodableRecord] * len(POISON)
    errors = [e for _, e in rejected if isinstance(e, UndecodableRecord)]
    assert [e.record for e in errors] == poison
    assert [e.flag for e in errors] == [flag for _, flag, _ in POISON]
    assert [m.offset for m, _ in rejected] == [e.offset for e in errors]
