"""Pure logic of CDC: ``test_decoding`` rows parsed (the rows below are what PostgreSQL 15
printed for the statements in their comments), transactions grouped, the message format
round-tripped and cut into parts."""

from __future__ import annotations

import json

import pytest

from pymetaq.client.cdc.decoding import (
    Change,
    DecodingError,
    Transaction,
    format_lsn,
    parse_change,
    parse_lsn,
    transactions,
)
from pymetaq.client.cdc.message import batch, decode, decode_all, encode, join

# INSERT INTO c VALUES (1, 'O''Br ien', true, 12.50, '{1,2}', 'x y', now(), '{"a": "b c"}',
#                       '\x00ff', 1.5)
INSERT = (
    "table public.c: INSERT: id[integer]:1 name[text]:'O''Br ien' ok[boolean]:true "
    "amt[numeric]:12.50 tags[integer[]]:'{1,2}' \"Weird Col\"[character varying]:'x y' "
    "ts[timestamp with time zone]:'2026-11-24 08:58:10.232612+00' j[jsonb]:'{\"a\": \"b c\"}' "
    "b[bytea]:'\\x00ff' f[double precision]:1.5"
)


def test_insert_row_every_literal_form() -> None:
    c = parse_change(INSERT)
    assert c == Change(
        "insert",
        "public.c",
        row={
            "id": 1,
            "name": "O'Br ien",
            "ok": True,
            "amt": "12.50",
            "tags": "{1,2}",
            "Weird Col": "x y",
            "ts": "2026-11-24 08:58:10.232612+00",
            "j": '{"a": "b c"}',
            "b": "\\x00ff",
            "f": 1.5,
        },
    )


def test_nulls_update_with_old_key_delete_truncate() -> None:
    assert parse_change("table public.c: INSERT: id[integer]:2 name[text]:null") == Change(
        "insert", "public.c", row={"id": 2, "name": None}
    )
    # UPDATE c SET id = 3 WHERE id = 2
    up = parse_change(
        "table public.c: UPDATE: old-key: id[integer]:2 new-tuple: id[integer]:3 name[text]:null"
    )
    assert up == Change("update", "public.c", row={"id": 3, "name": None}, key={"id": 2})
    assert parse_change("table public.c: DELETE: id[integer]:1") == Change(
        "delete", "public.c", key={"id": 1}
    )
    tr = parse_change('table public.a, "My"."T b": TRUNCATE: cascade')
    assert tr is not None and tr.op == "truncate" and tr.tables == ("public.a", "My.T b")


def test_quoted_names_brackets_in_values_and_unchanged_toast() -> None:
    c = parse_change(
        "table \"Sch ema\".\"Ta\"\"ble\": UPDATE: id[bigint]:-7 note[text]:'a]: b[c] ''d''' "
        "big[text]:unchanged-toast-datum flag[bit]:B'0101' r[real]:NaN"
    )
    assert c is not None and c.table == 'Sch ema.Ta"ble'
    assert c.row is not None
    assert c.row["id"] == -7 and c.row["note"] == "a]: b[c] 'd'" and c.row["flag"] == "0101"
    assert "big" not in c.row  # the replica keeps its value
    assert c.row["r"] != c.row["r"]  # NaN


def test_rows_that_are_not_changes() -> None:
    assert (
        parse_change("message: transactional: 1 prefix: pymetaq-cdc, sz: 5 content:flush") is None
    )
    with pytest.raises(DecodingError, match="primary key"):
        parse_change("table public.nokey: DELETE: (no-tuple-data)")
    with pytest.raises(DecodingError):
        parse_change("table public.c: INSERT: id[integer:1")
    with pytest.raises(DecodingError):
        parse_change("table public.c: MERGE: id[integer]:1")


def test_transactions_grouped_with_commit_lsn_and_time() -> None:
    rows = [
        ("0/1505A60", "725", "BEGIN 725"),
        ("0/1505A60", "725", "table public.c: INSERT: id[integer]:1"),
        ("0/1505B98", "725", "table public.c: INSERT: id[integer]:2"),
        ("0/1505C50", "725", "COMMIT 725 (at 2026-11-24 08:58:10.233307+00)"),
        ("0/1505C50", "726", "BEGIN 726"),
        ("0/1505D20", "726", "COMMIT 726 (at 2026-11-24 08:58:10.233839+00)"),
    ]
    txs = list(transactions(rows))
    assert [(t.xid, format_lsn(t.lsn), len(t.changes)) for t in txs] == [
        (725, "0/1505C50", 2),
        (726, "0/1505D20", 0),
    ]
    assert txs[0].commit_time == "2026-11-24 08:58:10.233307+00"
    with pytest.raises(DecodingError):
        list(transactions([("0/1", "1", "table public.c: INSERT: id[integer]:1")]))


def test_lsn_text_round_trip() -> None:
    for text in ("0/0", "0/1505C50", "1A/FFFFFFFF"):
        assert format_lsn(parse_lsn(text)) == text
    assert parse_lsn("1/0") == 1 << 32
    with pytest.raises(ValueError):
        parse_lsn("12345")


def test_message_round_trip_and_parts() -> None:
    changes = [Change("insert", "public.t", row={"id": i, "s": "é'" * (i % 7)}) for i in range(300)]
    changes.append(Change("delete", "public.t", key={"id": 5}))
    changes.append(Change("truncate", "public.u", tables=("public.u", "public.v")))
    tx = Transaction(9, parse_lsn("0/ABC"), "2026-11-24 09:00:00+00", changes)
    (one,) = encode(tx)
    assert json.loads(one)["parts"] == 1
    assert join([decode(one)]) == tx
    parts = encode(tx, max_bytes=1000)
    assert len(parts) > 5 and all(len(p) < 1300 for p in parts)
    decoded = [decode(p) for p in parts]
    assert [p.part for p in decoded] == list(range(1, len(parts) + 1))
    assert join(decoded) == tx
    with pytest.raises(ValueError):
        join(decoded[1:])
    for bad in (b"", b"[]", b'{"v": 2}', b'{"v": 1, "xid": 1}', b"\xff"):
        with pytest.raises(ValueError):
            decode(bad)


def test_a_batch_message_holds_whole_transactions_in_order() -> None:
    txs = [
        Transaction(i, parse_lsn(f"0/{i:X}0"), None, [Change("insert", "public.t", row={"id": i})])
        for i in range(1, 4)
    ]
    value = batch([encode(t)[0] for t in txs])
    assert [join([p]) for p in decode_all(value)] == txs
    with pytest.raises(ValueError, match="batch of 3"):
        decode(value)
    big = Transaction(9, 9, None, [Change("insert", "public.t", row={"id": i}) for i in range(99)])
    with pytest.raises(ValueError, match="whole transactions"):
        decode_all(batch(encode(big, max_bytes=100)))
    with pytest.raises(ValueError):
        decode_all(b"[]")
