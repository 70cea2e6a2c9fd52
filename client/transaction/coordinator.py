"""A two-phase-commit coordinator for the queue and a PostgreSQL database (what MetaQ left to
Java's JTA), with a durable decision log and presumed-abort recovery.

```python
coordinator = Coordinator("orders-1", "/var/lib/orders/decisions.log", producer, engine)
with coordinator.transaction() as gtx:          # one global transaction
    gtx.connection.execute(orders.insert().values(id=42))
    producer.send("orders", b"order 42 created")    # joins the broker branch
# committed in both, or in neither
```

**One global transaction** (gtrid = 16 random bytes) has two branches: the broker's (XA
``XID:5066065:<gtrid hex>:01:<name>``, on a broker the XA resource picks) and the database's
(``PREPARE TRANSACTION 'pmq-<name>-<gtrid hex>'``). On normal exit of the block:

1. ``end`` the broker branch (waits for its messages; a message not taken votes no);
2. ``prepare`` the broker branch — ``XA_RDONLY`` (no message) finishes it, and the database is
   then committed in one phase with no decision needed;
3. ``prepare`` the database branch (see :mod:`.sql` for the checks that make a silent
   non-prepare impossible);
4. write the **commit decision** to the :class:`DecisionLog` and fsync it — the commit point;
5. commit the broker branch (``COMMIT_TWO_PHASE``), then the database (``COMMIT PREPARED``);
6. write "done" (no fsync).

Any failure before 4 rolls both branches back and raises :class:`TransactionRolledBack`; an
exception in the block rolls back and propagates. A failure in 5 cannot undo the decision:
the block returns normally, the branch stays in :attr:`Coordinator.pending` and
:meth:`Coordinator.recover` finishes it (call it periodically; it also runs at start).

**Recovery (presumed abort).** Every decided-but-not-done transaction of the log is committed
in both resources: the broker's ``XAER_NOTA`` means already committed (the broker forgets
finished branches), a database gid that no longer exists likewise; ``XAER_PROTO`` (a call in
progress) and ``XAER_RMFAIL`` (the broker journaled the outcome but has not applied it, or
cannot be reached) are retried by the next recovery. Every other prepared branch of this
coordinator — on any broker (``recover``, filtered by the qualifier = the coordinator's name)
or in the database (``recover_twophase``, filtered by the gid prefix and the database) — has
no commit decision and is rolled back. Branches of transactions running in this process are
skipped. An operator's heuristic decision (``XA_HEURCOM``/``XA_HEURRB``) is recorded in the
log, the branch is forgotten (``FORGET``), and one that contradicts the decision raises or
reports :class:`HeuristicMixed`.

The coordinator's **name** must be unique among coordinators sharing a broker or a database
cluster and stable across restarts: it is the XA qualifier and the gid prefix, so recovery
touches only its own branches. One process per decision log (the log is locked).

``on_step(name)`` (tests) is called after each step: ``started``, ``ended``, ``mq-prepared``,
``db-prepared``, ``decided``, ``mq-committed``, ``db-committed``, ``done``.

Thread-safety: a coordinator may run global transactions on many threads at once (each
thread's transaction is bound to it); ``recover`` may run alongside them.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlalchemy as sa

from pymetaq.client.errors import MetaClientError
from pymetaq.client.transaction import sql
from pymetaq.client.transaction.decisionlog import DecisionLog
from pymetaq.client.transaction.errors import (
    TMFAIL,
    TMSUCCESS,
    XA_HEURCOM,
    XA_HEURRB,
    XA_RDONLY,
    XAER_NOTA,
    HeuristicMixed,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
    XAError,
)
from pymetaq.client.transaction.xa import XAResource, Xid

log = logging.getLogger(__name__)

FORMAT_ID = 0x504D51  # "PMQ"
BQUAL = b"\x01"
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


class XAProducer(Protocol):
    def xa_resource(
        self,
        unique_qualifier: str | None = None,
        *,
        topics: list[str] | None = None,
        request_timeout_s: float = 5.0,
    ) -> XAResource: ...


@dataclass
class GlobalTransaction:
    """One global transaction: ``connection`` is the database branch (use it for SQL; never
    call its ``commit``/``rollback``), messages sent by the same thread join the broker branch."""

    gtrid: str
    xid: Xid
    gid: str
    connection: sa.Connection
    broker_id: int
    outcome: str = "open"  # committed | rolled back | committed (pending: <branch>)


@dataclass
class RecoveryReport:
    committed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    heuristic: list[str] = field(default_factory=list)
    pending: dict[str, str] = field(default_factory=dict)  # gtrid/branch -> why still open

    @property
    def complete(self) -> bool:
        return not self.pending


class Coordinator:
    """Two-phase commit of the queue and one PostgreSQL database (see the module docstring)."""

    def __init__(
        self,
        name: str,
        log_path: str | os.PathLike[str],
        producer: XAProducer,
        engine: sa.Engine,
        *,
        timeout_s: int = 60,
        topics: list[str] | None = None,
        recover: bool = True,
        on_step: Callable[[str], object] | None = None,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"coordinator name {name!r}: 1-64 of A-Z a-z 0-9 . _ -")
        sql.check_engine(engine)
        self.name, self.engine, self.producer = name, engine, producer
        self.timeout_s = timeout_s
        self.topics = topics
        self.prefix = f"pmq-{name}-"
        self._step = on_step or (lambda _s: None)
        self._active: set[str] = set()
        self._lock = threading.Lock()
        self.log = DecisionLog(log_path, name)
        self.log.open()
        self.last_recovery: RecoveryReport | None = None
        try:
            if recover:
                self.recover()
        except BaseException:
            self.log.close()
            raise

    def _resource(self) -> XAResource:
        xa = self.producer.xa_resource(self.name, topics=self.topics)
        xa.set_transaction_timeout(self.timeout_s)
        return xa

    @property
    def pending(self) -> dict[str, int]:
        """Decided transactions not yet committed everywhere (gtrid hex -> broker id)."""
        return self.log.pending()

    # -- one global transaction ---------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[GlobalTransaction]:
        gtrid = os.urandom(16)
        xid = Xid(FORMAT_ID, gtrid, BQUAL)
        xa = self._resource()
        g = gtrid.hex()
        with self._lock:
            self._active.add(g)
        try:
            db = sql.SqlBranch(self.engine, self.prefix + g)
            try:
                xa.start(xid)
            except BaseException:
                db.rollback()
                db.close()
                raise
            gtx = GlobalTransaction(g, xid, db.gid, db.connection, xa.broker_id)
            try:
                self._step("started")
                try:
                    yield gtx
                except BaseException:
                    self._abort(xa, db, xid, ended=False)
                    gtx.outcome = "rolled back"
                    raise
                self._complete(xa, db, gtx)
            finally:
                db.close()
        finally:
            with self._lock:
                self._active.discard(g)

    def _complete(self, xa: XAResource, db: sql.SqlBranch, gtx: GlobalTransaction) -> None:
        xid = gtx.xid
        try:
            xa.end(xid, TMSUCCESS)
            self._step("ended")
            vote = xa.prepare(xid)
            self._step("mq-prepared")
            if vote == XA_RDONLY:  # no message: the database alone, one phase
                db.commit()
                gtx.outcome = "committed"
                return
            db.prepare()
            self._step("db-prepared")
        except (MetaClientError, sa.exc.SQLAlchemyError) as e:
            self._abort(xa, db, xid, ended=True)
            gtx.outcome = "rolled back"
            if isinstance(e, TransactionRolledBack):
                raise
            raise TransactionRolledBack(f"global transaction {gtx.gtrid} rolled back", e) from e
        try:
            self.log.decide_commit(gtx.gtrid, gtx.broker_id)
        except OSError as e:  # on disk or not: recover() decides by what the log holds
            gtx.outcome = "unknown"
            raise TransactionOutcomeUnknown(
                f"writing the commit decision of {gtx.gtrid} failed; both branches stay "
                f"prepared until recover() decides by what reached the log",
                e,
            ) from e
        self._step("decided")
        gtx.outcome = "committed"
        self._commit_branches(xa, db, gtx)

    def _commit_branches(self, xa: XAResource, db: sql.SqlBranch, gtx: GlobalTransaction) -> None:
        open_branches = []
        try:
            self._commit_mq(xa, gtx.xid, gtx.gtrid)
            self._step("mq-committed")
        except HeuristicMixed:
            db_done = self._finish_db_quietly(db)
            if db_done:
                self.log.done(gtx.gtrid)
            raise
        except XAError as e:
            open_branches.append(f"broker: {e}")
        try:
            db.commit()
            self._step("db-committed")
        except sa.exc.SQLAlchemyError as e:
            open_branches.append(f"database: {e}")
        if open_branches:
            gtx.outcome = "committed (pending: " + "; ".join(open_branches) + ")"
            log.warning(
                "global transaction %s is committed; %s - recover() finishes it",
                gtx.gtrid,
                "; ".join(open_branches),
            )
            return
        self.log.done(gtx.gtrid)
        self._step("done")

    def _finish_db_quietly(self, db: sql.SqlBranch) -> bool:
        try:
            db.commit()
            return True
        except sa.exc.SQLAlchemyError as e:
            log.warning("database commit of %s failed (recovery retries): %s", db.gid, e)
            return False

    def _commit_mq(self, xa: XAResource, xid: Xid, gtrid: str) -> None:
        """COMMIT_TWO_PHASE until the branch is known committed. Raises XAError for a branch
        still to finish, HeuristicMixed if an operator rolled it back."""
        try:
            xa.commit(xid, one_phase=False)
        except XAError as e:
            if e.code == XAER_NOTA:
                return  # finished before (the broker forgets finished branches)
            if e.code == XA_HEURCOM:
                self._heuristic(xa, xid, gtrid, "commit")
                return
            if e.code == XA_HEURRB:
                self._heuristic(xa, xid, gtrid, "rollback")
                raise HeuristicMixed(
                    f"global transaction {gtrid} was decided COMMIT, but an operator rolled back "
                    f"its broker branch {xid.key(self.name)}: the database part is committed, the "
                    f"messages are not"
                ) from e
            raise

    def _heuristic(self, xa: XAResource, xid: Xid, gtrid: str, outcome: str) -> None:
        self.log.heuristic(gtrid, "broker", outcome)
        log.warning("broker branch of %s was heuristically %sed by an operator", gtrid, outcome)
        try:
            xa.forget(xid)
        except XAError as e:
            log.warning("FORGET of %s failed (the next recovery retries): %s", gtrid, e)

    def _abort(self, xa: XAResource, db: sql.SqlBranch, xid: Xid, *, ended: bool) -> None:
        """Roll both branches back (best effort: what cannot be reached now is rolled back by
        the broker's timeout/restart, the database's session end, or recovery)."""
        if not ended:
            try:
                xa.end(xid, TMFAIL)
            except XAError as e:
                log.info("end(TMFAIL) of %s: %s", xid, e)
        try:
            xa.rollback(xid)
        except XAError as e:
            if e.code != XAER_NOTA:
                log.warning("broker rollback of %s failed (recovery finishes it): %s", xid, e)
        db.rollback()

    # -- recovery -----------------------------------------------------------------------------
    def recover(self) -> RecoveryReport:
        """Finish every in-doubt branch of this coordinator (see the module docstring)."""
        report = RecoveryReport()
        xa = self.producer.xa_resource(self.name, topics=[])
        in_mq = {x.gtrid.hex(): x for x in xa.recover() if _ours(x)}
        for broker_id, why in xa.last_recover_failures.items():
            report.pending[f"broker {broker_id}"] = f"recover failed: {why}"
        in_db = {g[len(self.prefix) :] for g in sql.recover(self.engine, self.prefix)}
        # after the listings: a branch listed above belongs to a transaction that is still
        # running now, or that finished, and then a commit decision of it is in the log
        with self._lock:
            active = set(self._active)
            decided = {g: b for g, b in self.log.pending().items() if g not in active}
        for g, broker_id in decided.items():
            self._recover_commit(xa, g, broker_id, g in in_db, report)
        for g, xid in in_mq.items():
            if g not in decided and g not in active:
                self._recover_rollback(xa, xid, g, report)
        for g in in_db:
            if g not in decided and g not in active:
                sql.finish_prepared(self.engine, self.prefix + g, commit=False)
                _add(report.rolled_back, g)
        self.log.compact()
        self.last_recovery = report
        if report.committed or report.rolled_back or report.pending:
            log.info(
                "coordinator %s recovery: committed %d, rolled back %d, heuristic %d, pending %s",
                self.name,
                len(report.committed),
                len(report.rolled_back),
                len(report.heuristic),
                report.pending or "none",
            )
        return report

    def _recover_commit(
        self, xa: XAResource, g: str, broker_id: int, db_prepared: bool, report: RecoveryReport
    ) -> None:
        xid = Xid(FORMAT_ID, bytes.fromhex(g), BQUAL)
        xa.locate(xid, broker_id)  # the branch lives where it was started
        why = []
        try:
            self._commit_mq(xa, xid, g)
        except HeuristicMixed as e:
            _add(report.heuristic, g)
            log.error("%s", e)
        except XAError as e:
            why.append(f"broker {broker_id}: {e}")
        try:
            if db_prepared:
                sql.finish_prepared(self.engine, self.prefix + g, commit=True)
        except sa.exc.SQLAlchemyError as e:
            why.append(f"database: {e}")
        if why:
            report.pending[g] = "; ".join(why)
            return
        self.log.done(g)
        _add(report.committed, g)

    def _recover_rollback(self, xa: XAResource, xid: Xid, g: str, report: RecoveryReport) -> None:
        try:
            xa.rollback(xid)
            _add(report.rolled_back, g)
        except XAError as e:
            if e.code == XAER_NOTA:
                return
            if e.code in (XA_HEURCOM, XA_HEURRB):
                outcome = "commit" if e.code == XA_HEURCOM else "rollback"
                self._heuristic(xa, xid, g, outcome)
                _add(report.heuristic, g)
                if e.code == XA_HEURCOM:
                    log.error(
                        "global transaction %s was never decided (presumed abort), but an "
                        "operator committed its broker branch: the messages are stored, the "
                        "database part is rolled back",
                        g,
                    )
                return
            report.pending[g] = f"broker rollback: {e}"

    def close(self) -> None:
        self.log.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ours(xid: Xid) -> bool:
    return xid.format_id == FORMAT_ID and xid.bqual == BQUAL and len(xid.gtrid) == 16


def _add(items: list[str], g: str) -> None:
    if g not in items:
        items.append(g)


__all__: list[Any] = ["Coordinator", "GlobalTransaction", "RecoveryReport"]
