"""The codec's fast paths against the general code they shortcut: the same bytes for every
command they take, and for anything else the general code's answer (its error, word for word).

* ``encoder._bput``: a producer's ``bput`` line without re-validating a topic and producer id
  it has seen (hypothesis, seeded, with hostile field values of every kind).
* ``Parser._plain_result`` and ``Parser._plain_bput``: a client's ``result`` reply and a
  broker's ``bput`` of plain digits (the same events and errors as the general path for any
  bytes, in any chunking).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from pymetaq.client.protocol import (
    BatchPutCommand,
    Limits,
    LocalProtocolError,
    Parser,
    ProtocolError,
    Role,
)
from pymetaq.client.protocol import encoder as enc
from tests.protocol._strategies import drain, split

EDGE_INTS = st.sampled_from([-(2**31) - 1, -(2**31), -1, 0, 1, 2**31 - 1, 2**31, 2**63])
ODD = st.sampled_from([True, False, 1.0, "1", None, b"1", [1]])
NUMBER = st.one_of(EDGE_INTS, ODD)  # valid ints come from VALID
TOPIC = st.one_of(
    st.sampled_from(["test", "orders-1", "t\u00e9st", "a b", "", "x\r", "\ud800", b"test", None]),
    st.text(min_size=1, max_size=8),
)
PRODUCER = st.one_of(
    st.sampled_from(["0123456789abcdef0123456789abcdef", "A" * 32, "a" * 31, "", b"a" * 32]),
    st.none(),
)
BODY = st.one_of(
    st.binary(max_size=40), st.binary(max_size=40).map(bytearray), st.sampled_from(["text"])
)


def _outcome(fn: Any, cmd: BatchPutCommand, opaque: Any) -> Any:
    try:
        line, body = fn(cmd, opaque)
    except LocalProtocolError as exc:
        return ("error", str(exc))
    return line, bytes(body)


VALID = st.fixed_dictionaries(
    {
        "topic": st.sampled_from(["test", "orders-1", "t\u00e9st"]),
        "partition": st.integers(0, 2**31 - 1),
        "body": st.one_of(st.binary(max_size=40), st.binary(max_size=40).map(bytearray)),
        "count": st.integers(0, 2**31 - 1),
        "checksum": st.one_of(st.none(), st.integers(0, 2**31 - 1)),
        "opaque": st.integers(1, 2**31 - 1),
        "producer_id": st.sampled_from([None, "0123456789abcdef0123456789abcdef"]),
        "sequence": st.integers(0, 2**31 - 1),
        "tx_key": st.none(),
    }
)
HOSTILE = {
    "topic": TOPIC,
    "partition": NUMBER,
    "body": BODY,
    "count": NUMBER,
    "checksum": NUMBER,
    "opaque": NUMBER,
    "producer_id": PRODUCER,
    "sequence": NUMBER,
    "tx_key": st.sampled_from(["null", "TX:1"]),
}


@seed(20261129)
@settings(max_examples=1500, deadline=None)
@given(
    fields=VALID,
    hostile=st.lists(st.sampled_from(sorted(HOSTILE)), max_size=2, unique=True),
    data=st.data(),
    again=st.booleans(),
)
def test_the_bput_encoder_fast_path_writes_what_the_general_encoder_writes(
    fields: dict[str, Any], hostile: list[str], data: st.DataObject, again: bool
) -> None:
    """A valid idempotent or plain command, with up to two fields made hostile."""
    for name in hostile:
        fields[name] = data.draw(HOSTILE[name], label=name)
    if fields["producer_id"] is None and "sequence" not in hostile:
        fields["sequence"] = None
    opaque = fields.pop("opaque")
    cmd = BatchPutCommand(**fields, opaque=0)
    general = _outcome(lambda c, o: enc._batch("bput", c, o), cmd, opaque)
    assert _outcome(enc._bput, cmd, opaque) == general
    if again:  # the topic and producer id are cached now (when they were valid)
        assert _outcome(enc._bput, cmd, opaque) == general


PID = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    "cmd, opaque",
    [
        (BatchPutCommand("t", 0, b"", 0, None, 0, PID, -1), 1),
        (BatchPutCommand("t", 0, b"", 0, None, 0, PID, 2**31), 1),
        (BatchPutCommand("t", 0, b"", 0, None, 0, PID, True), 1),
        (BatchPutCommand("t", 0, b"", 0, None, 0, PID, None), 1),
        (BatchPutCommand("t", 0, b"", 0, None, 0, None, 5), 1),
        (BatchPutCommand("t", 0, b"", 0, None, 0, PID.upper(), 5), 1),
        (BatchPutCommand("t", 0, b"", 0, None, 0, [PID], 5), 1),  # type: ignore[arg-type]
        (BatchPutCommand(["t"], 0, b"", 0), 1),  # type: ignore[arg-type]
        (BatchPutCommand("t", 2**31, b"", 0), 1),
        (BatchPutCommand("t", 0, b"", -(2**31) - 1), 1),
        (BatchPutCommand("t", 0, b"", 0, 2**31), 1),
        (BatchPutCommand("t", 0, b"", 0), 2**31),
        (BatchPutCommand("t", 0, b"", 0), -(2**31) - 1),
        (BatchPutCommand("t", 0, memoryview(b"ab"), 1), 1),  # type: ignore[arg-type]
        (BatchPutCommand("t", 0, b"", 0, None, 0, None, None, "null"), 1),
        (BatchPutCommand("t", 0, b"", 0, None, 0, PID, 5), 7),
    ],
)
def test_the_bput_encoder_fast_path_on_each_edge(cmd: BatchPutCommand, opaque: int) -> None:
    general = _outcome(lambda c, o: enc._batch("bput", c, o), cmd, opaque)
    assert _outcome(enc._bput, cmd, opaque) == general


def test_the_fast_paths_caches_stay_bounded() -> None:
    for k in range(enc._CACHE_MAX + 10):
        enc.encode_parts(BatchPutCommand(f"t{k}", 0, b"", 0), 1)
    assert len(enc._BPUT_PREFIX) <= enc._CACHE_MAX
    line, _ = enc.encode_parts(BatchPutCommand("t5", 0, b"", 0), 1)
    assert line == b"bput t5 0 0 0 -1 1\r\n"


TOKEN = st.one_of(
    st.integers(0, 2**31 + 5).map(lambda n: str(n).encode()),
    st.sampled_from([b"", b"+5", b"-1", b"007", b"1" * 10, b"1" * 20, b"x", b"\xd9\xa3", b"2 "]),
)


class _GeneralOnly(Parser):
    """A parser without the fast paths: the reference."""

    def _plain_result(self, tokens: Any, start: int) -> None:
        return None

    def _plain_bput(self, tokens: Any, start: int) -> None:
        return None


def _events(parser: Parser, chunks: list[bytes]) -> list[Any]:
    """``drain``'s events, errors as (reason, fatal, opaque) so they compare."""
    return [
        (e.reason, e.fatal, e.opaque) if isinstance(e, ProtocolError) else e
        for e in drain(parser, chunks)
    ]


