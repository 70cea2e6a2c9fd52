"""Hypothesis: parse(encode(x)) == x for every dataclass, in any chunking; arbitrary and
mutated bytes raise only ProtocolError and never stall the parser."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymetaq.client.protocol import (
    Event,
    Limits,
    LocalTxKey,
    Parser,
    ProtocolError,
    Role,
    TxKey,
    XidKey,
    encode,
    format_tx_key,
    parse_tx_key,
)
from tests.protocol._strategies import (
    COMMANDS,
    LOCAL_KEY,
    REPLIES,
    XID_KEY,
    drain,
    role_of,
    split,
)

CUTS = st.lists(st.integers(0, 1 << 16), max_size=8)
SMALL = Limits(max_line=48, max_body=64, max_batch_body=96)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=400, deadline=None)
@given(event=st.one_of(COMMANDS, REPLIES), cuts=CUTS)
def test_parse_of_encode_is_identity(event: Event, cuts: list[int]) -> None:
    wire = encode(event)
    parser = Parser(role_of(event))
    assert drain(parser, split(wire, cuts)) == [event]
    assert parser.pending_bytes == 0


@settings(max_examples=200, deadline=None)
@given(events=st.lists(COMMANDS, min_size=1, max_size=12), cuts=CUTS)
def test_a_pipelined_stream_parses_in_order(events: list[Event], cuts: list[int]) -> None:
    wire = b"".join(encode(e) for e in events)
    assert drain(Parser(Role.SERVER), split(wire, cuts)) == events


@settings(max_examples=200, deadline=None)
@given(key=st.one_of(LOCAL_KEY, XID_KEY))
def test_tx_key_round_trip(key: TxKey) -> None:
    text = format_tx_key(key)
    assert parse_tx_key(text) == key
    assert text.startswith("TX:" if isinstance(key, LocalTxKey) else "XID:")
    if isinstance(key, XidKey):
        assert text.split(":")[2] == key.gtrid.hex()  # lowercase hex


def _fuzz(role: Role, limits: Limits, data: bytes, cuts: list[int]) -> None:
    out = drain(Parser(role, limits), split(data, cuts))
    errors = [e for e in out if isinstance(e, ProtocolError)]
    assert all(not e.fatal for e in errors[:-1])  # nothing follows a fatal error


@FUZZ
@given(
    role=st.sampled_from(Role),
    small=st.booleans(),
    data=st.binary(max_size=300),
    cuts=CUTS,
)
def test_arbitrary_bytes_raise_only_protocol_errors(
    role: Role, small: bool, data: bytes, cuts: list[int]
) -> None:
    _fuzz(role, SMALL if small else Limits(), data, cuts)


@st.composite
def mutated_streams(draw: st.DrawFn) -> tuple[Role, bytes]:
    role = draw(st.sampled_from(Role))
    events = draw(st.lists(COMMANDS if role is Role.SERVER else REPLIES, min_size=1, max_size=6))
    wire = bytearray(b"".join(encode(e) for e in events))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(wire)))
        kind = draw(st.sampled_from(["flip", "insert", "delete"]))
        if kind == "flip" and at < len(wire):
            wire[at] = draw(st.sampled_from(b" \r\n-+0912x\xff"))
        elif kind == "insert":
            wire[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del wire[at : at + draw(st.integers(1, 8))]
    return role, bytes(wire)


@FUZZ
@given(stream=mutated_streams(), small=st.booleans(), cuts=CUTS)
def test_mutated_frames_raise_only_protocol_errors(
    stream: tuple[Role, bytes], small: bool, cuts: list[int]
) -> None:
    role, data = stream
    _fuzz(role, SMALL if small else Limits(), data, cuts)
