"""PostgreSQL logical decoding through ``test_decoding``: its text rows parsed into changes and
whole transactions.

The capture reads a slot with ``pg_logical_slot_peek_changes(slot, NULL, n, 'include-xids',
'1', 'include-timestamp', '1')`` over plain SQL, so each row is ``(lsn, xid, data)`` with
``data`` one of (PostgreSQL 15's ``contrib/test_decoding``)::

    BEGIN 725
    table public.c: INSERT: id[integer]:1 name[text]:'O''Brien' ok[boolean]:true
    table public.c: UPDATE: old-key: id[integer]:2 new-tuple: id[integer]:3 name[text]:null
    table public.c: DELETE: id[integer]:1
    table public.a, public.b: TRUNCATE: cascade
    COMMIT 725 (at 2026-11-24 08:58:10.233307+00)

Names are printed with ``quote_identifier`` (``"Weird Col"``), types with ``format_type``
(``character varying``, ``integer[]``), values by ``print_literal``: numbers bare, booleans
``true``/``false``, bit strings ``B'0101'``, everything else a quoted literal with ``''`` for a
quote, ``null``, and ``unchanged-toast-datum`` for a TOASTed column an UPDATE did not touch
(left out of the change's row: the replica keeps its value). The COMMIT row's ``lsn`` is the end
of the commit record: advancing the slot to it confirms the transaction.

Values become JSON-friendly Python values by their type: integer types ``int``, ``real``/
``double precision`` ``float``, ``boolean`` ``bool``, everything else (``numeric`` too, to stay
exact) the ``str`` PostgreSQL printed. Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

INT_TYPES = frozenset({"smallint", "integer", "bigint", "oid"})
FLOAT_TYPES = frozenset({"real", "double precision"})
UNCHANGED_TOAST = "unchanged-toast-datum"


class DecodingError(ValueError):
    """A ``test_decoding`` row this parser cannot read (the message names the row)."""


@dataclass(frozen=True)
class Change:
    """One row change. ``row``: the new values (insert, update); ``key``: the old key an UPDATE
    printed (key changed, or REPLICA IDENTITY FULL) or a DELETE's key; ``tables``: TRUNCATE's."""

    op: str  # "insert" | "update" | "delete" | "truncate"
    table: str
    row: dict[str, Any] | None = None
    key: dict[str, Any] | None = None
    tables: tuple[str, ...] = ()


@dataclass
class Transaction:
    """A committed source transaction: its changes in order, the commit's end LSN and time."""

    xid: int
    lsn: int = 0
    commit_time: str | None = None
    changes: list[Change] = field(default_factory=list)


def parse_lsn(text: str) -> int:
    """``"0/1505C50"`` -> the 64-bit position."""
    hi, sep, lo = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