@seed(20261129)
@settings(max_examples=1000, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            TOKEN,
            st.one_of(st.none(), TOKEN),  # None: the body's own length
            TOKEN,
            st.one_of(st.binary(max_size=70), st.binary(min_size=35, max_size=70)),
            st.sampled_from(["", "", " ", "  "]),
        ),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(0, 300), max_size=6),
)
def test_the_result_fast_path_parses_what_the_general_path_parses(
    frames: list[tuple[bytes, bytes | None, bytes, bytes, str]], cuts: list[int]
) -> None:
    wire = b"".join(
        b"result %s %s %s%s\r\n%s"
        % (code, b"%d" % len(body) if size is None else size, opaque, tail.encode(), body)
        for code, size, opaque, body, tail in frames
    )
    chunks = split(wire, cuts)
    limits = Limits(max_body=40)
    fast = _events(Parser(Role.CLIENT, limits), chunks)
    assert fast == _events(_GeneralOnly(Role.CLIENT, limits), chunks)


@pytest.mark.parametrize(
    "wire",
    [
        b"result 200 3 7\r\nabc",
        b"result 200 50 7\r\n" + b"x" * 50,  # over the limit
        b"result 200 41 7\r\n" + b"x" * 41,
        b"result 200 40 7\r\n" + b"x" * 40,
        b"result 200 3 7\r\nab",  # partial body
        b"result 200 +3 7\r\nabc",
        b"result -1 3 7\r\nabc",
        b"result 200 003 0007\r\nabc",
        b"result 200 3 7 \r\nabc",
        b"result 200 3 2147483648\r\nabc",
        b"result 9999999999 3 7\r\nabc",
        b"result 200 99999999999 7\r\nabc",
        b"result  200 3 7\r\nabc",
        b"result 200 0 7\r\nresult 404 2 8\r\nno",
    ],
)
def test_the_result_fast_path_on_each_edge(wire: bytes) -> None:
    limits = Limits(max_body=40)
    for chunks in ([wire], [wire[:9], wire[9:]], [bytes([b]) for b in wire]):
        fast = _events(Parser(Role.CLIENT, limits), chunks)
        assert fast == _events(_GeneralOnly(Role.CLIENT, limits), chunks), chunks


