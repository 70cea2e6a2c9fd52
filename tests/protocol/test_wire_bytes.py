"""Exact bytes of MetaQ's exchanges, each parsed three ways (h11 style) and encoded back."""

from __future__ import annotations

import zlib

import pytest

from pymetaq.client.protocol import (
    MAX_OPAQUE,
    NEED_DATA,
    BatchPutCommand,
    BatchSyncCommand,
    Event,
    GetCommand,
    HttpStatus,
    LocalProtocolError,
    OffsetCommand,
    Parser,
    ProducersCommand,
    ProtocolError,
    PutCommand,
    PutForm,
    QuitCommand,
    ResultReply,
    Role,
    StatsCommand,
    SyncCommand,
    TransactionCommand,
    TransactionType,
    TxAdminCommand,
    TxAdminOp,
    ValueReply,
    VersionCommand,
    encode,
    encode_parts,
    encode_result_header,
    encode_value_header,
)
from pymetaq.storage.record import encode_record

CRC_HELLO = zlib.crc32(b"hello") & 0x7FFFFFFF
assert CRC_HELLO == 907060870
SESSION = "192.168.1.10-1386000000000-1"
XID = "XID:1:0a0b:0c:XAMessageProducer-host1"
RECORDS = bytearray(encode_record(b"a") + encode_record(b"bc", 1))
RECORDS_CRC = zlib.crc32(RECORDS) & 0x7FFFFFFF
STATS_BODY = b"STATS\r\npid 42\r\nbroker_id 0\r\nEND\r\n"

