"""The database participant of a global transaction: a SQLAlchemy connection in PostgreSQL's
two-phase commit (``Connection.begin_twophase`` / ``prepare`` / ``commit_prepared``).

Only PostgreSQL is accepted, with ``max_prepared_transactions > 0``: SQLite has no
``PREPARE TRANSACTION`` at all, and other databases are not tested with this coordinator.
:func:`check_engine` says so at construction, not in the middle of a transaction.

The driver's two traps (reproduced in ``services-notes.md`` §2.6) are designed around:

* **A swallowed statement error makes PREPARE "succeed".** PostgreSQL answers ``PREPARE
  TRANSACTION`` in an aborted transaction with a ROLLBACK tag and no error; nothing is prepared.
  :meth:`SqlBranch.prepare` therefore looks at the session's transaction status first (libpq's,
  through the driver: no round trip) and votes **no** unless the transaction is open and
  healthy; it also votes no if the application committed or rolled back the connection
  inside the block.
* **A failed PREPARE followed by ``rollback()`` rolls back another transaction owning the
  gid** (psycopg marks itself prepared before sending PREPARE; SQLAlchemy's rollback then sends
  ``ROLLBACK PREPARED '<gid>'``). gids here are globally unique (coordinator name + 16 random
  bytes), and a failed prepare **invalidates** the connection instead of rolling it back (the
  server has already aborted that transaction).

Recovery lists the prepared gids of this coordinator (its prefix) in this database
(``recover_twophase`` returns the whole cluster's; ``pg_prepared_xacts.database`` tells them
apart) and commits or rolls them back on a fresh AUTOCOMMIT-style connection
(``commit_prepared(gid, recover=True)``).

Thread-safety: a :class:`SqlBranch` is one global transaction's (one thread); the module
functions are thread-safe (each uses its own connection).
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa

from pymetaq.client.transaction.errors import TransactionRolledBack, TwoPhaseUnsupported

log = logging.getLogger(__name__)

#: libpq's PQtransactionStatus (psycopg 3 ``info.transaction_status``, psycopg2 likewise)
_IDLE, _ACTIVE, _INTRANS, _INERROR = 0, 1, 2, 3
_UNDEFINED_OBJECT = "42704"  # "prepared transaction with identifier ... does not exist"


def check_engine(engine: sa.Engine) -> None:
    """Raise :class:`TwoPhaseUnsupported` unless ``engine`` can prepare transactions."""
    name = engine.dialect.name
    if name == "sqlite":
        raise TwoPhaseUnsupported(
            "SQLite cannot prepare a transaction (it has no PREPARE TRANSACTION or XA), so it "
            "cannot take part in a two-phase commit with the queue: use PostgreSQL with "
            "max_prepared_transactions > 0"
        )
    if name != "postgresql":
        raise TwoPhaseUnsupported(
            f"the coordinator supports PostgreSQL only (PREPARE TRANSACTION); {name!r} is not "
            f"supported"
        )
    with engine.connect() as conn:
        value = conn.exec_driver_sql("SHOW max_prepared_transactions").scalar()
    if not value or int(value) <= 0:
        raise TwoPhaseUnsupported(
            "prepared transactions are disabled on this PostgreSQL server "
            "(max_prepared_transactions = 0): set max_prepared_transactions to at least the "
            "number of concurrent global transactions (postgresql.conf or -c) and restart it"
        )


def _status(conn: sa.Connection) -> int | None:
    """libpq's transaction status of the session (None if the driver does not say)."""
    dbapi = conn.connection.dbapi_connection
    info = getattr(dbapi, "info", None)
    status = getattr(info, "transaction_status", None)
    if status is not None:
        return int(status)
    get = getattr(dbapi, "get_transaction_status", None)  # psycopg2
    return int(get()) if callable(get) else None


def _missing(exc: BaseException) -> bool:
    """True if ``exc`` says the prepared transaction does not exist (any more)."""
    for e in (exc, getattr(exc, "orig", None)):
        if e is not None and getattr(e, "sqlstate", None) == _UNDEFINED_OBJECT:
            return True
    return "does not exist" in str(exc)


class SqlBranch:
    """One global transaction's database branch: ``connection`` in a two-phase transaction
    under the gid ``gid``."""

    def __init__(self, engine: sa.Engine, gid: str) -> None:
        self.gid = gid
        self.connection = engine.connect()
        try:
            self._tx = self.connection.begin_twophase(gid)
        except BaseException:
            self.connection.invalidate()
            self.connection.close()
            raise
        self.prepared = False
        self.finished = False

    def check(self) -> None:
        """:class:`TransactionRolledBack` unless the transaction is open and healthy."""
        conn, tx = self.connection, self._tx
        if not tx.is_active:
            raise TransactionRolledBack(
                "the database transaction was committed or rolled back inside the global "
                "transaction (use the connection, never its commit()/rollback())"
            )
        status = _status(conn)
        if status == _INERROR:
            raise TransactionRolledBack(
                "a statement of the database branch failed (the error was caught); "
                "PostgreSQL would silently roll back instead of preparing"
            )
        if status is not None and status != _INTRANS:
            raise TransactionRolledBack(f"database session not in a transaction (status {status})")

    def prepare(self) -> None:
        """PREPARE TRANSACTION, or :class:`TransactionRolledBack` (this branch votes no)."""
        self.check()
        conn = self.connection
        try:
            self._tx.prepare()
        except Exception as e:
            # never rollback(): it would send ROLLBACK PREPARED '<gid>' (see the module doc)
            conn.invalidate()
            raise TransactionRolledBack("PREPARE TRANSACTION failed", e) from e
        self.prepared = True

    def commit(self) -> None:
        """COMMIT PREPARED (one phase, COMMIT, if not prepared: checked first)."""
        if not self.prepared:
            self.check()
        self._tx.commit()
        self.finished = True

    def rollback(self) -> None:
        """ROLLBACK (or ROLLBACK PREPARED of our own gid); a broken connection is discarded,
        and the server rolls back an unprepared transaction of a closed session by itself."""
        try:
            if self._tx.is_active:
                self._tx.rollback()
            self.finished = True
        except Exception as e:
            log.warning("database rollback of %s failed (recovery finishes it): %s", self.gid, e)
            self.connection.invalidate()

    def close(self) -> None:
        """Release the connection; a prepared branch that is not finished is left prepared
        (the connection is invalidated: ``close()`` would send ROLLBACK PREPARED)."""
        if self.prepared and not self.finished:
            self.connection.invalidate()
            return
        try:
            self.connection.close()
        except Exception as e:
            log.warning("closing the database connection of %s: %s", self.gid, e)


def recover(engine: sa.Engine, prefix: str) -> list[str]:
    """Prepared gids starting with ``prefix`` in the engine's database."""
    with engine.connect() as conn:
        cluster = [str(g) for g in conn.recover_twophase() if str(g).startswith(prefix)]
        if not cluster:
            return []
        here = set(
            conn.exec_driver_sql(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
            ).scalars()
        )
        conn.rollback()
    return [g for g in cluster if g in here]


def finish_prepared(engine: sa.Engine, gid: str, commit: bool) -> bool:
    """COMMIT/ROLLBACK PREPARED ``gid``; False if it does not exist (already finished)."""
    with engine.connect() as conn:
        try:
            if commit:
                conn.commit_prepared(gid, recover=True)
            else:
                conn.rollback_prepared(gid, recover=True)
        except Exception as e:
            if _missing(e):
                conn.invalidate()
                return False
            raise
    return True


__all__: list[Any] = ["SqlBranch", "check_engine", "finish_prepared", "recover"]
