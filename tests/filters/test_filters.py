"""Server-side filters against a real broker: two groups on one topic, one filtered, each sees
exactly its messages in order at their true offsets; a raising filter follows its policy; a
filter that blocks leaves the loop and the other groups answering."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import encode_record, iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire

pytestmark = pytest.mark.integration

FILTERS = '''
import os
import time

def even(attribute, data):
    return int(data) % 2 == 0

def tagged(attribute, data):
    return attribute == "keep"

def boom(attribute, data):
    if int(data) % 3 == 0:
        raise ValueError("boom")
    return True

def gate(attribute, data):
    """Blocks on message 5 until the test creates the gate file (bounded: 30 s)."""
    if data == b"5":
        path = os.path.join(os.path.dirname(__file__), "gate")
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
    return True
'''


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("filters")
    mods = tmp / "mods"
    mods.mkdir()
    (mods / "tfilters.py").write_text(textwrap.dedent(FILTERS), encoding="utf-8")
    topics: dict[str, dict[str, object]] = {
        "orders": {"group.evens": "tfilters:even", "group.careful": "tfilters:boom"},
        "tags": {"group.keepers": "tfilters:tagged"},
        "slow": {
            "group.gated": "tfilters:gate",
            "filterTimeoutMs": 200,
            "filterErrorPolicy": "keep",
        },
        "broken": {"group.g": "tfilters:missing"},
    }
    system = {"idleTimeoutMs": 0, "appClassPath": str(mods)}
    with BrokerProcess.start(tmp, topics=topics, system=system) as b:
        yield b


def produce(w: Wire, topic: str, records: list[bytes]) -> None:
    body = b"".join(records)
    reply = w.call(
        b"bput %s 0 %d %d %d 1\r\n" % (topic.encode(), len(body), len(records), checksum(body))
        + body
    )
    assert isinstance(reply, ResultReply) and reply.code == 200, reply


def read_all(
    w: Wire, topic: str, group: str, max_size: int = 1 << 20
) -> tuple[list[tuple[int, bytes]], int]:
    """Every (offset, payload) the group gets from offset 0, following 301s; and the 301s."""
    out: list[tuple[int, bytes]] = []
    offset, moves = 0, 0
    for _ in range(10_000):
        reply = w.call(
            b"get %s %s 0 %d %d 9\r\n" % (topic.encode(), group.encode(), offset, max_size)
        )
        if isinstance(reply, ValueReply):
            records = list(iter_records(reply.data, offset))
            out += [(r.offset, r.data) for r in records]
            offset = records[-1].offset + records[-1].size
            continue
        assert isinstance(reply, ResultReply)
        if reply.code == 301:
            moves += 1
            assert int(reply.body) > offset
            offset = int(reply.body)
            continue
        assert reply.code == 404, reply
        return out, moves
    raise AssertionError("no end")


def test_two_groups_each_see_exactly_their_messages_at_true_offsets(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        produce(w, "orders", [encode_record(b"%d" % i) for i in range(200)])
        everything, moves = read_all(w, "orders", "all")
        assert [d for _, d in everything] == [b"%d" % i for i in range(200)] and moves == 0
        evens, moves = read_all(w, "orders", "evens", max_size=200)
        assert evens == [(o, d) for o, d in everything if int(d) % 2 == 0]
        assert moves > 0  # a skipped message at the requested offset is a 301 past it


def test_an_all_filtered_slice_is_a_301_past_it_as_metaq(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        attr = 1  # flag bit 0: the data starts with the attribute

        def rec(tag: str, text: bytes) -> bytes:
            a = tag.encode()
            return encode_record(len(a).to_bytes(4, "big") + a + text, flag=attr)

        produce(w, "tags", [rec("drop", b"x%d" % i) for i in range(10)] + [rec("keep", b"k")])
        reply = w.call(b"get tags keepers 0 0 100 3\r\n")  # 3 whole 30-byte records fit
        assert isinstance(reply, ResultReply) and reply.code == 301
        assert reply.body == b"%d" % (3 * len(rec("drop", b"x0")))
        got, _ = read_all(w, "tags", "keepers")
        assert [d[-1:] for _, d in got] == [b"k"]


def test_a_raising_filter_skips_per_policy_and_the_broker_stays_up(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        got, _ = read_all(w, "orders", "careful")
        assert [int(d) for _, d in got] == [i for i in range(200) if i % 3]
        version = w.call(b"version 5\r\n")
        assert isinstance(version, ResultReply) and version.code == 200
    assert "ValueError: boom" in broker.log_text()


def test_a_blocked_filter_stalls_only_its_own_group(broker: BrokerProcess, tmp_path: Path) -> None:
    gate = Path(broker.config_path).parent.parent / "mods" / "gate"
    with Wire(broker.address) as w, Wire(broker.address) as other:
        produce(w, "slow", [encode_record(b"%d" % i) for i in range(10)])
        # the filter blocks on message 5: after filterTimeoutMs the get is answered with what
        # was decided (0..4 kept) and the first undecided message per the policy (keep: 5)
        reply = w.call(b"get slow gated 0 0 1048576 1\r\n")
        assert isinstance(reply, ValueReply)
        assert [r.data for r in iter_records(reply.data)] == [b"%d" % i for i in range(6)]
        # while the filter is still blocked: an unfiltered group and other commands answer
        plain = other.call(b"get slow all 0 0 1048576 2\r\n")
        assert isinstance(plain, ValueReply) and len(list(iter_records(plain.data))) == 10
        # the next get of the group: its worker is still blocked, so one message per timeout
        offset = sum(len(encode_record(b"%d" % i)) for i in range(6))
        again = w.call(b"get slow gated 0 %d 1048576 3\r\n" % offset)
        assert isinstance(again, ValueReply)
        assert [r.data for r in iter_records(again.data)] == [b"6"]
        assert not gate.exists()
        gate.write_text("open")


def test_a_filter_that_cannot_be_loaded_is_a_500_for_its_group_only(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        produce(w, "broken", [encode_record(b"x")])
        reply = w.call(b"get broken g 0 0 1024 1\r\n")
        assert isinstance(reply, ResultReply) and reply.code == 500
        assert reply.body.startswith(b"filter tfilters:missing cannot be loaded")
        assert isinstance(w.call(b"get broken other 0 0 1024 2\r\n"), ValueReply)
