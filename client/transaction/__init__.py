"""Transactions on the client: local transactions, the XA resource, and a two-phase-commit
coordinator for the queue and PostgreSQL.

```python
from pymetaq.client.transaction import Coordinator, Xid, XA_OK, XA_RDONLY, TransactionRolledBack
```

| module | its one job |
|---|---|
| ``errors`` | the transaction errors (all ``MetaClientError``\\ s), XA codes and flags |
| ``wire`` | the transaction commands as MetaQ's Java client writes them; session ids |
| ``bound`` | binding a transaction to a context (``contextvars``); the ordered put pipe |
| ``local`` | local transactions: ``with producer.transaction():``, the connection pool |
| ``xa`` | ``Xid``, ``XAResource`` / ``AsyncXAResource`` (``producer.xa_resource()``) |
| ``decisionlog`` | the coordinator's fsynced decision log |
| ``sql`` | the database branch (SQLAlchemy two-phase, PostgreSQL only) |
| ``coordinator`` | ``Coordinator``: two-phase commit and presumed-abort recovery |

The producer's faces create transactions (``Producer.transaction()``,
``Producer.xa_resource()``; the glue is ``pymetaq.client.producer.transactional``). Names are
imported lazily (PEP 562): importing this package loads neither SQLAlchemy nor the producer.
See ``docs/transactions.md``.

Thread-safety: see each module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymetaq.client.transaction.coordinator import (
        Coordinator,
        GlobalTransaction,
        RecoveryReport,
    )
    from pymetaq.client.transaction.decisionlog import DecisionLog
    from pymetaq.client.transaction.errors import (
        TMFAIL,
        TMJOIN,
        TMNOFLAGS,
        TMRESUME,
        TMSUCCESS,
        TMSUSPEND,
        XA_OK,
        XA_RDONLY,
        CrossBrokerTransaction,
        DecisionLogError,
        HeuristicMixed,
        TransactionClosed,
        TransactionError,
        TransactionInProgress,
        TransactionOutcomeUnknown,
        TransactionRolledBack,
        TwoPhaseUnsupported,
        XAError,
    )
    from pymetaq.client.transaction.local import AsyncLocalScope, LocalScope
    from pymetaq.client.transaction.xa import AsyncXAResource, XAResource, Xid

_ERRORS = "pymetaq.client.transaction.errors"
_LAZY = {
    "Coordinator": "pymetaq.client.transaction.coordinator",
    "GlobalTransaction": "pymetaq.client.transaction.coordinator",
    "RecoveryReport": "pymetaq.client.transaction.coordinator",
    "DecisionLog": "pymetaq.client.transaction.decisionlog",
    "AsyncLocalScope": "pymetaq.client.transaction.local",
    "LocalScope": "pymetaq.client.transaction.local",
    "AsyncXAResource": "pymetaq.client.transaction.xa",
    "XAResource": "pymetaq.client.transaction.xa",
    "Xid": "pymetaq.client.transaction.xa",
    **{
        n: _ERRORS
        for n in (
            "TMFAIL",
            "TMJOIN",
            "TMNOFLAGS",
            "TMRESUME",
            "TMSUCCESS",
            "TMSUSPEND",
            "XA_OK",
            "XA_RDONLY",
            "CrossBrokerTransaction",
            "DecisionLogError",
            "HeuristicMixed",
            "TransactionClosed",
            "TransactionError",
            "TransactionInProgress",
            "TransactionOutcomeUnknown",
            "TransactionRolledBack",
            "TwoPhaseUnsupported",
            "XAError",
        )
    },
}

__all__ = [
    "TMFAIL",
    "TMJOIN",
    "TMNOFLAGS",
    "TMRESUME",
    "TMSUCCESS",
    "TMSUSPEND",
    "XA_OK",
    "XA_RDONLY",
    "AsyncLocalScope",
    "AsyncXAResource",
    "Coordinator",
    "CrossBrokerTransaction",
    "DecisionLog",
    "DecisionLogError",
    "GlobalTransaction",
    "HeuristicMixed",
    "LocalScope",
    "RecoveryReport",
    "TransactionClosed",
    "TransactionError",
    "TransactionInProgress",
    "TransactionOutcomeUnknown",
    "TransactionRolledBack",
    "TwoPhaseUnsupported",
    "XAError",
    "XAResource",
    "Xid",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pymetaq.client.transaction' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
