"""Long bodies (a 1 MiB ``get`` reply, a multi-MiB ``bput``) arrive in many reads: the parser
collects them as chunks and joins them once. Whatever the chunking, the events, the buffered
byte counts and the trailing data are exactly those of a short body."""

from __future__ import annotations

import random

import pytest

from pymetaq.client.protocol import (
    NEED_DATA,
    BatchPutCommand,
    Event,
    Limits,
    Parser,
    PutCommand,
    PutForm,
    Role,
    ValueReply,
    encode,
)
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


@pytest.mark.parametrize("index", [0, 1, 2], ids=["value-reply", "bput", "put"])
def test_any_chunking_gives_the_same_events_and_counts(index: int) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED + index)
    role, event = frames(rng)[index]
    wire = encode(event)  # type: ignore[arg-type]
    stream = wire + wire + wire[:100]  # two frames and the start of a third
    limits = Limits(max_body=8 * MIB, max_batch_body=8 * MIB)
    for _ in range(20):
        parser = Parser(role, limits)
        got: list[Event] = []
        fed = 0
        while fed < len(stream):
            n = rng.choice([1, 7, 4096, 65536, 262144, 300_000, len(stream)])
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


def test_release_drops_a_body_being_collected() -> None:
    wire = encode(ValueReply(b"x" * MIB, 3))
    parser = Parser(Role.CLIENT, Limits(max_body=2 * MIB))
    parser.feed(wire[: MIB // 2])
    assert parser.next_event() is NEED_DATA and parser.pending_bytes == MIB // 2
    parser.release()
    assert parser.pending_bytes == 0 and not parser.in_frame
    parser.feed(wire)
    assert parser.next_event() == ValueReply(b"x" * MIB, 3)
