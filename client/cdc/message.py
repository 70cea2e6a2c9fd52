"""The CDC message: one committed source transaction (or one part of a large one) as JSON.

Byte layout: a UTF-8 JSON object, one per message::

    {"v": 1, "xid": 725, "lsn": "0/1505C50", "time": "2026-11-24 08:58:10.233307+00",
     "part": 1, "parts": 1,
     "changes": [{"op": "insert", "table": "public.c", "row": {"id": 1, "name": "x"}},
                 {"op": "update", "table": "public.c", "row": {...}, "key": {"id": 2}},
                 {"op": "delete", "table": "public.c", "key": {"id": 1}},
                 {"op": "truncate", "table": "public.a", "tables": ["public.a", "public.b"]}]}

``lsn`` is the commit's end LSN (the slot position that confirms it; it orders transactions and
is what the apply side deduplicates by), ``time`` the source's commit timestamp. A transaction
whose JSON would exceed ``max_bytes`` is cut into ``parts`` consecutive messages of the same
partition, each carrying ``xid``/``lsn``; the apply side applies it only when the last part has
arrived. Small transactions committed close together travel as a batch: a JSON array of such
objects (each ``"parts": 1``), in commit order, up to ``max_bytes``. Pure functions;
thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pymetaq.client.cdc.decoding import Change, Transaction, format_lsn, parse_lsn

VERSION = 1
#: default cap on one message's JSON (the broker's default maxTransferSize is 1 MiB)
MAX_BYTES = 512 * 1024


@dataclass(frozen=True)
class Part:
    """A decoded message: one transaction's changes, or part ``part`` of ``parts`` of them."""

    xid: int
    lsn: int
    commit_time: str | None
    part: int
    parts: int
    changes: list[Change]


def change_doc(c: Change) -> dict[str, Any]:
    doc: dict[str, Any] = {"op": c.op, "table": c.table}
    if c.row is not None:
        doc["row"] = c.row
    if c.key is not None:
        doc["key"] = c.key
    if c.tables:
        doc["tables"] = list(c.tables)
    return doc


def encode(tx: Transaction, max_bytes: int = MAX_BYTES) -> list[bytes]:
    """The transaction as one message, or as several parts of at most ~``max_bytes`` each."""
    docs = [
        json.dumps(change_doc(c), ensure_ascii=False, separators=(",", ":")) for c in tx.changes
    ]
    chunks: list[list[str]] = [[]]
    size = 0
    for d in docs:
        if chunks[-1] and size + len(d) > max_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(d)
        size += len(d) + 1
    head = {"v": VERSION, "xid": tx.xid, "lsn": format_lsn(tx.lsn), "time": tx.commit_time}
    out = []
    for i, chunk in enumerate(chunks, 1):
        prefix = json.dumps({**head, "part": i, "parts": len(chunks)}, separators=(",", ":"))
        out.append(f'{prefix[:-1]},"changes":[{",".join(chunk)}]}}'.encode())
    return out


def _part(doc: Any) -> Part:
    if not isinstance(doc, dict) or doc.get("v") != VERSION:
        raise ValueError(f"not a version-{VERSION} CDC message")
    changes = [
        Change(
            c["op"],
            c["table"],
            row=c.get("row"),
            key=c.get("key"),
            tables=tuple(c.get("tables", ())),
        )
        for c in doc["changes"]
    ]
    return Part(
        int(doc["xid"]),
        parse_lsn(doc["lsn"]),
        doc.get("time"),
        int(doc["part"]),
        int(doc["parts"]),
        changes,
    )


def decode_all(value: bytes) -> list[Part]:
    """A message's bytes -> its parts (one, or a batch's whole transactions in commit order);
    ``ValueError`` for anything else."""
    try:
        doc = json.loads(value)
        if isinstance(doc, list):
            parts = [_part(d) for d in doc]
            if not parts or any(p.parts != 1 for p in parts):
                raise ValueError("a batch holds whole transactions only")
            return parts
        return [_part(doc)]
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"not a CDC message: {e}") from None


def decode(value: bytes) -> Part:
    """A one-transaction (or one-part) message's bytes -> :class:`Part`."""
    parts = decode_all(value)
    if len(parts) != 1:
        raise ValueError(f"a batch of {len(parts)} transactions, not one")
    return parts[0]


def batch(messages: Sequence[bytes]) -> bytes:
    """Several one-part messages (whole transactions, in commit order) as one message."""
    return b"[" + b",".join(messages) + b"]"


def join(parts: Sequence[Part]) -> Transaction:
    """The parts of one transaction (in order) -> the transaction."""
    first = parts[0]
    if [p.part for p in parts] != list(range(1, first.parts + 1)) or any(
        p.lsn != first.lsn for p in parts
    ):
        raise ValueError(f"parts of transaction {first.xid} out of order or mixed")
    tx = Transaction(first.xid, first.lsn, first.commit_time)
    for p in parts:
        tx.changes.extend(p.changes)
    return tx
