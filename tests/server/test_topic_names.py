"""Hostile topic names at a live broker: path escapes, aliasing, gets that create files, length.

A topic name becomes a directory (``<dataPath>/<topic>-<partition>``).  Before the fix a
``[topic=log-*]`` pattern matched ``/`` and ``..``: a put to ``log-/../../../outside`` created
files outside dataPath, a put to ``log-x/../test`` opened a second log on ``test-0``'s files
and overwrote acknowledged messages, gets with such names created segment files, and a name
over the file-name limit got a 500 carrying an internal exception text.  Now every such name is
answered ``400 invalid topic name ...`` before anything touches the disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, put_line

pytestmark = pytest.mark.integration

TOPICS = {"test": {"numPartitions": 2}, "log-*": {"numPartitions": 2}}
ESCAPES = [
    "log-/../../../outside",
    "log-x/../../escape",
    "log-a/b",
    "log-..",  # valid: "log-.." is an ordinary name (dots are fine unless the name is . or ..)
    "log-x/../test",
    "log-\\..\\x",
    "log-é",
    "..",
    ".",
]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess.start(tmp_path, topics=TOPICS) as b:
        yield b


def fetch(w: Wire, topic: str, partition: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        reply = w.call(b"get %s g %d %d 1048576 1\r\n" % (topic.encode(), partition, offset))
        if isinstance(reply, ResultReply):
            assert reply.code == 404, reply
            return out
        assert isinstance(reply, ValueReply)
        records = list(iter_records(reply.data, offset))
        out += [(r.msg_id, r.data) for r in records]
        offset = records[-1].offset + records[-1].size


def test_path_escaping_names_are_400_and_touch_nothing(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    before = tree(tmp_path)
    with Wire(broker.address) as w:
        for n, name in enumerate(ESCAPES):
            data = b"escape %d" % n
            reply = w.call(put_line(name, 0, data, n, checksum(data)))
            assert isinstance(reply, ResultReply)
            if name == "log-..":
                assert reply.code == 200, reply
                continue
            assert reply.code == 400 and reply.body.startswith(b"invalid topic name"), (name, reply)
            for line in (
                b"get %s g 0 0 1024 %d\r\n" % (name.encode(), n),
                b"get %s g 0 0 1024 50 %d\r\n" % (name.encode(), n),  # long poll
                b"offset %s g 0 0 %d\r\n" % (name.encode(), n),
            ):
                got = w.call(line)
                assert isinstance(got, ResultReply) and got.code == 400, (line, got)
                assert got.body.startswith(b"invalid topic name"), got
    created = tree(tmp_path) - before
    rel = str(broker.data_path.relative_to(tmp_path))
    assert created <= {f"{rel}/log-..-0", *(f"{rel}/log-..-0/{n}" for n in _names(broker))}
    assert broker.proc is not None and broker.proc.poll() is None


def _names(broker: BrokerProcess) -> list[str]:
    d = broker.data_path / "log-..-0"
    return os.listdir(d) if d.is_dir() else []


def test_aliased_name_cannot_reach_another_topics_log(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        want = []
        for i in range(200):
            data = b"acked %d" % i
            reply = w.call(put_line("test", 0, data, i, checksum(data)))
            assert isinstance(reply, ResultReply) and reply.code == 200
            want.append((int(reply.body.split()[0]), data))
        for i in range(50):  # the aliases: each would be test-0's directory
            for alias in ("log-x/../test", "log-/../data/test", "log-./../test"):
                data = b"alias %d" % i
                reply = w.call(put_line(alias, 0, data, 1000 + i, checksum(data)))
                assert isinstance(reply, ResultReply) and reply.code == 400, reply
                got = w.call(b"get %s g 0 0 1024 %d\r\n" % (alias.encode(), 2000 + i))
                assert isinstance(got, ResultReply) and got.code == 400, got
        assert fetch(w, "test", 0) == want


def test_gets_and_offsets_never_create_a_store(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        for n, line in enumerate(
            [
                b"get test g 1 0 1024 1\r\n",
                b"get log-new g 0 0 1024 2\r\n",
                b"get log-new g 1 0 1024 30 3\r\n",  # long poll on a store that does not exist
                b"offset log-new g 0 0 4\r\n",
                b"offset test g 1 0 5\r\n",
                b"get log-other g 0 5 1024 6\r\n",
            ]
        ):
            got = w.call(line)
            assert isinstance(got, ResultReply) and got.code == 404, (n, line, got)
    # the lock and the transaction journal (dataLogPath = dataPath), no partition store
    assert sorted(os.listdir(broker.data_path)) == [".lock", "transactions"]


def test_long_poll_on_a_missing_store_wakes_when_a_put_creates_it(broker: BrokerProcess) -> None:
    with Wire(broker.address) as consumer, Wire(broker.address) as producer:
        consumer.send(b"get log-late g 0 0 4096 20000 7\r\n")
        assert not (broker.data_path / "log-late-0").exists()
        data = b"late"
        reply = producer.call(put_line("log-late", 0, data, 8, checksum(data)))
        assert isinstance(reply, ResultReply) and reply.code == 200
        got = consumer.reply()
        assert isinstance(got, ValueReply) and got.opaque == 7
        assert [r.data for r in iter_records(got.data)] == [data]


@pytest.mark.parametrize("length", [201, 255, 300, 3000])
def test_a_name_over_the_limit_is_a_clean_400(broker: BrokerProcess, length: int) -> None:
    name = "log-" + "x" * (length - 4)
    with Wire(broker.address) as w:
        data = b"long"
        for line in (
            put_line(name, 0, data, 9, checksum(data)),
            b"get %s g 0 0 1024 10\r\n" % name.encode(),
            b"offset %s g 0 0 11\r\n" % name.encode(),
        ):
            got = w.call(line)
            assert isinstance(got, ResultReply) and got.code == 400, got
            assert got.body == b"invalid topic name: %d characters, at most 200" % length, got
        # the limit itself is fine
        ok = "log-" + "y" * 196
        reply = w.call(put_line(ok, 1, data, 12, checksum(data)))
        assert isinstance(reply, ResultReply) and reply.code == 200, reply
    assert b"Traceback" not in broker.log_text().encode()