# (wire bytes, the event, whether encode(event) gives back exactly these bytes)
SERVER_CASES: list[tuple[bytes, Event, bool]] = [
    # Java client >= 1.4.4: 7 tokens with checksum
    (
        b"put t 0 5 0 907060870 1\r\nhello",
        PutCommand("t", 0, b"hello", 0, CRC_HELLO, None, 1),
        True,
    ),
    # the Python client (pre-1.4.4 form): 6 tokens, no checksum
    (
        b"put t 0 5 0 1\r\nhello",
        PutCommand("t", 0, b"hello", 0, None, None, 1, PutForm.LEGACY),
        True,
    ),
    # Java client >= 1.4.4 inside a transaction: 8 tokens
    (
        f"put t 0 5 0 907060870 TX:{SESSION}:1 3\r\nhello".encode(),
        PutCommand("t", 0, b"hello", 0, CRC_HELLO, f"TX:{SESSION}:1", 3),
        True,
    ),
    # a pre-1.4.4 client inside a transaction: 7 tokens, slot 6 is the key
    (
        f"put t 0 5 0 {XID} 4\r\nhello".encode(),
        PutCommand("t", 0, b"hello", 0, None, XID, 4, PutForm.LEGACY),
        True,
    ),
    # checksum not supplied, random partition, attribute flag
    (b"put t -1 5 1 -1 5\r\nhello", PutCommand("t", -1, b"hello", 1, None, None, 5), True),
    (b"put t 0 0 0 0 6\r\n", PutCommand("t", 0, b"", 0, 0, None, 6), True),
    (b"get t g 0 0 1024 2\r\n", GetCommand("t", "g", 0, 0, 1024, 2), True),
    (
        b"get t g 1 4096 1048576 30000 7\r\n",
        GetCommand("t", "g", 1, 4096, 1048576, 7, max_wait_ms=30000),
        True,
    ),
    (b"get t g 0 9223372036854775807 1 8\r\n", GetCommand("t", "g", 0, (1 << 63) - 1, 1, 8), True),
    (b"offset t g 0 100 3\r\n", OffsetCommand("t", "g", 0, 100, 3), True),
    (b"stats  7\r\n", StatsCommand("", 7), True),  # Java client, no item: an empty token
    (b"stats\r\n", StatsCommand("", MAX_OPAQUE), False),  # bare: opaque Integer.MAX_VALUE
    (b"stats topics 8\r\n", StatsCommand("topics", 8), True),
    (b"stats config\r\n", StatsCommand("config", MAX_OPAQUE), False),
    (b"version 9\r\n", VersionCommand(9), True),  # also the heartbeat
    (b"version\r\n", VersionCommand(MAX_OPAQUE), False),
    (b"quit\r\n", QuitCommand(), True),
    (
        f"transaction TX:{SESSION}:1 {SESSION} BEGIN 10\r\n".encode(),
        TransactionCommand(f"TX:{SESSION}:1", SESSION, TransactionType.BEGIN, opaque=10),
        True,
    ),
    (
        f"transaction TX:{SESSION}:1 {SESSION} BEGIN 30 11\r\n".encode(),
        TransactionCommand(f"TX:{SESSION}:1", SESSION, TransactionType.BEGIN, 30, None, 11),
        True,
    ),
    (
        f"transaction {XID} {SESSION} PREPARE XAMessageProducer-host1 12\r\n".encode(),
        TransactionCommand(
            XID, SESSION, TransactionType.PREPARE, None, "XAMessageProducer-host1", 12
        ),
        True,
    ),
    (
        f"transaction {XID} {SESSION} BEGIN 60 XAMessageProducer-host1 13\r\n".encode(),
        TransactionCommand(XID, SESSION, TransactionType.BEGIN, 60, "XAMessageProducer-host1", 13),
        True,
    ),
    (  # pymetaq extension: an operator's heuristic decision
        f"txadmin commit {XID} 17\r\n".encode(),
        TxAdminCommand(TxAdminOp.COMMIT, XID, 17),
        True,
    ),
    (
        b"sync t 0 5 0 123456789 907060870 14\r\nhello",
        SyncCommand("t", 0, b"hello", 0, 123456789, CRC_HELLO, 14),
        True,
    ),
    # a pre-1.4.4 master: no checksum token
    (
        b"sync t 0 5 0 123456789 15\r\nhello",
        SyncCommand("t", 0, b"hello", 0, 123456789, None, 15),
        False,
    ),
    (
        b"bput t 2 %d 2 %d 16\r\n" % (len(RECORDS), RECORDS_CRC) + RECORDS,
        BatchPutCommand("t", 2, RECORDS, 2, RECORDS_CRC, 16),
        True,
    ),
    (  # pymetaq extension: a samsa master's stored batch to a pymetaq slave
        b"bsync t 2 %d 2 %d 18\r\n" % (len(RECORDS), RECORDS_CRC) + RECORDS,
        BatchSyncCommand("t", 2, RECORDS, 2, RECORDS_CRC, 18),
        True,
    ),
    (
        b"bsync t 0 %d 2 -1 19\r\n" % len(RECORDS) + RECORDS,
        BatchSyncCommand("t", 0, RECORDS, 2, None, 19),
        True,
    ),
    (  # the offset form: stored only where the slave's log ends (a rejoined replica)
        b"bsync t 1 %d 2 -1 1048576 20\r\n" % len(RECORDS) + RECORDS,
        BatchSyncCommand("t", 1, RECORDS, 2, None, 20, 1048576),
        True,
    ),
    (  # an idempotent bput's batch: its producer id and sequence before the opaque
        b"bsync t 1 %d 2 -1 %s 7 21\r\n" % (len(RECORDS), b"ab" * 16) + RECORDS,
        BatchSyncCommand("t", 1, RECORDS, 2, None, 21, None, "ab" * 16, 7),
        True,
    ),
    (  # both: the aligned offset, then the producer id and sequence
        b"bsync t 1 %d 2 -1 1048576 %s 0 22\r\n" % (len(RECORDS), b"cd" * 16) + RECORDS,
        BatchSyncCommand("t", 1, RECORDS, 2, None, 22, 1048576, "cd" * 16, 0),
        True,
    ),
    (  # an async slave asks its master for the producers' entries of a copied range
        b"producers t meta-slave-group_1 0 0 4096 23\r\n",
        ProducersCommand("t", "meta-slave-group_1", 0, 0, 4096, 23),
        True,
    ),
    (  # the idempotent form: producer id and sequence before the opaque
        b"bput t 2 %d 2 -1 %s 7 17\r\n" % (len(RECORDS), b"ab" * 16) + RECORDS,
        BatchPutCommand("t", 2, RECORDS, 2, None, 17, "ab" * 16, 7),
        True,
    ),
    (  # the transactional form: the transaction's key before the opaque
        b"bput t 1 %d 2 %d TX:s-1-1:3 20\r\n" % (len(RECORDS), RECORDS_CRC) + RECORDS,
        BatchPutCommand("t", 1, RECORDS, 2, RECORDS_CRC, 20, tx_key="TX:s-1-1:3"),
        True,
    ),
    (  # "null": no transaction (as a put's key), a plain bput
        b"bput t 1 %d 2 -1 null 21\r\n" % len(RECORDS) + RECORDS,
        BatchPutCommand("t", 1, RECORDS, 2, None, 21),
        False,
    ),
]
CLIENT_CASES: list[tuple[bytes, Event, bool]] = [
    # put reply: "<msgId> <partition> <offset>"
    (b"result 200 17 1\r\n1234567890123 0 0", ResultReply(200, b"1234567890123 0 0", 1), True),
    (b"result 404 0 2\r\n", ResultReply(404, b"", 2), True),
    (b"result 301 4 3\r\n4096", ResultReply(301, b"4096", 3), True),
    (b"result 200 %d 4\r\n" % len(STATS_BODY) + STATS_BODY, ResultReply(200, STATS_BODY, 4), True),
    (b"value 25 5\r\n" + encode_record(b"hello"), ValueReply(encode_record(b"hello"), 5), True),
]
CASES = [(Role.SERVER, *c) for c in SERVER_CASES] + [(Role.CLIENT, *c) for c in CLIENT_CASES]
IDS = [c[1][:24].decode("utf-8", "replace") for c in CASES]


