"""Framing decisions of the line reader, each tested three ways (whole buffer, one byte at a
time, trailing bytes left untouched):

- a body over its limit whose length token is readable is *discarded* (never buffered) and
  reported as a non-fatal error carrying the frame's opaque, once the whole body has passed;
- a length over int32 (MetaQ's type) is lost framing: fatal;
- an unknown verb is fatal (a body may follow that the parser cannot size), with the opaque;
- ``Parser(..., bare_lf=True)`` also ends lines at a bare LF (``echo stats | nc``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pymetaq.client.protocol import (
    MAX_OPAQUE,
    NEED_DATA,
    BatchPutCommand,
    Event,
    Limits,
    Parser,
    ProtocolError,
    PutCommand,
    PutForm,
    ResultReply,
    Role,
    StatsCommand,
    ValueReply,
    VersionCommand,
)

Outcome = list[Event | tuple[str, bool, int | None]]
TRAILING = b"version 9"  # a partial frame: must stay buffered, untouched


def _drain(parser: Parser, out: Outcome) -> None:
    for _ in range(10_000):
        try:
            event = parser.next_event()
        except ProtocolError as exc:
            out.append((exc.reason, exc.fatal, exc.opaque))
            if exc.fatal:
                return
            continue
        if event is NEED_DATA:
            return
        out.append(event)
    raise AssertionError("no progress")


def whole(make: Callable[[], Parser], wire: bytes) -> tuple[Outcome, Parser]:
    parser, out = make(), []
    parser.feed(wire)
    _drain(parser, out)
    return out, parser


def byte_at_a_time(make: Callable[[], Parser], wire: bytes) -> tuple[Outcome, Parser]:
    parser, out = make(), []
    for i in range(len(wire)):
        parser.feed(wire[i : i + 1])
        _drain(parser, out)
        if out and isinstance(out[-1], tuple) and out[-1][1]:
            break
    return out, parser


WAYS = [whole, byte_at_a_time]


# --------------------------------------------------------------------------- oversized bodies

SMALL = Limits(max_line=64, max_body=4, max_batch_body=8)
DISCARDED: list[tuple[Role, bytes, str, int]] = [
    (
        Role.SERVER,
        b"put t 0 10 0 -1 5\r\n0123456789",
        "put body of 10 bytes exceeds the limit of 4",
        5,
    ),
    (Role.SERVER, b"put t 0 5 0 6\r\nhello", "put body of 5 bytes exceeds the limit of 4", 6),
    (
        Role.SERVER,
        b"sync t 0 5 0 1 -1 7\r\nhello",
        "sync body of 5 bytes exceeds the limit of 4",
        7,
    ),
    (
        Role.SERVER,
        b"bput t 0 9 1 -1 8\r\n123456789",
        "bput body of 9 bytes exceeds the limit of 8",
        8,
    ),
    (Role.CLIENT, b"value 5 9\r\nhello", "value body of 5 bytes exceeds the limit of 4", 9),
    (
        Role.CLIENT,
        b"result 500 6 10\r\nfailed",
        "result body of 6 bytes exceeds the limit of 4",
        10,
    ),
    # a body holding CRLFs and verbs is skipped by length, never parsed
    (
        Role.SERVER,
        b"put t 0 13 0 -1 11\r\nquit\r\nstats\r\n",
        "put body of 13 bytes exceeds the limit of 4",
        11,
    ),
]


def _next_frame(role: Role) -> tuple[bytes, Event]:
    if role is Role.SERVER:
        return b"version 77\r\n", VersionCommand(77)
    return b"result 200 2 77\r\nok", ResultReply(200, b"ok", 77)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(("role", "wire", "reason", "opaque"), DISCARDED)
def test_an_oversized_body_is_discarded_and_the_stream_stays_in_sync(
    way: Callable[..., tuple[Outcome, Parser]], role: Role, wire: bytes, reason: str, opaque: int
) -> None:
    good, event = _next_frame(role)
    out, parser = way(lambda: Parser(role, SMALL), wire + good)
    assert out == [(reason, False, opaque), event]
    assert parser.pending_bytes == 0 and parser.broken is None


@pytest.mark.parametrize(("role", "wire", "reason", "opaque"), DISCARDED)
def test_trailing_bytes_after_a_discarded_body_stay_buffered(
    role: Role, wire: bytes, reason: str, opaque: int
) -> None:
    out, parser = whole(lambda: Parser(role, SMALL), wire + TRAILING)
    assert out == [(reason, False, opaque)]
    assert parser.trailing_data == TRAILING


def test_the_error_comes_only_after_the_whole_body_has_passed() -> None:
    parser = Parser(Role.SERVER, SMALL)
    parser.feed(b"put t 0 10 0 -1 5\r\n01234")
    assert parser.next_event() is NEED_DATA
    parser.feed(b"5678")
    assert parser.next_event() is NEED_DATA
    parser.feed(b"9version 1\r\n")
    with pytest.raises(ProtocolError, match="put body of 10 bytes") as info:
        parser.next_event()
    assert not info.value.fatal and info.value.opaque == 5
    assert parser.next_event() == VersionCommand(1)


def test_a_discarded_body_is_never_buffered() -> None:
    parser = Parser(Role.SERVER, Limits(max_body=1024))
    size = 64 << 20
    parser.feed(b"put t 0 %d 0 -1 3\r\n" % size)
    assert parser.next_event() is NEED_DATA  # the line is read: from now on bytes are dropped
    chunk = b"\0" * (1 << 20)
    for _ in range(size // len(chunk) - 1):
        parser.feed(chunk)
        assert parser.pending_bytes == 0
        assert parser.next_event() is NEED_DATA
    parser.feed(chunk + b"version 4\r\n")
    with pytest.raises(ProtocolError, match="exceeds the limit of 1024"):
        parser.next_event()
    assert parser.next_event() == VersionCommand(4)


def test_a_body_within_the_limit_is_still_parsed() -> None:
    parser = Parser(Role.SERVER, SMALL)
    parser.feed(b"put t 0 4 0 1\r\nabcdbput t 0 8 0 -1 2\r\n")
    assert parser.next_event() == PutCommand("t", 0, b"abcd", 0, None, None, 1, PutForm.LEGACY)
    parser.feed(b"\0" * 8)
    event = parser.next_event()
    assert isinstance(event, BatchPutCommand) and len(event.body) == 8


@pytest.mark.parametrize(
    "line",
    [b"put t 0 2147483648 0 -1 5\r\n", b"put t 0 4294967295 0 5\r\n", b"value 9999999999 1\r\n"],
)
def test_a_length_over_int32_is_lost_framing(line: bytes) -> None:
    role = Role.CLIENT if line.startswith(b"value") else Role.SERVER
    parser = Parser(role, SMALL)
    parser.feed(line)
    with pytest.raises(ProtocolError, match="missing or invalid body length") as info:
        parser.next_event()
    assert info.value.fatal


# --------------------------------------------------------------------------- unknown verbs

UNKNOWN: list[tuple[Role, bytes, str, int | None]] = [
    (Role.SERVER, b"bogus 5\r\n", "unknown command bogus", 5),
    (Role.SERVER, b"gets t g 0 0 1 6\r\n", "unknown command gets", 6),
    (Role.SERVER, b"Put t 0 0 0 1\r\n", "unknown command Put", 1),
    (Role.SERVER, b"GET / HTTP/1.1\r\n", "unknown command GET", None),
    (Role.SERVER, b"result 200 0 1\r\n", "unknown command result", 1),
    (Role.CLIENT, b"version 2\r\n", "unknown command version", 2),
    (Role.SERVER, b"xput t 0 5 0 -1 7\r\nput t 0 1 0 -1 8\r\nx", "unknown command xput", 7),
]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(("role", "wire", "reason", "opaque"), UNKNOWN)
def test_an_unknown_verb_is_fatal_and_carries_the_opaque(
    way: Callable[..., tuple[Outcome, Parser]],
    role: Role,
    wire: bytes,
    reason: str,
    opaque: int | None,
) -> None:
    # whatever follows (here: a frame that would parse) is never looked at: an unknown verb
    # may carry a body the parser cannot size, and its bytes must not be run as commands
    good, _event = _next_frame(role)
    out, parser = way(lambda: Parser(role), wire + good)
    assert out == [(reason, True, opaque)]
    assert parser.broken is not None and parser.broken.reason == reason


def test_a_blank_line_stays_non_fatal() -> None:
    out, _ = whole(lambda: Parser(Role.SERVER), b"\r\n  \r\nversion 3\r\n")
    assert out == [("blank command line", False, None)] * 2 + [VersionCommand(3)]


# --------------------------------------------------------------------------- bare LF

BARE_LF: list[tuple[bytes, list[Event]]] = [
    (b"stats\n", [StatsCommand("", MAX_OPAQUE)]),
    (b"version 5\nstats topics 6\n", [VersionCommand(5), StatsCommand("topics", 6)]),
    (b"version 5\r\nversion 6\n", [VersionCommand(5), VersionCommand(6)]),
    (b"put t 0 5 0 -1 7\nhello", [PutCommand("t", 0, b"hello", 0, None, None, 7)]),
    # a body containing LF is taken by length, not split
    (
        b"put t 0 3 0 -1 8\na\nbversion 9\n",
        [PutCommand("t", 0, b"a\nb", 0, None, None, 8), VersionCommand(9)],
    ),
]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(("wire", "events"), BARE_LF)
def test_bare_lf_ends_a_line_when_enabled(
    way: Callable[..., tuple[Outcome, Parser]], wire: bytes, events: list[Event]
) -> None:
    out, parser = way(lambda: Parser(Role.SERVER, bare_lf=True), wire)
    assert out == events
    assert parser.pending_bytes == 0


@pytest.mark.parametrize(("wire", "events"), BARE_LF)
def test_bare_lf_trailing_bytes_stay_buffered(wire: bytes, events: list[Event]) -> None:
    out, parser = whole(lambda: Parser(Role.SERVER, bare_lf=True), wire + TRAILING)
    assert out == events
    assert parser.trailing_data == TRAILING


def test_bare_lf_is_off_by_default() -> None:
    parser = Parser(Role.SERVER)
    parser.feed(b"stats\n")
    assert parser.next_event() is NEED_DATA  # waits for a CRLF
    parser.feed(b"\r\n")
    with pytest.raises(ProtocolError, match="unknown command stats"):
        parser.next_event()  # the LF is part of the line: "stats\n" is no verb


def test_bare_lf_honours_max_line() -> None:
    limits = Limits(max_line=16)
    parser = Parser(Role.SERVER, limits, bare_lf=True)
    parser.feed(b"version 1234567\n")  # 15 bytes + LF
    assert parser.next_event() == VersionCommand(1234567)
    parser.feed(b"version 1234567890\n")  # 18 bytes
    with pytest.raises(ProtocolError, match="longer than 16 bytes") as info:
        parser.next_event()
    assert info.value.fatal


def test_bare_lf_with_a_client_parser() -> None:
    parser = Parser(Role.CLIENT, bare_lf=True)
    parser.feed(b"result 200 2 1\nok")
    assert parser.next_event() == ResultReply(200, b"ok", 1)
    parser.feed(b"value 1 2\r\nx")
    assert parser.next_event() == ValueReply(b"x", 2)
