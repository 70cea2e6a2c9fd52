"""XA vocabulary of the broker: error codes, transaction states, and the two error shapes.

Codes are ``javax.transaction.xa.XAException``'s, which MetaQ's Java client parses back out of
``XAException:code=<n>,msg=<text>`` (``TransactionContext.EXCEPTION_PAT``):

| name           | code | the broker sends it when                                        |
|----------------|-----:|-----------------------------------------------------------------|
| XA_RBTIMEOUT   |  106 | the transaction timed out and was rolled back                   |
| XA_RBOTHER     |  104 | (reserved: MetaQ's store-commit failure)                        |
| XA_HEURHAZ     |    8 | (MetaQ's heuristic "complete"; not offered by pymetaq)          |
| XA_HEURCOM     |    7 | an operator committed the branch heuristically                  |
| XA_HEURRB      |    6 | an operator rolled the branch back heuristically                |
| XA_RDONLY      |    3 | PREPARE of a branch with no work (sent as the reply body ``3``) |
| XA_OK          |    0 | PREPARE succeeded (reply body ``0``)                            |
| XAER_RMERR     |   -3 | PREPARE of a local transaction; a broker limit was reached      |
| XAER_NOTA      |   -4 | no such XA branch; FORGET/admin of a key that is not an xid     |
| XAER_INVAL     |   -5 | a command that needs a transaction key got ``null``             |
| XAER_PROTO     |   -6 | a call in the wrong state (the state machine below)             |
| XAER_RMFAIL    |   -7 | the transaction log or the partition log failed                 |
| XAER_DUPID     |   -8 | BEGIN of an xid that still has a heuristic decision             |

States (MetaQ's ``Transaction`` constants): START 0 -> IN_USE 1 (first message) -> PREPARED 2
(XA only) -> FINISHED 3; heuristic outcomes 4 (commit) and 5 (rollback).  A transaction whose
commit, prepare or rollback is in progress is *busy*: any other call on it is XAER_PROTO.

Errors MetaQ reports as plain text (a put into an unknown transaction, a commit of an unknown
local transaction) are :class:`TxError`; everything else is :class:`XAError`.

Thread-safety: immutable values.
"""

from __future__ import annotations

import enum

XA_OK = 0
XA_RDONLY = 3
XA_HEURRB = 6
XA_HEURCOM = 7
XA_HEURHAZ = 8
XA_RBOTHER = 104
XA_RBTIMEOUT = 106
XAER_RMERR = -3
XAER_NOTA = -4
XAER_INVAL = -5
XAER_PROTO = -6
XAER_RMFAIL = -7
XAER_DUPID = -8


class TxState(enum.IntEnum):
    START = 0
    IN_USE = 1
    PREPARED = 2
    FINISHED = 3
    HEURISTIC_COMMIT = 4
    HEURISTIC_ROLLBACK = 5


class TxError(Exception):
    """A failure MetaQ answers with its plain message (500, body = the message)."""

    def body(self) -> bytes:
        return str(self).encode("utf-8", "replace")


class XAError(TxError):
    """An XA failure: 500 ``XAException:code=<n>,msg=<text>``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code

    def body(self) -> bytes:
        return f"XAException:code={self.code},msg={self.args[0]}".encode("utf-8", "replace")