@pytest.mark.parametrize(("role", "wire", "event", "exact"), CASES, ids=IDS)
def test_whole_buffer(role: Role, wire: bytes, event: Event, exact: bool) -> None:
    parser = Parser(role)
    parser.feed(wire)
    assert parser.next_event() == event
    assert parser.next_event() is NEED_DATA
    assert parser.pending_bytes == 0


@pytest.mark.parametrize(("role", "wire", "event", "exact"), CASES, ids=IDS)
def test_one_byte_at_a_time(role: Role, wire: bytes, event: Event, exact: bool) -> None:
    parser = Parser(role)
    for i in range(len(wire) - 1):
        parser.feed(memoryview(wire)[i : i + 1])
        assert parser.next_event() is NEED_DATA, f"event before byte {i + 1} of {len(wire)}"
    parser.feed(wire[-1:])
    assert parser.next_event() == event
    assert parser.next_event() is NEED_DATA


@pytest.mark.parametrize(("role", "wire", "event", "exact"), CASES, ids=IDS)
def test_trailing_bytes_stay_buffered(role: Role, wire: bytes, event: Event, exact: bool) -> None:
    following = wire + wire[: len(wire) // 2]  # one more whole frame and half of another
    parser = Parser(role)
    parser.feed(wire + following)
    assert parser.next_event() == event
    assert parser.trailing_data == following
    assert parser.pending_bytes == len(following)
    assert parser.next_event() == event
    assert parser.next_event() is NEED_DATA
    assert parser.trailing_data == wire[: len(wire) // 2]


@pytest.mark.parametrize(("role", "wire", "event", "exact"), CASES, ids=IDS)
def test_encode_gives_the_wire_bytes(role: Role, wire: bytes, event: Event, exact: bool) -> None:
    encoded = encode(event)
    if exact:
        assert encoded == wire
    parser = Parser(role)
    parser.feed(encoded)
    assert parser.next_event() == event


def test_bare_forms_encode_as_the_java_client_does() -> None:
    assert encode(StatsCommand()) == b"stats  2147483647\r\n"
    assert encode(StatsCommand("", 7)) == b"stats  7\r\n"
    assert encode(VersionCommand()) == b"version 2147483647\r\n"
    assert encode(SyncCommand("t", 0, b"hi", 0, 1, None, 2)) == b"sync t 0 2 0 1 -1 2\r\nhi"


def test_headers_for_sendfile() -> None:
    assert encode_value_header(1048576, 7) == b"value 1048576 7\r\n"
    assert encode_result_header(HttpStatus.MOVED, 4, 8) == b"result 301 4 8\r\n"
    assert encode_result_header(HttpStatus.NOT_FOUND, 0, -3) == b"result 404 0 -3\r\n"
    line, body = encode_parts(ValueReply(b"abc", 9))
    assert (line, body) == (b"value 3 9\r\n", b"abc")


def test_codes_are_metaqs() -> None:
    assert [int(c) for c in HttpStatus] == [200, 301, 400, 401, 403, 404, 500, 503, 504]


def test_batch_body_is_a_fresh_bytearray() -> None:
    body = bytearray(encode_record(b"x" * 100)) * 10_000  # ~1.2 MB
    wire = encode(BatchPutCommand("t", 0, body, 10_000, None, 1))
    parser = Parser(Role.SERVER)
    parser.feed(wire)
    event = parser.next_event()
    assert isinstance(event, BatchPutCommand)
    assert type(event.body) is bytearray and event.body == body
    event.body[8:16] = b"\x00" * 7 + b"\x01"  # the broker stamps ids in place
    assert parser.pending_bytes == 0


def test_many_small_frames_in_one_feed() -> None:
    frames = [encode(GetCommand("t", "g", 0, i * 100, 1024, i)) for i in range(20_000)]
    parser = Parser(Role.SERVER)
    parser.feed(b"".join(frames))
    events = list(parser.events())
    assert [e.opaque for e in events if isinstance(e, GetCommand)] == list(range(20_000))
    assert parser.pending_bytes == 0


def test_a_body_containing_crlf_and_verbs_is_not_split() -> None:
    payload = b"put t 0 1 0 1\r\nx\r\nquit\r\n"
    wire = encode(PutCommand("t", 0, payload, 0, None, None, 1)) + b"quit\r\n"
    parser = Parser(Role.SERVER)
    parser.feed(wire)
    assert parser.next_event() == PutCommand("t", 0, payload, 0, None, None, 1)
    assert parser.next_event() == QuitCommand()
    assert parser.next_event() is NEED_DATA


@pytest.mark.parametrize(
    "line",
    [b"gets t g 0 0 1 1", b"pu t 0 1 0 1", b"vers 1", b"sta 1", b"Put t 0 0 0 1", b"syncx 1"],
)
def test_dispatch_is_on_the_whole_verb(line: bytes) -> None:
    parser = Parser(Role.SERVER)
    parser.feed(line + b"\r\nversion 3\r\n")
    with pytest.raises(ProtocolError, match="unknown command") as info:
        parser.next_event()
    assert info.value.fatal  # an unknown verb may carry a body: framing is lost
    assert info.value.opaque == 1


def test_replies_are_unknown_to_a_server_and_requests_to_a_client() -> None:
    server, client = Parser(Role.SERVER), Parser(Role.CLIENT)
    server.feed(b"result 200 0 1\r\nversion 2\r\n")
    client.feed(b"version 2\r\nresult 200 0 1\r\n")
    for parser in (server, client):
        with pytest.raises(ProtocolError, match="unknown command") as info:
            parser.next_event()
        assert info.value.fatal


def test_trailing_spaces_are_dropped_as_java_split_does() -> None:
    parser = Parser(Role.SERVER)
    parser.feed(b"put t 0 5 0 1 \r\nhellostats  \r\nget t g 0 0 1024 2  \r\n")
    assert parser.next_event() == PutCommand("t", 0, b"hello", 0, None, None, 1, PutForm.LEGACY)
    assert parser.next_event() == StatsCommand("", MAX_OPAQUE)
    assert parser.next_event() == GetCommand("t", "g", 0, 0, 1024, 2)


def test_a_transactional_bput_is_not_idempotent() -> None:
    cmd = BatchPutCommand("t", 0, RECORDS, 2, None, 1, "ab" * 16, 0, "TX:s-1-1:3")
    with pytest.raises(LocalProtocolError, match="not idempotent"):
        encode(cmd)


@pytest.mark.parametrize(
    ("producer_id", "sequence", "why"),
    [
        ("ab" * 16, None, "go together"),
        (None, 3, "go together"),
        ("AB" * 16, 0, "32 lowercase hex"),
        ("ab" * 15, 0, "32 lowercase hex"),
        ("ab" * 16, -1, "negative"),
    ],
)
def test_idempotent_bput_fields_are_checked_before_encoding(
    producer_id: str | None, sequence: int | None, why: str
) -> None:
    cmd = BatchPutCommand("t", 0, RECORDS, 2, None, 1, producer_id, sequence)
    with pytest.raises(LocalProtocolError, match=why):
        encode(cmd)
