"""Framing at a live broker: what closes a connection and what does not (defects 6 and 9).

- An oversized ``put``/``bput`` (its length token readable, over the limit) is answered
  ``result 400`` with its opaque, its body is read and discarded (never buffered: the broker's
  RSS does not grow by the body), nothing is stored, and the connection stays usable.
- An unknown verb is answered ``result 400 <len> <opaque>\\r\\nunknown command <verb>`` and the
  connection is closed (MetaQ closes on an undecodable command; pymetaq says why first).  The
  requests before it on the connection are answered, nothing after it is run.
- Lines may end with a bare LF (``echo stats | nc``), CRLF or both mixed.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.server.stats import VERSION
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import iter_records
from tests._broker import BrokerProcess
from tests.server._attacks import rss_kb
from tests.server._helpers import Wire, bput_frame, put_line, result

pytestmark = pytest.mark.integration

MAX_TRANSFER = 4096
MAX_BATCH = 65536
LIMIT = MAX_TRANSFER - 20  # a put's data: one record must fit one get reply


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    system = {"idleTimeoutMs": 0, "maxTransferSize": MAX_TRANSFER, "maxBatchSize": MAX_BATCH}
    topics = {"over": {}, "overb": {}, "unk": {}}
    with BrokerProcess.start(tmp_path_factory.mktemp("framing"), topics=topics, system=system) as b:
        yield b


@pytest.fixture
def wire(broker: BrokerProcess) -> Iterator[Wire]:
    with Wire(broker.address) as w:
        yield w


def stored(w: Wire, topic: str, opaque: int) -> list[bytes]:
    """Every record of partition 0 (gets are capped at maxTransferSize: walk the log)."""
    out: list[bytes] = []
    offset = 0
    for _ in range(1000):
        got = w.call(b"get %s g 0 %d 1048576 %d\r\n" % (topic.encode(), offset, opaque))
        if isinstance(got, ResultReply):
            assert got.code == 404, got
            return out
        records = list(iter_records(got.data, offset))
        out += [r.data for r in records]
        offset = records[-1].offset + records[-1].size
    raise AssertionError("log longer than expected")


# --------------------------------------------------------------------------- defect 6


def test_an_oversized_put_is_400_the_body_discarded_and_the_connection_kept(wire: Wire) -> None:
    size = LIMIT + 1
    data = b"o" * size
    wire.send(put_line("over", 0, data, 160, checksum(data)) + b"version 161\r\n")
    reason = b"put body of %d bytes exceeds the limit of %d" % (size, LIMIT)
    expected = result(400, reason, 160) + result(200, VERSION.encode(), 161)
    assert wire.read_exact(len(expected)) == expected
    ok = b"k" * LIMIT  # exactly the limit is stored
    reply = wire.call(put_line("over", 0, ok, 162, checksum(ok)))
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    assert stored(wire, "over", 163) == [ok]


def test_an_oversized_legacy_put_in_pieces_keeps_the_connection(wire: Wire) -> None:
    size = 3 * MAX_TRANSFER
    wire.send(b"put over 0 %d 0 170\r\n" % size)
    for _ in range(3):  # the body arrives in pieces, as a slow client sends it
        wire.send(b"p" * MAX_TRANSFER)
    reason = b"put body of %d bytes exceeds the limit of %d" % (size, LIMIT)
    assert wire.reply() == ResultReply(400, reason, 170)
    assert wire.call(b"version 171\r\n") == ResultReply(200, VERSION.encode(), 171)


def test_an_oversized_bput_is_400_and_stores_nothing(wire: Wire) -> None:
    payloads = [b"b" * 1000] * 70  # 70 records of 1020 bytes: over the 64 KiB batch limit
    frame = bput_frame("overb", 0, payloads, 180)
    body_len = len(frame) - frame.index(b"\r\n") - 2
    wire.send(frame)
    reason = b"bput body of %d bytes exceeds the limit of %d" % (body_len, MAX_BATCH)
    assert wire.reply() == ResultReply(400, reason, 180)
    reply = wire.call(bput_frame("overb", 0, payloads[:10], 181))
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    assert stored(wire, "overb", 182) == payloads[:10]


def test_an_oversized_body_is_never_buffered(broker: BrokerProcess) -> None:
    assert broker.proc is not None
    size = 256 << 20
    chunk = b"\0" * (4 << 20)
    with Wire(broker.address) as w:
        before = rss_kb(broker.proc.pid)
        w.send(b"put over 0 %d 0 -1 190\r\n" % size)
        peak = before
        for _ in range(size // len(chunk)):
            w.send(chunk)
            peak = max(peak, rss_kb(broker.proc.pid))
        reason = b"put body of %d bytes exceeds the limit of %d" % (size, LIMIT)
        assert w.reply() == ResultReply(400, reason, 190)
        peak = max(peak, rss_kb(broker.proc.pid))
        assert w.call(b"version 191\r\n") == ResultReply(200, VERSION.encode(), 191)
    grew_mb = (peak - before) / 1024
    print(f"RSS before {before / 1024:.1f} MB, peak {peak / 1024:.1f} MB over a 256 MiB body")
    assert grew_mb < 32, f"the broker buffered the discarded body: RSS grew {grew_mb:.1f} MB"


def test_a_body_length_over_int32_is_lost_framing_and_closes(wire: Wire) -> None:
    wire.send(b"put over 0 2147483648 0 -1 195\r\n")
    reason = b"missing or invalid body length"
    assert wire.read_until_closed() == result(400, reason, 195)


# --------------------------------------------------------------------------- defect 9


def test_an_unknown_command_is_400_with_its_opaque_then_close(wire: Wire) -> None:
    data = b"before"
    wire.send(
        put_line("unk", 0, data, 200, checksum(data))
        + b"version 201\r\n"
        + b"foo bar 202\r\n"
        + b"version 203\r\n"  # never run: the connection closes after the unknown verb
    )
    got = wire.read_until_closed()
    replies = frames(got)
    # the put before it is acknowledged before the close (its ack comes once it is durable,
    # after the version's reply); nothing after the unknown verb is run
    assert [opaque for opaque, _code, _body in replies] == [201, 202, 200], got
    assert got.startswith(
        result(200, VERSION.encode(), 201) + result(400, b"unknown command foo", 202)
    )
    _opaque, code, body = replies[2]
    assert code == 200 and body.split()[1:] == [b"0", b"0"], got  # "<msgId> 0 <offset 0>"
    with Wire(wire.sock.getpeername()) as w:
        assert stored(w, "unk", 204) == [data]


def test_a_quit_answers_the_puts_before_it(wire: Wire) -> None:
    data = b"before quit"
    wire.send(put_line("unk", 0, data, 230, checksum(data)) + b"quit\r\n")
    replies = frames(wire.read_until_closed())
    assert [(opaque, code) for opaque, code, _body in replies] == [(230, 200)]
    with Wire(wire.sock.getpeername()) as w:
        assert data in stored(w, "unk", 231)


def frames(got: bytes) -> list[tuple[int, int, bytes]]:
    """``result`` frames as (opaque, code, body), in the order they arrived."""
    out = []
    rest = got
    while rest:
        head, _, rest = rest.partition(b"\r\n")
        verb, code, length, opaque = head.split()
        assert verb == b"result", got
        out.append((int(opaque), int(code), rest[: int(length)]))
        rest = rest[int(length) :]
    return out


def test_an_unknown_verb_with_a_body_never_runs_the_body(wire: Wire) -> None:
    inner = put_line("unk", 0, b"injected", 211)  # a body that would parse as a put
    wire.send(b"xput unk 0 %d 0 -1 210\r\n" % len(inner) + inner)
    assert wire.read_until_closed() == result(400, b"unknown command xput", 210)
    with Wire(wire.sock.getpeername()) as w:
        assert b"injected" not in b"".join(stored(w, "unk", 212))


def test_an_unknown_command_without_an_opaque_answers_opaque_0(wire: Wire) -> None:
    wire.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wire.read_until_closed() == result(400, b"unknown command GET", 0)


# --------------------------------------------------------------------------- bare LF


def test_bare_lf_lines_and_crlf_lines_mix(broker: BrokerProcess) -> None:
    with socket.create_connection(broker.address, timeout=20) as sock:
        sock.sendall(b"version 1\nversion 2\r\nput unk 0 2 0 -1 3\nlfstats\n")
        sock.shutdown(socket.SHUT_WR)
        got = b""
        deadline = time.monotonic() + 20
        while (chunk := sock.recv(65536)) and time.monotonic() < deadline:
            got += chunk
    version = VERSION.encode()
    assert got.startswith(result(200, version, 1) + result(200, version, 2))
    assert b"\r\nSTATS\r\npid " in got and b"\r\nEND\r\n" in got
    assert got.count(b"result 200 ") == 4  # the put was stored too (its ack may come last)
    with Wire(broker.address) as w:
        assert b"lf" in stored(w, "unk", 5)


def test_value_replies_are_unaffected_by_bare_lf_in_bodies(wire: Wire) -> None:
    data = b"line one\nline two\r\n"
    reply = wire.call(put_line("unk", 0, data, 220, checksum(data)))
    assert isinstance(reply, ResultReply) and reply.code == 200
    got = wire.call(b"get unk g 0 0 1048576 221\r\n")
    assert isinstance(got, ValueReply)
    assert data in [r.data for r in iter_records(got.data)]
