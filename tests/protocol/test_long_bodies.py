"""Long bodies (a 1 MiB ``get`` reply, a multi-MiB ``bput``) arrive in many reads: the parser
collects them as chunks and joins them once, or (``body_into``, the client's connection)
receives them in place, fed or written into its body window. Whatever the chunking, the events,
the buffered byte counts and the trailing data are exactly those of a short body."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pymetaq.client.protocol import (
    NEED_DATA,
    BatchPutCommand,
    Event,
    Limits,
    Parser,
    ProtocolError,
    PutCommand,
    PutForm,
    Role,
    ValueReply,
    encode,
)
from pymetaq.client.protocol.parser import BodyInto
from pymetaq.client.transport.connection import _body_into_c, _body_into_python
from pymetaq.storage.record import encode_record

SEED = random.randrange(1 << 30)
MIB = 1 << 20


def frames(rng: random.Random) -> list[tuple[Role, object]]:
    body = rng.randbytes(MIB + 17)
    records = [encode_record(rng.randbytes(rng.randrange(1, 4096)), 0, i) for i in range(700)]
    batch = b"".join(records)
    return [
        (Role.CLIENT, ValueReply(body, 7)),
        (Role.SERVER, BatchPutCommand("t", 0, batch, len(records), None, 9)),
        (
            Role.SERVER,
            PutCommand("t", 1, rng.randbytes(300_000), 0, None, None, 11, PutForm.CHECKSUM),
        ),
    ]


#: how a long body is collected: chunks joined, or received in place (C, pure Python)
INTO: dict[str, BodyInto | None] = {"join": None, "python": _body_into_python, "c": _body_into_c}


@pytest.mark.parametrize("into", list(INTO))
@pytest.mark.parametrize("index", [0, 1, 2], ids=["value-reply", "bput", "put"])
def test_any_chunking_gives_the_same_events_and_counts(index: int, into: str) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED + index)
    role, event = frames(rng)[index]
    wire = encode(event)  # type: ignore[arg-type]
    stream = wire + wire + wire[:100]  # two frames and the start of a third
    limits = Limits(max_body=8 * MIB, max_batch_body=8 * MIB)
    for _ in range(20):
        parser = Parser(role, limits, body_into=INTO[into])
        got: list[Event] = []
        fed = 0
        while fed < len(stream):
            n = rng.choice([1, 7, 4096, 65536, 262144, 300_000, len(stream)])
            window = parser.body_window()
            if window is not None and rng.random() < 0.5:  # recv_into the body's rest
                n = min(n, len(window))
                window[:n] = stream[fed : fed + n]
                window.release()
                parser.body_received(n)
                fed += n
            else:
                chunk = stream[fed : fed + n]
                # callers hand over bytes, bytearrays or memoryviews (which they may reuse)
                kind = rng.choice([bytes, bytearray, memoryview])
                parser.feed(kind(chunk))
                fed += len(chunk)
            consumed = len(wire) * len(got)
            assert parser.pending_bytes == fed - consumed
            assert parser.trailing_data == stream[consumed:fed]
            assert parser.in_frame == (fed > consumed)
            while (e := parser.next_event()) is not NEED_DATA:
                got.append(e)
        assert got == [event, event]
        assert parser.trailing_data == wire[:100] and parser.pending_bytes == 100
        if isinstance(event, BatchPutCommand):  # the broker stamps ids into it: writable
            assert all(isinstance(e, BatchPutCommand) and type(e.body) is bytearray for e in got)
        else:  # received in place or joined, a body is bytes
            assert all(
                isinstance(e, PutCommand | ValueReply) and type(e.data) is bytes for e in got
            )


@pytest.mark.parametrize("into", ["python", "c"])
def test_the_body_window_is_the_body_s_rest_and_counts_are_checked(into: str) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    wire = encode(ValueReply(body, 5)) + encode(ValueReply(b"short", 6))
    parser = Parser(Role.CLIENT, Limits(max_body=2 * MIB), body_into=INTO[into])
    assert parser.body_window() is None  # nothing pending
    with pytest.raises(ValueError):
        parser.body_received(1)
    head = len(b"value 1048576 5\r\n") + 1000
    parser.feed(wire[:head])
    assert parser.next_event() is NEED_DATA
    window = parser.body_window()
    assert window is not None and len(window) == MIB - 1000  # never past the body
    with pytest.raises(ValueError):
        parser.body_received(len(window) + 1)
    with pytest.raises(ValueError):
        parser.body_received(-1)
    window[:] = wire[head : head + len(window)]
    window.release()
    parser.body_received(MIB - 1000)
    assert parser.body_window() is None
    assert parser.next_event() == ValueReply(body, 5)
    parser.feed(wire[head + MIB - 1000 :])
    assert parser.next_event() == ValueReply(b"short", 6)
    assert parser.pending_bytes == 0 and not parser.in_frame


@pytest.mark.parametrize("into", list(INTO))
def test_release_drops_a_body_being_collected(into: str) -> None:
    wire = encode(ValueReply(b"x" * MIB, 3))
    parser = Parser(Role.CLIENT, Limits(max_body=2 * MIB), body_into=INTO[into])
    parser.feed(wire[: MIB // 2])
    assert parser.next_event() is NEED_DATA and parser.pending_bytes == MIB // 2
    parser.release()
    assert parser.pending_bytes == 0 and not parser.in_frame
    parser.feed(wire)
    assert parser.next_event() == ValueReply(b"x" * MIB, 3)


@pytest.mark.parametrize("into", ["python", "c"])
def test_a_declared_body_over_the_limit_is_never_allocated(into: str) -> None:
    """A hostile broker declaring a 1 GiB reply: the body is discarded as it arrives, nothing
    of its size is allocated, and the next reply parses normally."""
    sizes: list[int] = []

    def counting(n: int) -> Any:
        sizes.append(n)
        return INTO[into](n)  # type: ignore[misc]

    parser = Parser(Role.CLIENT, Limits(max_body=2 * MIB), body_into=counting)
    parser.feed(b"value 1073741824 4\r\n" + b"x" * MIB)
    with pytest.raises(ProtocolError):  # raised once the whole declared body has passed
        for _ in range(1024):
            assert parser.next_event() is NEED_DATA and parser.body_window() is None
            parser.feed(b"x" * MIB)
    assert sizes == [] and parser.pending_bytes == 0
    wire = encode(ValueReply(b"y" * MIB, 5))
    parser.feed(wire[:1000])  # a body that arrives in pieces is received in place again
    assert parser.next_event() is NEED_DATA and sizes == [MIB]
    parser.feed(wire[1000:])
    assert parser.next_event() == ValueReply(b"y" * MIB, 5)