class _Cursor:
    __slots__ = ("pos", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> DecodingError:
        return DecodingError(f"{what} at column {self.pos} of {self.text[:200]!r}")

    def expect(self, s: str) -> None:
        if not self.text.startswith(s, self.pos):
            raise self.fail(f"expected {s!r}")
        self.pos += len(s)

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def delimited(self, q: str) -> str:
        """The text between ``q`` here and the closing ``q`` (a doubled ``q`` is one ``q``)."""
        t = self.text
        out = []
        i = self.pos + 1
        while True:
            j = t.find(q, i)
            if j < 0:
                raise self.fail(f"unterminated {q}")
            out.append(t[i:j])
            if t.startswith(q, j + 1):
                out.append(q)
                i = j + 2
                continue
            self.pos = j + 1
            return "".join(out)

    def ident(self, stops: str) -> str:
        """A name as ``quote_identifier`` prints it (quoted, with ``""`` inside, or bare)."""
        if self.text.startswith('"', self.pos):
            return self.delimited('"')
        t, i = self.text, self.pos
        while i < len(t) and t[i] not in stops:
            i += 1
        if i == self.pos:
            raise self.fail("expected a name")
        name, self.pos = t[self.pos : i], i
        return name

    def value(self, typ: str) -> Any:
        t = self.text
        if t.startswith("'", self.pos):
            return self.delimited("'")
        if t.startswith("B'", self.pos):
            self.pos += 1
            return self.delimited("'")
        end = t.find(" ", self.pos)
        end = len(t) if end < 0 else end
        raw, self.pos = t[self.pos : end], end
        if raw == "null":
            return None
        if raw == UNCHANGED_TOAST:
            return _UNCHANGED
        if typ in INT_TYPES:
            return int(raw)
        if typ in FLOAT_TYPES:
            return float(raw)
        if typ == "boolean":
            return raw == "true"
        return raw  # numeric and any other unquoted output: exact text

    def columns(self, until: str | None = None) -> dict[str, Any]:
        cols: dict[str, Any] = {}
        while True:
            self.skip_spaces()
            if self.at_end() or (until is not None and self.text.startswith(until, self.pos)):
                return cols
            name = self.ident("[")
            self.expect("[")
            end = self.text.find("]:", self.pos)
            if end < 0:
                raise self.fail("expected ']:' after a column type")
            typ, self.pos = self.text[self.pos : end], end + 2
            value = self.value(typ)
            if value is not _UNCHANGED:
                cols[name] = value


class _Unchanged:
    pass


_UNCHANGED: Any = _Unchanged()


def _qualified(cur: _Cursor) -> str:
    schema = cur.ident(".:, ")
    if cur.text.startswith(".", cur.pos):
        cur.pos += 1
        return f"{schema}.{cur.ident(':, ')}"
    return schema


def parse_change(data: str) -> Change | None:
    """One ``table ...`` row -> a :class:`Change`; None for rows that carry no row change
    (``message:`` rows of ``pg_logical_emit_message``)."""
    if not data.startswith("table "):
        if data.startswith("message:"):
            return None
        raise DecodingError(f"not a change row: {data[:200]!r}")
    cur = _Cursor(data)
    cur.pos = len("table ")
    tables = [_qualified(cur)]
    while cur.text.startswith(", ", cur.pos):
        cur.pos += 2
        tables.append(_qualified(cur))
    cur.expect(": ")
    op_end = data.find(":", cur.pos)
    if op_end < 0:
        raise cur.fail("expected an operation")
    op, cur.pos = data[cur.pos : op_end], op_end + 1
    if op == "TRUNCATE":
        return Change("truncate", tables[0], tables=tuple(tables))
    table = tables[0]
    cur.skip_spaces()
    if op == "INSERT":
        return Change("insert", table, row=cur.columns())
    if op == "UPDATE":
        key = None
        if data.startswith("old-key:", cur.pos):
            cur.pos += len("old-key:")
            key = cur.columns(until="new-tuple:")
            cur.expect("new-tuple:")
        if data.startswith("(no-tuple-data)", cur.pos):
            raise cur.fail("UPDATE without tuple data")
        return Change("update", table, row=cur.columns(), key=key)
    if op == "DELETE":
        if data.startswith("(no-tuple-data)", cur.pos):
            raise DecodingError(
                f"DELETE on {table} carries no key: give the table a primary key "
                "(or REPLICA IDENTITY FULL)"
            )
        return Change("delete", table, key=cur.columns())
    raise cur.fail(f"unknown operation {op!r}")


def transactions(rows: Iterable[tuple[str, Any, str]]) -> Iterator[Transaction]:
    """``(lsn, xid, data)`` rows (whole transactions, as ``peek_changes`` returns them) ->
    committed transactions in commit order."""
    current: Transaction | None = None
    for lsn, xid, data in rows:
        if data.startswith("BEGIN"):
            current = Transaction(xid=int(xid))
        elif data.startswith("COMMIT"):
            if current is None:
                raise DecodingError(f"COMMIT without BEGIN at {lsn}")
            current.lsn = parse_lsn(lsn)
            at = data.find("(at ")
            if at >= 0:
                current.commit_time = data[at + 4 : data.rfind(")")]
            yield current
            current = None
        else:
            if current is None:
                raise DecodingError(f"change outside a transaction at {lsn}: {data[:200]!r}")
            change = parse_change(data)
            if change is not None:
                current.changes.append(change)
