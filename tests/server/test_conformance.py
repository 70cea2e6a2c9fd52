"""Every verb, reply code and error of the broker over raw sockets, with exact reply bytes.

One broker subprocess serves the whole module (topics are chosen so tests do not interfere:
each test writes to its own topic or partition where offsets matter).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.server.stats import VERSION
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import HEADER, HEADER_SIZE, encode_record, iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, bput_frame, put_line, result

pytestmark = pytest.mark.integration

MAX_INT = 2147483647
TOPICS = {
    "test": {"numPartitions": 2},
    "t-get": {},
    "t-bput": {},
    "t-multi": {},
    "t-poll": {},
    "t-legacy": {},
    "t-stat": {"stat": "true"},
    "closed": {"acceptPublish": "false", "acceptSubscribe": "false"},
    "log-*": {"numPartitions": 3},
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("conformance")
    with BrokerProcess.start(tmp, topics=TOPICS, system={"idleTimeoutMs": 0}) as b:  # type: ignore[arg-type]
        yield b


@pytest.fixture
def wire(broker: BrokerProcess) -> Iterator[Wire]:
    with Wire(broker.address) as w:
        yield w


def assert_nothing_stored(w: Wire, topic: str, partition: int, opaque: int) -> None:
    """The partition holds no byte: it has no store at all, or its max offset is 0."""
    reply = w.call(b"offset %s g %d 0 %d\r\n" % (topic.encode(), partition, opaque))
    not_exists = b"The topic `%s` in partition `%d` is not exists" % (topic.encode(), partition)
    assert reply in (ResultReply(200, b"0", opaque), ResultReply(404, not_exists, opaque))


def put_ok(
    w: Wire, topic: str, data: bytes, opaque: int, partition: int = 0
) -> tuple[int, int, int]:
    reply = w.call(put_line(topic, partition, data, opaque, checksum(data)))
    assert isinstance(reply, ResultReply)
    assert (reply.code, reply.opaque) == (200, opaque), reply
    msg_id, part, offset = (int(x) for x in reply.body.split(b" "))
    return msg_id, part, offset


# -- version / heartbeat -----------------------------------------------------------------------


def test_version_reply_is_exact(wire: Wire) -> None:
    wire.send(b"version 7\r\n")
    expected = result(200, VERSION.encode(), 7)
    assert wire.read_exact(len(expected)) == expected


def test_bare_version_uses_max_int_opaque(wire: Wire) -> None:
    wire.send(b"version\r\n")
    expected = result(200, VERSION.encode(), MAX_INT)
    assert wire.read_exact(len(expected)) == expected


# -- put ---------------------------------------------------------------------------------------


def test_put_with_checksum_then_get_returns_the_exact_record(wire: Wire) -> None:
    data = b"hello metaq"
    msg_id, part, offset = put_ok(wire, "t-get", data, 11)
    assert (part, offset) == (0, 0) and msg_id > 0
    wire.send(b"get t-get g1 0 0 1024 12\r\n")
    record = HEADER.pack(len(data), checksum(data), msg_id, 0) + data
    expected = b"value %d 12\r\n" % len(record) + record
    assert wire.read_exact(len(expected)) == expected


def test_consecutive_puts_have_byte_offsets_and_increasing_ids(wire: Wire) -> None:
    datas = [b"a" * 10, b"bb" * 7, b"c"]
    replies = [put_ok(wire, "t-multi", d, 20 + i) for i, d in enumerate(datas)]
    offsets = [r[2] for r in replies]
    assert offsets == [0, HEADER_SIZE + 10, 2 * HEADER_SIZE + 10 + 14]
    ids = [r[0] for r in replies]
    assert ids == sorted(ids) and len(set(ids)) == 3
    reply = wire.call(b"get t-multi g 0 0 4096 30\r\n")
    assert isinstance(reply, ValueReply)
    records = list(iter_records(reply.data))
    assert [r.data for r in records] == datas
    assert [r.msg_id for r in records] == ids


def test_put_checksum_mismatch_is_500_and_stores_nothing(wire: Wire) -> None:
    data = b"payload"
    good = checksum(data)
    wire.send(put_line("test", 1, data, 31, good ^ 1))
    body = f"Checksum failed: expected {good ^ 1}, computed {good}".encode()
    expected = result(500, body, 31)
    assert wire.read_exact(len(expected)) == expected
    assert_nothing_stored(wire, "test", 1, 32)


def test_put_with_attribute_flag_is_stored_with_its_flag(wire: Wire) -> None:
    attr = b"tag-1"
    data = struct.pack(">i", len(attr)) + attr + b"body"
    put_ok(wire, "log-attr", data, 40, partition=2)
    reply = wire.call(put_line("log-attr", 2, data, 41, checksum(data), flag=1))
    assert isinstance(reply, ResultReply) and reply.code == 200
    got = wire.call(b"get log-attr g 2 0 4096 42\r\n")
    assert isinstance(got, ValueReply)
    flags = [r.flag for r in iter_records(got.data)]
    assert flags == [0, 1]


def test_put_partition_minus_one_lets_the_broker_pick(wire: Wire) -> None:
    seen = set()
    for i in range(40):
        reply = wire.call(put_line("log-any", -1, b"x", 100 + i, checksum(b"x")))
        assert isinstance(reply, ResultReply) and reply.code == 200
        seen.add(int(reply.body.split()[1]))
    assert seen <= {0, 1, 2} and len(seen) >= 2


def test_put_to_a_partition_out_of_range_is_500(wire: Wire) -> None:
    wire.send(put_line("test", 2, b"x", 50))
    body = b"Wrong partition 2 for topic `test`: it has 2 partition(s)"
    expected = result(500, body, 50)
    assert wire.read_exact(len(expected)) == expected


def test_put_to_an_unconfigured_topic_is_500(wire: Wire) -> None:
    wire.send(put_line("nope", 0, b"x", 51))
    expected = result(500, b"The topic `nope` is not in topics list of the broker", 51)
    assert wire.read_exact(len(expected)) == expected


def test_put_to_a_topic_closed_for_publish_is_403(wire: Wire) -> None:
    wire.send(put_line("closed", 0, b"x", 52))
    expected = result(403, b"The topic `closed` in broker does not accept publish", 52)
    assert wire.read_exact(len(expected)) == expected


def test_transactional_put_outside_a_begun_transaction_is_refused(wire: Wire) -> None:
    wire.send(b"put test 0 1 0 -1 TX:abc:1 53\r\nx")  # the full suite: tests/transactions
    expected = result(500, b"Local transaction 'TX:abc:1' has not been started.", 53)
    assert wire.read_exact(len(expected)) == expected


# -- batch put ----------------------------------------------------------------------------------


def test_bput_is_one_unit_with_consecutive_ids(wire: Wire) -> None:
    payloads = [b"m%03d" % i for i in range(50)]
    reply = wire.call(bput_frame("t-bput", 0, payloads, 60))
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    first, part, offset, count = (int(x) for x in reply.body.split())
    assert (part, offset, count) == (0, 0, 50)
    got = wire.call(b"get t-bput g 0 0 65536 61\r\n")
    assert isinstance(got, ValueReply)
    records = list(iter_records(got.data))
    assert [r.data for r in records] == payloads
    assert [r.msg_id for r in records] == list(range(first, first + 50))


def test_bput_count_that_cannot_fit_the_body_is_400_and_stores_nothing(wire: Wire) -> None:
    frame = bput_frame("test", 1, [b"a", b"b"], 62)
    frame = frame.replace(b" 2 ", b" 3 ", 1)  # 3 records need at least 60 bytes; body is 42
    wire.send(frame)
    expected = result(400, b"invalid batch: 3 records cannot fill a 42-byte body", 62)
    assert wire.read_exact(len(expected)) == expected
    assert_nothing_stored(wire, "test", 1, 63)


def test_bput_reply_carries_the_stored_count(wire: Wire) -> None:
    # the count token is not re-checked record by record (that would be per-message work in
    # the broker); the reply's count is what storage validated and wrote
    frame = bput_frame("log-count", 0, [b"a", b"b"], 67)
    reply = wire.call(frame.replace(b" 2 ", b" 1 ", 1))
    assert isinstance(reply, ResultReply) and reply.code == 200
    assert reply.body.split()[1:] == [b"0", b"0", b"2"]


def test_bput_body_checksum_mismatch_is_500(wire: Wire) -> None:
    body = encode_record(b"a")
    frame = b"bput test 1 %d 1 %d 64\r\n" % (len(body), checksum(body) ^ 1) + body
    wire.send(frame)
    expected = result(500, b"Checksum failed: batch body checksum mismatch", 64)
    assert wire.read_exact(len(expected)) == expected


def test_bput_record_with_a_bad_crc_is_400(wire: Wire) -> None:
    good = bytearray(encode_record(b"abc"))
    good[4] ^= 0x01
    frame = b"bput test 1 %d 1 -1 65\r\n" % len(good) + bytes(good)
    reply = wire.call(frame)
    assert isinstance(reply, ResultReply) and (reply.code, reply.opaque) == (400, 65)
    assert b"checksum mismatch" in reply.body
    assert_nothing_stored(wire, "test", 1, 66)


# -- get ------------------------------------------------------------------------------------------


def test_get_codes(wire: Wire) -> None:
    data = b"0123456789"
    put_ok(wire, "log-get", data, 70)
    end = HEADER_SIZE + len(data)
    cases = [
        (
            b"get log-get g 0 %d 100 71\r\n" % end,
            result(404, b"Could not find message at position %d" % end, 71),
        ),
        (
            b"get log-get g 0 999 100 72\r\n",
            result(404, b"Could not find message at position 999", 72),
        ),
        (b"get log-get g 0 -5 100 73\r\n", result(301, b"0", 73)),
        (b"get log-get g 0 9223372036854775807 100 74\r\n", result(301, b"%d" % end, 74)),
        (b"get log-get g 0 0 0 75\r\n", result(400, b"Bad request,invalid max size:0", 75)),
        (
            b"get log-get g 1 0 100 76\r\n",
            result(404, b"The topic `log-get` in partition `1` is not exists", 76),
        ),
        (
            b"get nope g 0 0 100 77\r\n",
            result(404, b"The topic `nope` in partition `0` is not exists", 77),
        ),
        (
            b"get closed g 0 0 100 78\r\n",
            result(403, b"The topic `closed` in broker does not accept subscribe", 78),
        ),
    ]
    for request, expected in cases:
        wire.send(request)
        assert wire.read_exact(len(expected)) == expected, request


def test_get_max_size_smaller_than_a_record_returns_a_partial_slice(wire: Wire) -> None:
    put_ok(wire, "log-part", b"x" * 100, 80)
    reply = wire.call(b"get log-part g 0 0 30 81\r\n")
    assert isinstance(reply, ValueReply) and len(reply.data) == 30
    assert list(iter_records(reply.data)) == []  # a partial record only


def test_long_poll_get_wakes_when_data_arrives(broker: BrokerProcess, wire: Wire) -> None:
    wire.send(b"get t-poll g 0 0 4096 20000 90\r\n")
    with Wire(broker.address) as producer:
        put_ok(producer, "t-poll", b"late", 91)
    reply = wire.reply()
    assert isinstance(reply, ValueReply) and reply.opaque == 90
    assert [r.data for r in iter_records(reply.data)] == [b"late"]


def test_long_poll_get_times_out_like_a_normal_get(wire: Wire) -> None:
    wire.send(b"get t-poll g 0 999999 4096 50 92\r\n")
    expected = result(404, b"Could not find message at position 999999", 92)
    assert wire.read_exact(len(expected)) == expected


# -- offset -----------------------------------------------------------------------------------------


def test_offset_command(wire: Wire) -> None:
    put_ok(wire, "log-off", b"abc", 95)
    assert wire.call(b"offset log-off g 0 0 96\r\n") == ResultReply(200, b"0", 96)
    assert wire.call(b"offset log-off g 0 999 97\r\n") == ResultReply(200, b"23", 97)
    assert wire.call(b"offset log-off g 0 -9 98\r\n") == ResultReply(200, b"0", 98)
    wire.send(b"offset log-off g 2 0 99\r\n")
    expected = result(404, b"The topic `log-off` in partition `2` is not exists", 99)
    assert wire.read_exact(len(expected)) == expected


# -- stats -------------------------------------------------------------------------------------------

GENERAL_KEYS = [
    "pid",
    "broker_id",
    "port",
    "uptime",
    "version",
    "slave",
    "curr_connections",
    "threads",
    "cmd_put",
    "cmd_get",
    "cmd_offset",
    "tx_begin",
    "tx_xa_begin",
    "tx_commit",
    "tx_rollback",
    "get_miss",
    "put_failed",
    "put_duplicate",
    "put_conflict",
    "total_messages",
    "topics",
    "config_checksum",
]


def stats_lines(reply: ResultReply) -> list[str]:
    text = reply.body.decode()
    assert text.startswith("STATS\r\n") and text.endswith("END\r\n"), text
    return text.split("\r\n")[1:-2]


def test_bare_stats_has_every_general_item(broker: BrokerProcess, wire: Wire) -> None:
    reply = wire.call(b"stats\r\n")
    assert isinstance(reply, ResultReply) and (reply.code, reply.opaque) == (200, MAX_INT)
    lines = stats_lines(reply)
    assert [line.split(" ", 1)[0] for line in lines] == GENERAL_KEYS
    values = dict(line.split(" ", 1) for line in lines)
    assert values["port"] == str(broker.port)
    assert values["version"] == VERSION
    assert values["slave"] == "false"
    assert int(values["curr_connections"]) >= 1
    text = broker.config_path.read_bytes()
    import zlib

    assert values["config_checksum"] == str(zlib.crc32(text))


def test_stats_with_empty_item_token_is_general(wire: Wire) -> None:
    reply = wire.call(b"stats  5\r\n")
    assert isinstance(reply, ResultReply) and reply.opaque == 5
    assert stats_lines(reply)[0].startswith("pid ")


def test_stats_items(broker: BrokerProcess, wire: Wire) -> None:
    put_ok(wire, "log-stats", b"12345", 110)
    topics = stats_lines(wire.call(b"stats topics 111\r\n"))  # type: ignore[arg-type]
    assert (
        "log-stats partitions 3 message_count 1 message_bytes 25 "
        "accept_publish true accept_subscribe true" in topics
    )
    assert "closed *Empty*" in topics
    offsets = stats_lines(wire.call(b"stats offsets 112\r\n"))  # type: ignore[arg-type]
    assert "log-stats part 0 min_offset 0 max_offset 25" in offsets
    realtime = stats_lines(wire.call(b"stats realtime 113\r\n"))  # type: ignore[arg-type]
    assert [line.split(" ")[0] for line in realtime] == [
        "realtime_put",
        "realtime_get",
        "realtime_offset",
        "realtime_get_miss",
        "realtime_put_failed",
        "realtime_message_size",
    ]
    topic = stats_lines(wire.call(b"stats log-stats 114\r\n"))  # type: ignore[arg-type]
    assert topic[:5] == [
        "log-stats",  # MetaQ: the name alone
        "resultCode 0",
        "partitions 3",
        "message_count 1",
        "bytes 25",
    ]
    unknown = stats_lines(wire.call(b"stats zzz 115\r\n"))  # type: ignore[arg-type]
    assert unknown[1] == "resultCode 1"
    empty = stats_lines(wire.call(b"stats closed 116\r\n"))  # type: ignore[arg-type]
    assert empty[1] == "resultCode 2"
    help_ = stats_lines(wire.call(b"stats help 117\r\n"))  # type: ignore[arg-type]
    assert help_[:6] == [  # MetaQ's StatsManager.appendHelp, then pymetaq's items
        "*EMPTY* Returns broker info.",
        "help Returns help menu.",
        "topics Returns topics statistics detail info.",
        "offsets Returns partitions detail info.",
        "realtime Returns realtime statistics detail info.",
        "config Returns broker's config file content.",
    ]
    assert [line.split(" ", 1)[0] for line in help_[6:]] == [
        "reset",
        "<topic>",
        "lag",
        "transactions",
        "replication",
        "retention",
    ]


def test_stats_config_is_the_raw_file(broker: BrokerProcess, wire: Wire) -> None:
    text = broker.config_path.read_bytes()
    wire.send(b"stats config 120\r\n")
    expected = result(200, text, 120)
    assert wire.read_exact(len(expected)) == expected


def test_stats_reset(wire: Wire) -> None:
    wire.send(b"stats reset 121\r\n")
    expected = result(200, b"STATS\r\nreset ok\r\nEND\r\n", 121)
    assert wire.read_exact(len(expected)) == expected


# -- quit / transaction / sync / errors ---------------------------------------------------------------


def test_quit_closes_without_reply(wire: Wire) -> None:
    wire.send(b"quit\r\n")
    assert wire.read_until_closed() == b""


def test_transaction_begin_and_end_gets_no_reply(wire: Wire) -> None:
    wire.send(b"transaction TX:s1:1 s1 BEGIN 130\r\n")
    expected = result(200, b"", 130)
    assert wire.read_exact(len(expected)) == expected
    wire.send(b"transaction TX:s1:1 s1 END 131\r\nversion 132\r\n")
    assert wire.reply() == ResultReply(200, VERSION.encode(), 132)


def test_sync_is_refused_on_a_master(wire: Wire) -> None:
    wire.send(b"sync test 0 1 0 12345 -1 140\r\nx")
    reply = wire.reply()
    assert isinstance(reply, ResultReply) and (reply.code, reply.opaque) == (500, 140)
    wire.send(b"bsync test 0 21 1 -1 141\r\n" + encode_record(b"x", 0, 12345))  # pymetaq's form
    reply = wire.reply()
    assert isinstance(reply, ResultReply) and (reply.code, reply.opaque) == (500, 141)
    assert reply.body.startswith(b"sync is only accepted by a slave broker")


def test_unknown_command_is_400_then_close(wire: Wire) -> None:
    # MetaQ closes on an undecodable command; pymetaq answers why first (test_framing.py)
    wire.send(b"foo bar 150\r\nversion 151\r\n")
    assert wire.read_until_closed() == result(400, b"unknown command foo", 150)


def test_bad_token_is_400_with_the_opaque(wire: Wire) -> None:
    wire.send(b"get test g zero 0 100 152\r\n")
    expected = result(400, b"invalid partition", 152)
    assert wire.read_exact(len(expected)) == expected
    wire.send(b"put test 0 3 0 x1 153\r\nabc")  # tx-key slot that is no tx key: body consumed
    reply = wire.reply()
    assert isinstance(reply, ResultReply) and (reply.code, reply.opaque) == (400, 153)
    assert wire.call(b"version 154\r\n") == ResultReply(200, VERSION.encode(), 154)


def test_overlong_line_is_400_then_close(wire: Wire) -> None:
    wire.send(b"get " + b"x" * 5000 + b"\r\n")
    got = wire.read_until_closed()
    assert got == result(400, b"command line longer than 4096 bytes", 0)


def test_put_body_over_the_limit_is_400_and_the_connection_stays(wire: Wire) -> None:
    size = 1024 * 1024  # maxTransferSize; a put's data may be at most maxTransferSize - 20
    wire.send(b"put test 0 %d 0 -1 160\r\n" % size + b"\0" * size + b"version 161\r\n")
    reason = b"put body of %d bytes exceeds the limit of %d" % (size, size - 20)
    expected = result(400, reason, 160) + result(200, VERSION.encode(), 161)
    assert wire.read_exact(len(expected)) == expected


def test_pipelined_puts_are_all_answered(wire: Wire) -> None:
    frames = b"".join(put_line("test", 0, b"p%d" % i, 1000 + i) for i in range(200))
    wire.send(frames)
    opaques = set()
    for _ in range(200):
        reply = wire.reply()
        assert isinstance(reply, ResultReply) and reply.code == 200
        opaques.add(reply.opaque)
    assert opaques == set(range(1000, 1200))


def test_echo_stats_nc_style_bare_lf_gets_the_general_stats(broker: BrokerProcess) -> None:
    # `echo "stats" | nc 127.0.0.1 8123`: a bare LF line, no opaque, then EOF
    with socket.create_connection(broker.address, timeout=20) as sock:
        sock.sendall(b"stats\n")
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n")
    assert head.startswith(b"result 200 ") and head.endswith(b" 2147483647")
    assert body.startswith(b"STATS\r\npid ") and body.endswith(b"END\r\n")


def test_half_close_after_pipelined_puts_still_gets_every_reply(broker: BrokerProcess) -> None:
    frames = b"".join(put_line("test", 0, b"h%d" % i, 5000 + i) for i in range(100))
    with socket.create_connection(broker.address, timeout=20) as sock:
        sock.sendall(frames)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert got.count(b"result 200 ") == 100


def test_coalesced_pipelined_puts_each_get_their_own_id_and_offset(wire: Wire) -> None:
    datas = [b"c%d-" % i + b"q" * (i % 17) for i in range(150)]
    wire.send(
        b"".join(put_line("log-coal", i % 2, d, 7000 + i, checksum(d)) for i, d in enumerate(datas))
    )
    acks: dict[int, tuple[int, int, int]] = {}
    for _ in datas:
        reply = wire.reply()
        assert isinstance(reply, ResultReply) and reply.code == 200
        msg_id, part, offset = (int(x) for x in reply.body.split())
        acks[reply.opaque - 7000] = (msg_id, part, offset)
    for partition in (0, 1):
        got = wire.call(b"get log-coal g %d 0 1048576 7999\r\n" % partition)
        assert isinstance(got, ValueReply)
        stored = {(r.offset, r.msg_id): r.data for r in iter_records(got.data)}
        mine = [i for i in range(len(datas)) if i % 2 == partition]
        assert len(stored) == len(mine)
        for i in mine:
            msg_id, part, offset = acks[i]
            assert part == partition and stored[(offset, msg_id)] == datas[i]
        order = sorted(mine, key=lambda i: acks[i][2])
        assert order == mine  # one connection's puts are stored in the order sent


def test_realtime_stats_count_requests_for_stat_topics(wire: Wire) -> None:
    wire.send(b"".join(put_line("t-stat", 0, b"12345", 8000 + i) for i in range(3)))
    for _ in range(3):
        reply = wire.reply()
        assert isinstance(reply, ResultReply) and reply.code == 200
    reply = wire.call(bput_frame("t-stat", 0, [b"a", b"b"], 8003))
    assert isinstance(reply, ResultReply) and reply.code == 200
    lines = stats_lines(wire.call(b"stats t-stat 8004\r\n"))  # type: ignore[arg-type]
    put = next(line for line in lines if line.startswith("topic_realtime_put "))
    assert put.split(" ", 1)[1].startswith("Count=4,Value=5,Value/Count=1.25,")
    # MetaQ's DecimalFormat("#.##"): whole numbers without decimals, "invalid" over zero
    assert "topic_realtime_offset null" in lines  # nothing recorded for the item yet
    size = next(line for line in lines if line.startswith("topic_realtime_message_size "))
    assert size.split(" ", 1)[1].startswith(f"Count=5,Value={3 * 25 + 2 * 21},")
    # a topic without stat=true keeps no realtime stats
    put_ok(wire, "t-legacy", b"x", 8005)
    lines = stats_lines(wire.call(b"stats t-legacy 8006\r\n"))  # type: ignore[arg-type]
    assert "topic_realtime_put Invalid keyTwo:t-legacy" in lines  # MetaQ's text
    assert "topic_realtime_offset null" in lines
