"""Protocol errors: non-fatal ones leave the parser in sync, lost framing is fatal, and misuse of
the encoder is the caller's error, not the peer's.  (Oversized bodies, unknown verbs and bare-LF
lines: ``test_framing_options.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

from pymetaq.client.protocol import (
    NEED_DATA,
    BatchPutCommand,
    CodecError,
    GetCommand,
    HttpStatus,
    InvalidTxKey,
    Limits,
    LocalProtocolError,
    Parser,
    ProtocolError,
    PutCommand,
    PutForm,
    ResultReply,
    Role,
    StatsCommand,
    TransactionCommand,
    TransactionType,
    VersionCommand,
    encode,
    error_reply,
)

NEXT = b"version 77\r\n"

NON_FATAL: list[tuple[Role, bytes, str, int | None]] = [
    (Role.SERVER, b"\r\n", "blank command line", None),
    (Role.SERVER, b"    \r\n", "blank command line", None),
    (Role.SERVER, b"get t g x 0 1024 6\r\n", "invalid partition", 6),
    (Role.SERVER, b"get t g 0 0 1024 nope\r\n", "invalid opaque", None),
    (Role.SERVER, b"get t g 0 0 1024\r\n", "invalid get command: 6 tokens", 1024),
    (Role.SERVER, b"get t g 0 99999999999999999999 1 5\r\n", "invalid offset", 5),
    (Role.SERVER, b"get t g 2147483648 0 1 5\r\n", "partition out of range", 5),
    (Role.SERVER, b"get \xff g 0 0 1 5\r\n", "topic is not UTF-8", 5),
    (Role.SERVER, b"offset t g 0 1\r\n", "invalid offset command: 5 tokens", 1),
    (Role.SERVER, b"stats a b 3 4\r\n", "invalid stats command: 5 tokens", 4),
    (Role.SERVER, b"quit now\r\n", "invalid quit command: 2 tokens", None),
    # a put whose body length is readable: the body is consumed with the bad line
    (Role.SERVER, b"put t x 5 0 -1 7\r\nhello", "invalid partition", 7),
    (Role.SERVER, b"put t 0 5 0 -1 TX:s:1 x 8 9\r\nhello", "invalid put command: 10 tokens", 9),
    (Role.SERVER, b"put t 0 5 0 abc 7\r\nhello", "illegal transaction key", 7),
    (Role.SERVER, b"put t 0 5 0 12x 7\r\nhello", "invalid checksum", 7),
    (Role.SERVER, b"sync t 0 2 0 1\r\nhi", "invalid sync command: 6 tokens", 1),
    (Role.SERVER, b"bput t 0 2 -1 -1 3\r\nhi", "count out of range", 3),
    (
        Role.SERVER,
        b"bput t 0 2 1 -1 x 0 3\r\nhi",
        "invalid producer id (32 lowercase hex digits)",
        3,
    ),
    (
        Role.SERVER,
        b"bput t 0 2 1 -1 " + b"AB" * 16 + b" 0 3\r\nhi",
        "invalid producer id (32 lowercase hex digits)",
        3,
    ),
    (Role.SERVER, b"bput t 0 2 1 -1 " + b"ab" * 16 + b" -1 3\r\nhi", "sequence out of range", 3),
    (
        Role.SERVER,
        b"bput t 0 2 1 -1 " + b"ab" * 16 + b" 0 x 3\r\nhi",
        "invalid bput command: 10 tokens",
        3,
    ),
    (
        Role.SERVER,
        b"bsync t 0 2 1 -1 x 0 3\r\nhi",
        "invalid producer id (32 lowercase hex digits)",
        3,
    ),
    (Role.SERVER, b"bsync t 0 2 1 -1 " + b"ab" * 16 + b" -1 3\r\nhi", "sequence out of range", 3),
    (
        Role.SERVER,
        b"bsync t 0 2 1 -1 7 " + b"ab" * 16 + b" 0 x 3\r\nhi",
        "invalid bsync command: 11 tokens",
        3,
    ),
    (Role.SERVER, b"producers t g 0 10 5 3\r\n", "invalid range: 0 <= after <= upto", 3),
    (Role.SERVER, b"producers t g 0 -1 5 3\r\n", "invalid range: 0 <= after <= upto", 3),
    (Role.SERVER, b"producers t g 0 5 3\r\n", "invalid producers command: 6 tokens", 3),
    (  # 8 tokens: a transactional bput, whose key slot holds no transaction key
        Role.SERVER,
        b"bput t 0 2 1 -1 " + b"ab" * 16 + b" 3\r\nhi",
        "illegal transaction key",
        3,
    ),
    (Role.SERVER, b"transaction TX:s:1 s FOO 9\r\n", "unknown transaction type", 9),
    (Role.SERVER, b"transaction BAD s BEGIN 9\r\n", "illegal transaction key", 9),
    (Role.SERVER, b"transaction TX:s:1 s BEGIN\r\n", "invalid transaction command: 4 tokens", None),
    (Role.CLIENT, b"result abc 0 1\r\n", "invalid code", 1),
    (Role.CLIENT, b"result 200 3 1 2\r\nabc", "invalid result command: 5 tokens", 2),
    (Role.CLIENT, b"value 3\r\nabc", "invalid value command: 2 tokens", 3),
]


@pytest.mark.parametrize(("role", "bad", "reason", "opaque"), NON_FATAL)
def test_non_fatal_error_consumes_the_frame_and_stays_in_sync(
    role: Role, bad: bytes, reason: str, opaque: int | None
) -> None:
    good = NEXT if role is Role.SERVER else b"result 200 2 77\r\nok"
    expected = VersionCommand(77) if role is Role.SERVER else ResultReply(200, b"ok", 77)
    for chunks in ([bad + good], [bytes([b]) for b in bad + good]):
        parser = Parser(role)
        errors: list[ProtocolError] = []
        events = []
        for chunk in chunks:
            parser.feed(chunk)
            while True:
                try:
                    event = parser.next_event()
                except ProtocolError as exc:
                    errors.append(exc)
                    continue
                if event is NEED_DATA:
                    break
                events.append(event)
        assert [(e.reason, e.fatal, e.opaque) for e in errors] == [(reason, False, opaque)]
        assert events == [expected]
        assert parser.pending_bytes == 0


def test_error_reply_is_the_400_the_server_sends() -> None:
    reply = error_reply("unknown command bogus", 5)
    assert encode(reply) == b"result 400 21 5\r\nunknown command bogus"
    assert error_reply("blank command line", None) == ResultReply(
        HttpStatus.BAD_REQUEST, b"blank command line", 0
    )


FATAL: list[tuple[Role, Limits, bytes, str]] = [
    (Role.SERVER, Limits(max_line=16), b"x" * 18, "command line longer than 16 bytes"),
    (Role.SERVER, Limits(max_line=16), b"version 123456789\r\n", "command line longer"),
    (Role.SERVER, Limits(), b"put t 0 x 0 1\r\n", "missing or invalid body length"),
    (Role.SERVER, Limits(), b"put t 0 -5 0 1\r\n", "missing or invalid body length"),
    (Role.SERVER, Limits(), b"put t\r\n", "missing or invalid body length"),
    (Role.SERVER, Limits(), b"put t 0 99999999999 0 1\r\n", "missing or invalid body length"),
    (Role.SERVER, Limits(), b"put t 0 2147483648 0 1\r\n", "missing or invalid body length"),
    (Role.CLIENT, Limits(), b"result 200\r\n", "missing or invalid body length"),
    (Role.SERVER, Limits(), b"bogus 5\r\n", "unknown command bogus"),
    (Role.CLIENT, Limits(), b"version 5\r\n", "unknown command version"),
]


@pytest.mark.parametrize(("role", "limits", "bad", "reason"), FATAL)
def test_lost_framing_and_limits_are_fatal(
    role: Role, limits: Limits, bad: bytes, reason: str
) -> None:
    parser = Parser(role, limits)
    parser.feed(bad)  # the body never needs to arrive: the line alone decides
    with pytest.raises(ProtocolError, match=reason) as info:
        parser.next_event()
    assert info.value.fatal
    parser.feed(NEXT)
    with pytest.raises(ProtocolError) as again:  # broken for good: the server closes
        parser.next_event()
    assert again.value is info.value
    assert parser.broken is info.value


def test_a_line_of_exactly_max_line_bytes_parses() -> None:
    line = b"version 1234567"  # 15 bytes
    parser = Parser(Role.SERVER, Limits(max_line=15))
    for byte in line + b"\r":
        parser.feed(bytes([byte]))
        assert parser.next_event() is NEED_DATA
    parser.feed(b"\n")
    assert parser.next_event() == VersionCommand(1234567)
    parser = Parser(Role.SERVER, Limits(max_line=14))
    parser.feed(line + b"\r\n")
    with pytest.raises(ProtocolError, match="longer than 14"):
        parser.next_event()


def test_a_body_of_exactly_the_limit_parses() -> None:
    parser = Parser(Role.SERVER, Limits(max_body=5, max_batch_body=5))
    parser.feed(b"put t 0 5 0 -1 1\r\nhellobput t 0 5 0 -1 2\r\nhello")
    assert parser.next_event() == PutCommand("t", 0, b"hello", 0, None, None, 1)
    assert parser.next_event() == BatchPutCommand("t", 0, bytearray(b"hello"), 0, None, 2)


def test_limits_for_a_broker_transfer_size() -> None:
    limits = Limits.for_transfer_size(512 << 10)
    assert limits.max_body == (512 << 10) + 4096
    assert Limits().max_body == (1 << 20) + 4096 and Limits().max_line == 4096
    assert Limits().max_batch_body == 16 << 20


@pytest.mark.parametrize("kwargs", [{"max_line": 0}, {"max_body": -1}, {"max_batch_body": -1}])
def test_nonsense_limits_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="invalid limits"):
        Limits(**kwargs)


def test_protocol_error_pickles() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(ProtocolError("bad", True, 7)))
    assert (err.reason, err.fatal, err.opaque, str(err)) == ("bad", True, 7, "bad")


def test_errors_are_not_retriable_and_share_a_base() -> None:
    assert issubclass(ProtocolError, CodecError) and issubclass(LocalProtocolError, CodecError)
    assert not ProtocolError("x", fatal=True).retriable
    assert issubclass(LocalProtocolError, ValueError)
    assert not issubclass(ProtocolError, ValueError)  # peer garbage is not a caller bug


MISUSE: list[tuple[Any, type[Exception]]] = [
    (PutCommand("a b", 0, b""), LocalProtocolError),
    (PutCommand("", 0, b""), LocalProtocolError),
    (PutCommand("t\r\n", 0, b""), LocalProtocolError),
    (PutCommand("t", 1 << 31, b""), LocalProtocolError),
    (PutCommand("t", True, b""), LocalProtocolError),
    (PutCommand("t", 0, "text"), LocalProtocolError),  # type: ignore[arg-type]
    (PutCommand("t", 0, b"", checksum=5, form=PutForm.LEGACY), LocalProtocolError),
    (PutCommand("t", 0, b"", tx_key="123"), InvalidTxKey),
    (PutCommand("t", 0, b"", tx_key="TX:a"), InvalidTxKey),
    (PutCommand("\ud800", 0, b""), LocalProtocolError),
    (GetCommand("t", "g", 0, 1 << 63, 1), LocalProtocolError),
    (StatsCommand("a b", 1), LocalProtocolError),
    (TransactionCommand("TX:s:1", "s", TransactionType.BEGIN, None, "123", 1), LocalProtocolError),
    (TransactionCommand("TX:s:1", "s", TransactionType.END, -1, None, 1), LocalProtocolError),
    (TransactionCommand("TX:s:1", "s", "BEGIN", None, None, 1), LocalProtocolError),  # type: ignore[arg-type]
    (ResultReply(200, b"", 1 << 40), LocalProtocolError),
    (object(), TypeError),
]


@pytest.mark.parametrize(("obj", "error"), MISUSE, ids=[repr(m[0])[:40] for m in MISUSE])
def test_encoding_an_invalid_object_is_a_local_error(obj: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        encode(obj)
