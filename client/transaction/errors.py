"""The transaction errors of the client, and XA's vocabulary (codes and flags).

```
MetaClientError
└── TransactionError                    a transaction could not do what was asked
    ├── TransactionInProgress           a transaction is already bound to this context
    ├── TransactionClosed               the transaction is finished (committed / rolled back)
    ├── CrossBrokerTransaction          a message for a partition of another broker
    ├── TransactionRolledBack (r)       the commit did not happen: nothing of it is stored
    ├── TransactionOutcomeUnknown       COMMIT was sent, no answer: committed or not, unknown
    ├── TwoPhaseUnsupported             the database cannot prepare (SQLite, prepared
    │                                   transactions disabled, not PostgreSQL)
    ├── DecisionLogError                the coordinator's decision log (locked, corrupt)
    ├── HeuristicMixed                  an operator decided a branch against the coordinator
    └── XAError (code)                  an XA resource's failure, ``javax.transaction.xa``'s
                                        ``XAException`` with the same codes
```

(r) retriable: running the whole transaction again is safe. ``XAError.code`` is the standard
XA code (:data:`XA_CODES` names them); the broker sends them as
``XAException:code=<n>,msg=<text>``, which :func:`xa_error_from_body` parses as MetaQ's
``TransactionContext.EXCEPTION_PAT`` does.

Thread-safe: exception classes, constants and pure functions.
"""

from __future__ import annotations

import re

from pymetaq.client.errors import MetaClientError

# -- XA codes (javax.transaction.xa.XAException / XAResource) -----------------------------------
XA_OK = 0
XA_RDONLY = 3
XA_HEURHAZ = 8
XA_HEURCOM = 7
XA_HEURRB = 6
XA_HEURMIX = 5
XA_RBROLLBACK = 100
XA_RBOTHER = 104
XA_RBTIMEOUT = 106
XAER_RMERR = -3
XAER_NOTA = -4
XAER_INVAL = -5
XAER_PROTO = -6
XAER_RMFAIL = -7
XAER_DUPID = -8

XA_CODES: dict[int, str] = {
    XA_OK: "XA_OK",
    XA_RDONLY: "XA_RDONLY",
    XA_HEURHAZ: "XA_HEURHAZ",
    XA_HEURCOM: "XA_HEURCOM",
    XA_HEURRB: "XA_HEURRB",
    XA_HEURMIX: "XA_HEURMIX",
    XA_RBROLLBACK: "XA_RBROLLBACK",
    XA_RBOTHER: "XA_RBOTHER",
    XA_RBTIMEOUT: "XA_RBTIMEOUT",
    XAER_RMERR: "XAER_RMERR",
    XAER_NOTA: "XAER_NOTA",
    XAER_INVAL: "XAER_INVAL",
    XAER_PROTO: "XAER_PROTO",
    XAER_RMFAIL: "XAER_RMFAIL",
    XAER_DUPID: "XAER_DUPID",
}

# -- XAResource flags -----------------------------------------------------------------------------
TMNOFLAGS = 0
TMENDRSCAN = 0x00800000
TMSTARTRSCAN = 0x01000000
TMSUSPEND = 0x02000000
TMSUCCESS = 0x04000000
TMRESUME = 0x08000000
TMFAIL = 0x20000000
TMONEPHASE = 0x40000000
TMJOIN = 0x00200000


class TransactionError(MetaClientError):
    """Base of every transaction failure."""


class TransactionInProgress(TransactionError):
    """A transaction (local, or an XA branch) is already bound to this context on this producer
    (MetaQ's ``TransactionInProgressException``)."""


class TransactionClosed(TransactionError):
    """The transaction is finished: it cannot take messages or be committed again."""


class CrossBrokerTransaction(TransactionError):
    """A message of a transaction for a partition that is not on the transaction's broker
    (all messages of a transaction go to partitions of one broker, MetaQ's rule)."""


class TransactionRolledBack(TransactionError):
    """The transaction was rolled back instead of committed (a send failed, the broker's
    timeout expired, the connection was lost before COMMIT, a participant voted no): nothing of
    it is stored. ``cause`` is the first failure. Running the whole transaction again is safe."""

    retriable = True

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message + (f": {cause}" if cause is not None else ""))
        self.cause = cause


class TransactionOutcomeUnknown(TransactionError):
    """COMMIT was written but no answer came (timeout, lost connection): the transaction may or
    may not be committed (MetaQ: "the transaction state is unknown, you must check it by
    yourself"). Never retriable blindly: a retry could store the messages twice."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message + (f": {cause}" if cause is not None else ""))
        self.cause = cause


class TwoPhaseUnsupported(TransactionError):
    """The database cannot take part in a two-phase commit."""


class DecisionLogError(TransactionError):
    """The coordinator's decision log cannot be used (in use by another process, corrupt)."""


class HeuristicMixed(TransactionError):
    """An operator decided a prepared branch heuristically, against the coordinator's decision:
    part of the global transaction is committed, part rolled back. Recorded in the decision log
    and forgotten on the broker; needs a person."""

    retriable = False


class XAError(TransactionError):
    """An XA failure with its standard code (``XAException.errorCode``)."""

    def __init__(self, code: int, message: str = "") -> None:
        name = XA_CODES.get(code, str(code))
        super().__init__(f"{name} ({code}): {message}" if message else f"{name} ({code})")
        self.code = code
        self.message = message
        #: XAER_RMFAIL (resource unavailable) and XAER_PROTO (another call in progress) pass
        self.retriable = code in (XAER_RMFAIL, XAER_PROTO)

    @property
    def name(self) -> str:
        return XA_CODES.get(self.code, str(self.code))


_XA_BODY = re.compile(r"code=(-?\d+),msg=(.*)", re.S)


def xa_error_from_body(body: bytes | str) -> XAError:
    """The error of a non-200 reply to an XA command, as MetaQ's Java client builds it: a body
    ``XAException:code=<n>,msg=<text>`` gives that code; any other body is XAER_RMERR."""
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body
    if text.startswith("XAException:"):
        m = _XA_BODY.search(text)
        if m is not None:
            return XAError(int(m.group(1)), m.group(2))
    return XAError(XAER_RMERR, text)