BPUT_TOKEN = st.one_of(
    TOKEN, st.sampled_from([b"-1", b"-2", b"t\xc3\xa9", b"\xff", PID.encode(), b"A" * 32])
)
RECORDS = st.binary(max_size=90)


@seed(20261129)
@settings(max_examples=1500, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.lists(st.one_of(st.none(), BPUT_TOKEN), min_size=5, max_size=8),
            st.one_of(st.none(), TOKEN),  # None: the body's own length
            RECORDS,
            st.sampled_from(["", "", "", " ", "\r"]),
        ),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(0, 600), max_size=6),
    bare_lf=st.booleans(),
)
def test_the_bput_parser_fast_path_parses_what_the_general_path_parses(
    frames: list[tuple[list[bytes | None], bytes | None, bytes, str]],
    cuts: list[int],
    bare_lf: bool,
) -> None:
    """``bput <topic> <partition> <len> <count> <checksum> [<producer> <seq>] <opaque>`` with
    each token plain (None: a valid value for its place) or hostile, and a body of its own
    length or not."""
    plain = [b"test", b"3", None, b"1", b"-1", PID.encode(), b"7", b"9"]
    wire = b""
    for tokens, size, body, tail in frames:
        line: list[bytes | None] = [b"bput"]
        for k, token in enumerate(tokens):
            place = k if k < len(tokens) - 1 else 7  # the last token: the opaque's place
            line.append(plain[place] if token is None else token)
        length = b"%d" % len(body) if size is None else size
        line[3] = length if tokens[2] is None else line[3]
        wire += b" ".join(x for x in line if x is not None) + tail.encode() + b"\r\n" + body
    chunks = split(wire, cuts)
    limits = Limits(max_batch_body=64)
    fast = _events(Parser(Role.SERVER, limits, bare_lf=bare_lf), chunks)
    assert fast == _events(_GeneralOnly(Role.SERVER, limits, bare_lf=bare_lf), chunks)


@pytest.mark.parametrize(
    "line",
    [
        b"bput test 3 %d 1 -1 7",
        b"bput test 3 %d 1 -1 " + PID.encode() + b" 5 7",
        b"bput test 3 %d 1 12345 " + PID.encode() + b" 5 7",
        b"bput test 3 %d 1 -2 7",
        b"bput test -3 %d 1 -1 7",
        b"bput test 3 %d -1 -1 7",
        b"bput test 3 %d 1 -1 " + PID.upper().encode() + b" 5 7",
        b"bput test 3 %d 1 -1 " + PID.encode() + b" -5 7",
        b"bput test 3 %d 1 -1 " + PID.encode() + b" 2147483648 7",
        b"bput test 3 %d 1 -1 TX:s:1 7",
        b"bput t\xff 3 %d 1 -1 7",
        b"bput test 3 %d 1 -1 7 ",
        b"bput test 3 %d 1 -1 +7",
        b"bput test 3 %d 1 -1 9999999999",
        b"bput test 0003 %d 01 -1 007",
        b"bput test 9999999999 %d 1 -1 7",
        b"bput  3 %d 1 -1 7",
    ],
)
def test_the_bput_parser_fast_path_on_each_edge(line: bytes) -> None:
    body = b"x" * 30
    for size in (len(body), 80):  # within and over max_batch_body
        wire = (line % size) + b"\r\n" + body + b"x" * (size - len(body))
        for chunks in ([wire], [wire[:12], wire[12:]], [bytes([b]) for b in wire]):
            limits = Limits(max_batch_body=64)
            fast = _events(Parser(Role.SERVER, limits), chunks)
            assert fast == _events(_GeneralOnly(Role.SERVER, limits), chunks), chunks
