"""Hypothesis strategies for every codec dataclass, valid by construction, and parse helpers."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from hypothesis import strategies as st

from pymetaq.client.protocol import (
    NEED_DATA,
    AdminCommand,
    BatchPutCommand,
    Event,
    GetCommand,
    LocalTxKey,
    OffsetCommand,
    Parser,
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
    XidKey,
    format_tx_key,
)
from pymetaq.storage.record import encode_record

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
OPAQUE = INT32
CHECKSUM = st.none() | INT32.filter(lambda v: v != -1)  # -1 on the wire means None
TOKEN = st.text(
    st.characters(codec="utf-8", exclude_characters=" \r\n"),
    min_size=1,
    max_size=12,
)
NAME = TOKEN.filter(lambda s: not re.search(r"[:\s]", s))  # tx-key parts: no ':'/whitespace
BODY = st.binary(max_size=200)

LOCAL_KEY = st.builds(LocalTxKey, NAME, st.integers(-(1 << 31), (1 << 31) - 1))
XID_KEY = st.builds(
    XidKey, INT32, st.binary(max_size=16), st.binary(max_size=16), NAME | st.just("")
)
TX_KEY = st.one_of(st.just("null"), LOCAL_KEY.map(format_tx_key), XID_KEY.map(format_tx_key))


@st.composite
def puts(draw: st.DrawFn) -> PutCommand:
    form = draw(st.sampled_from(PutForm))
    checksum = draw(CHECKSUM) if form is PutForm.CHECKSUM else None
    return PutCommand(
        draw(TOKEN),
        draw(INT32),
        draw(BODY),
        draw(INT32),
        checksum,
        draw(st.none() | TX_KEY),
        draw(OPAQUE),
        form,
    )


@st.composite
def transactions(draw: st.DrawFn) -> TransactionCommand:
    timeout = draw(st.none() | st.integers(0, (1 << 31) - 1))
    qualifier = draw(st.none() | TOKEN)
    if timeout is None and qualifier is not None and qualifier.isascii() and qualifier.isdigit():
        qualifier = "q" + qualifier  # a bare numeric qualifier would read back as a timeout
    return TransactionCommand(
        draw(TX_KEY),
        draw(TOKEN),
        draw(st.sampled_from(TransactionType)),
        timeout,
        qualifier,
        draw(OPAQUE),
    )


def _records(payloads: list[bytes]) -> bytearray:
    return bytearray(b"".join(encode_record(p) for p in payloads))


BATCH_PUTS = st.builds(
    lambda topic, partition, payloads, checksum, opaque: BatchPutCommand(
        topic, partition, _records(payloads), len(payloads), checksum, opaque
    ),
    TOKEN,
    INT32,
    st.lists(st.binary(max_size=40), max_size=5),
    CHECKSUM,
    OPAQUE,
)

COMMANDS: st.SearchStrategy[Event] = st.one_of(
    puts(),
    BATCH_PUTS,
    st.builds(GetCommand, TOKEN, TOKEN, INT32, INT64, INT32, OPAQUE, st.none() | INT32),
    st.builds(OffsetCommand, TOKEN, TOKEN, INT32, INT64, OPAQUE),
    st.builds(StatsCommand, st.just("") | TOKEN, OPAQUE),
    st.builds(VersionCommand, OPAQUE),
    st.builds(AdminCommand, TOKEN, st.lists(TOKEN, max_size=5).map(tuple), OPAQUE),
    st.just(QuitCommand()),
    transactions(),
    st.builds(TxAdminCommand, st.sampled_from(TxAdminOp), TX_KEY, OPAQUE),
    st.builds(SyncCommand, TOKEN, INT32, BODY, INT32, INT64, CHECKSUM, OPAQUE),
)
REPLIES: st.SearchStrategy[Event] = st.one_of(
    st.builds(ResultReply, INT32, BODY, OPAQUE),
    st.builds(ValueReply, BODY, OPAQUE),
)


def role_of(event: Event) -> Role:
    return Role.CLIENT if isinstance(event, ResultReply | ValueReply) else Role.SERVER


def split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    """``data`` cut at the given positions (taken modulo its length, sorted)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def drain(parser: Parser, chunks: Sequence[bytes]) -> list[Event | ProtocolError]:
    """Feed chunks one by one, collecting every event and non-fatal error; stop at a fatal one.

    Bounded: each call of ``next_event`` either returns NEED_DATA or consumes at least 2 bytes.
    """
    out: list[Event | ProtocolError] = []
    for chunk in chunks:
        parser.feed(chunk)
        for _ in range(len(chunk) + 2 + parser.pending_bytes):
            try:
                event = parser.next_event()
            except ProtocolError as exc:
                out.append(exc)
                if exc.fatal:
                    return out
                continue
            if event is NEED_DATA:
                break
            out.append(event)
        else:
            raise AssertionError("parser made no progress")  # pragma: no cover
    return out
