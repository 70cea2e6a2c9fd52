"""Transaction keys as MetaQ writes them on the wire (``TransactionId.getTransactionKey``).

| key                                                  | meaning                         |
|------------------------------------------------------|---------------------------------|
| ``null``                                             | no transaction (``None`` here)  |
| ``TX:<sessionId>:<n>``                               | local transaction ``n``         |
| ``XID:<formatId>:<hex gtrid>:<hex bqual>:<uniqueQualifier>`` | an XA branch (lowercase hex) |

Keys are split on ``:``, so a session id must not contain ``:`` (MetaQ's ``<ip>-<ms>-<n>``
never does); the unique qualifier is the rest of the key after the fourth ``:`` and must not
contain ``:`` either.  Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pymetaq.client.protocol.errors import InvalidTxKey

_INT = re.compile(r"[+-]?[0-9]{1,19}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")
_BAD_CHARS = re.compile(r"[:\s]")


@dataclass(frozen=True, slots=True)
class LocalTxKey:
    """``TX:<session_id>:<n>``."""

    session_id: str
    n: int


@dataclass(frozen=True, slots=True)
class XidKey:
    """``XID:<format_id>:<hex gtrid>:<hex bqual>:<unique_qualifier>``."""

    format_id: int
    gtrid: bytes
    bqual: bytes
    unique_qualifier: str


TxKey = LocalTxKey | XidKey


def _int(token: str, what: str, key: str) -> int:
    if not _INT.fullmatch(token):
        raise InvalidTxKey(f"illegal transaction key {key!r}: bad {what}")
    return int(token)


def _hex(token: str, what: str, key: str) -> bytes:
    if not _HEX.fullmatch(token):
        raise InvalidTxKey(f"illegal transaction key {key!r}: bad {what}")
    return bytes.fromhex(token)


def parse_tx_key(key: str) -> TxKey | None:
    """Parse a wire key; ``"null"`` gives ``None``.  Raises :class:`InvalidTxKey`."""
    if key == "null":
        return None
    parts = key.split(":")
    if parts[0] == "TX" and len(parts) == 3 and parts[1]:
        return LocalTxKey(parts[1], _int(parts[2], "number", key))
    if parts[0] == "XID" and len(parts) == 5:
        return XidKey(
            _int(parts[1], "formatId", key),
            _hex(parts[2], "gtrid", key),
            _hex(parts[3], "bqual", key),
            parts[4],
        )
    raise InvalidTxKey(f"illegal transaction key {key!r}")


def format_tx_key(key: TxKey | None) -> str:
    """The wire form of ``key`` (``None`` => ``"null"``).  Raises :class:`InvalidTxKey`."""
    if key is None:
        return "null"
    if isinstance(key, LocalTxKey):
        if not key.session_id or _BAD_CHARS.search(key.session_id):
            raise InvalidTxKey(f"session id {key.session_id!r} is empty or has ':'/whitespace")
        return f"TX:{key.session_id}:{key.n}"
    if _BAD_CHARS.search(key.unique_qualifier):
        raise InvalidTxKey(f"unique qualifier {key.unique_qualifier!r} has ':'/whitespace")
    return f"XID:{key.format_id}:{key.gtrid.hex()}:{key.bqual.hex()}:{key.unique_qualifier}"
