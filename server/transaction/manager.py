"""The broker's transaction state machine: local and XA transactions, timeouts, limits.

MetaQ's ``TransactionalCommandProcessor`` + ``LocalTransaction``/``XATransaction``, over the
storage layer's :class:`~pymetaq.storage.txjournal.TxStore` (which journals and holds the
messages and runs the commit protocol).

- **Where transactions live.** A local transaction (``TX:<sessionId>:<n>``) belongs to the
  connection that began it (MetaQ keeps it in the connection's session context): only that
  connection can add to, commit or roll it back, and **closing the connection rolls it back**
  (MetaQ registered no such listener).  An XA branch lives in a broker-wide table: any
  connection may drive it, e.g. a coordinator recovering after a crash.
- **State machine** (:mod:`.xa`): BEGIN creates START; the first message makes IN_USE;
  PREPARE (XA) makes PREPARED, or FINISHED with ``XA_RDONLY`` when there is no work; COMMIT
  and ROLLBACK finish.  Two-phase COMMIT needs PREPARED; one-phase COMMIT of a PREPARED branch
  is allowed (MetaQ); a call in the wrong state, or while another call on the same
  transaction is in progress, is XAER_PROTO; an unknown xid is XAER_NOTA.
- **Timeouts.** BEGIN's timeout, capped at ``maxTxTimeoutInSeconds``; a BEGIN without one gets
  the cap (MetaQ set none: a forgotten transaction held its messages until restart); a cap of
  0 disables timeouts.  An unprepared transaction still open at its deadline is rolled back;
  later calls on it get ``XA_RBTIMEOUT`` (the last ``EXPIRED_MEMORY`` such keys are
  remembered).  Prepared branches never time out: only their coordinator (or an operator)
  may decide them.
- **Limits** (a client cannot make the broker hold more): open transactions per broker
  (``maxTxTimeoutTimerCapacity``, MetaQ's timer capacity), local transactions per connection
  (``maxTxPerConnection``) and bytes of held messages (``maxTxHeldBytes``); beyond them
  BEGIN is refused with XAER_RMERR, a put with a 500, and the broker stays up.
- **Heuristics.** An operator may commit or roll back a PREPARED branch
  (:meth:`TransactionManager.heuristic`); the decision is journaled, RECOVER lists it, the
  coordinator's later COMMIT/ROLLBACK get ``XA_HEURCOM``/``XA_HEURRB``, FORGET removes it.

Thread-safety: confined to the broker's event-loop thread; the store posts its completions
back to it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pymetaq.client.protocol import XidKey, format_tx_key, parse_tx_key
from pymetaq.server.transaction.xa import (
    XA_HEURCOM,
    XA_HEURRB,
    XA_RBTIMEOUT,
    XAER_DUPID,
    XAER_INVAL,
    XAER_NOTA,
    XAER_PROTO,
    XAER_RMERR,
    XAER_RMFAIL,
    TxError,
    TxState,
    XAError,
)
from pymetaq.storage import StorageError
from pymetaq.storage.batch import split_records, stamp_batch
from pymetaq.storage.ids import IdWorker
from pymetaq.storage.record import HEADER
from pymetaq.storage.txjournal import CommitResult, HeldTx, JournalError, Outcome, TxStore

log = logging.getLogger("pymetaq.server.transaction")

EXPIRED_MEMORY = 4096
Reply = Callable[[int, bytes], None]


class Counters(Protocol):
    """The broker's :class:`~pymetaq.server.stats.Stats` (its ``counters`` dict is replaced
    by ``stats reset``, so it is looked up on every use)."""

    counters: dict[str, int]


@dataclass(frozen=True)
class TxLimits:
    max_open: int = 30000  # maxTxTimeoutTimerCapacity
    max_per_connection: int = 256  # maxTxPerConnection
    max_held_bytes: int = 64 << 20  # maxTxHeldBytes
    max_timeout_s: int = 60  # maxTxTimeoutInSeconds (0 = no timeouts)


class Tx:
    """One open transaction as the broker sees it."""

    __slots__ = (
        "busy",
        "created",
        "held",
        "key",
        "owner",
        "qualifier",
        "state",
        "timeout_s",
        "timer",
        "xa",
    )

    def __init__(self, key: str, held: HeldTx, owner: Any, qualifier: str | None) -> None:
        self.key, self.held, self.owner, self.qualifier = key, held, owner, qualifier
        self.xa = qualifier is not None
        self.state = TxState.START
        self.created = time.monotonic()
        self.timeout_s = 0
        self.timer: asyncio.TimerHandle | None = None
        self.busy: str | None = None  # "prepare" | "commit" | "rollback" | "heuristic"


def canonical_key(key: str) -> tuple[str, XidKey | None, bool]:
    """(canonical key, the xid if XA, whether the key is ``null``) for a parser-checked key."""
    parsed = parse_tx_key(key)
    if parsed is None:
        return "null", None, True
    return format_tx_key(parsed), parsed if isinstance(parsed, XidKey) else None, False


class TransactionManager:
    """Every transaction of one broker (see the module docstring)."""

    def __init__(
        self,
        store: TxStore,
        limits: TxLimits,
        loop: asyncio.AbstractEventLoop,
        stats: Counters,
        ids: IdWorker,
    ) -> None:
        self.store, self.limits, self.loop = store, limits, loop
        self.stats = stats
        self._ids = ids
        self._next_id = ids.next_id
        self._xa: dict[str, Tx] = {}
        self._local: dict[Any, dict[str, Tx]] = {}
        self._expired: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.open_count = 0

    def restore(self, prepared: list[HeldTx]) -> None:
        """Prepared XA branches recovered from the journal, back in the XA table."""
        for held in prepared:
            key, xid, _ = canonical_key(held.key)
            tx = Tx(key, held, None, xid.unique_qualifier if xid else "")
            tx.state = TxState.PREPARED
            self._xa[key] = tx
            self.open_count += 1

    # -- lookup --------------------------------------------------------------------------------
    def find(self, owner: Any, key: str, xid: XidKey | None) -> Tx:
        """The transaction ``key`` as seen from connection ``owner``, or the error MetaQ gives."""
        if xid is not None:
            tx = self._xa.get(key)
            if tx is not None:
                return tx
            h = self.store.heuristics.get(key)
            if h is not None:
                done = "committed" if h.outcome is Outcome.COMMIT else "rolled back"
                code = XA_HEURCOM if h.outcome is Outcome.COMMIT else XA_HEURRB
                raise XAError(code, f"XA transaction '{key}' has been heuristically {done}.")
            if key in self._expired:
                raise XAError(XA_RBTIMEOUT, self._expired[key])
            raise XAError(XAER_NOTA, f"XA transaction '{key}' has not been started.")
        tx = self._local.get(owner, {}).get(key)
        if tx is not None:
            return tx
        if key in self._expired:
            raise TxError(self._expired[key])
        raise TxError(f"Local transaction '{key}' has not been started.")

    # -- BEGIN / put -----------------------------------------------------------------------------
    def begin(self, owner: Any, key: str, timeout_s: int | None) -> None:
        key, xid, null = canonical_key(key)
        if null:
            raise XAError(XAER_INVAL, "BEGIN needs a transaction key, not null")
        self.stats.counters["tx_begin"] += 1
        if xid is not None:
            self.stats.counters["tx_xa_begin"] += 1
            if key in self._xa:
                return  # MetaQ: a second BEGIN joins the branch
            if key in self.store.heuristics:
                raise XAError(
                    XAER_DUPID, f"XA transaction '{key}' has a heuristic outcome; FORGET it first"
                )
            table = self._xa
        else:
            table = self._local.setdefault(owner, {})
            if key in table:
                return
            if len(table) >= self.limits.max_per_connection:
                raise XAError(
                    XAER_RMERR,
                    f"too many open transactions on this connection "
                    f"(maxTxPerConnection={self.limits.max_per_connection})",
                )
        if self.open_count >= self.limits.max_open:
            raise XAError(
                XAER_RMERR,
                f"too many open transactions on this broker "
                f"(maxTxTimeoutTimerCapacity={self.limits.max_open})",
            )
        tx = Tx(
            key,
            self.store.begin(key, xid is not None),
            owner,
            xid.unique_qualifier if xid else None,
        )
        table[key] = tx
        self.open_count += 1
        self._expired.pop(key, None)
        self._arm_timeout(tx, timeout_s or 0)

    def for_put(self, owner: Any, key: str) -> Tx:
        """The transaction a put adds to; TxError (plain 500 text, as MetaQ) if it cannot."""
        key, xid, _ = canonical_key(key)
        tx = self.find(owner, key, xid)
        if tx.busy is not None or tx.state not in (TxState.START, TxState.IN_USE):
            state = tx.busy or tx.state.name
            raise TxError(f"Transaction '{key}' is {state}: no more messages can be added to it")
        return tx

    def add(self, tx: Tx, topic: str, partition: int, data: bytes, flag: int, crc: int) -> int:
        """Journal and hold one message; returns its message id (its id once committed)."""
        size = HEADER.size + len(data)
        if self.store.held_bytes + size > self.limits.max_held_bytes:
            raise TxError(
                f"Put message failed: transactions on this broker already hold "
                f"{self.store.held_bytes} bytes (maxTxHeldBytes={self.limits.max_held_bytes})"
            )
        msg_id = self._next_id()
        record = HEADER.pack(len(data), crc, msg_id, flag) + data
        try:
            self.store.add(tx.held, topic, partition, record)
        except JournalError as exc:
            raise TxError(f"Put message failed: transaction log: {exc}") from exc
        tx.state = TxState.IN_USE
        return msg_id

    def add_batch(
        self, tx: Tx, topic: str, partition: int, body: bytearray, max_data: int
    ) -> tuple[int, int]:
        """Journal and hold the records of a transactional ``bput`` (one journal write):
        ``(first id, count)``; the records get consecutive ids.  Raises :class:`InvalidRecords`
        (bad framing, CRC or flag, a record over ``max_data``: nothing is held) or TxError."""
        if self.store.held_bytes + len(body) > self.limits.max_held_bytes:
            raise TxError(
                f"Put message failed: transactions on this broker already hold "
                f"{self.store.held_bytes} bytes (maxTxHeldBytes={self.limits.max_held_bytes})"
            )
        first, count = stamp_batch(self._ids, body, max_data)
        records = split_records(body, count)
        try:
            self.store.add_many(tx.held, topic, partition, records)
        except JournalError as exc:
            raise TxError(f"Put message failed: transaction log: {exc}") from exc
        tx.state = TxState.IN_USE
        return first, count

    # -- PREPARE / COMMIT / ROLLBACK -------------------------------------------------------------
    def prepare(self, owner: Any, key: str, reply: Reply) -> None:
        key, xid, _ = canonical_key(key)
        tx = self.find(owner, key, xid)
        if not tx.xa:
            raise XAError(XAER_RMERR, "Prepare not implemented on Local Transactions.")
        if tx.busy is not None or tx.state not in (TxState.START, TxState.IN_USE):
            raise XAError(XAER_PROTO, "Cannot call prepare now.")
        if tx.held.first is None:  # no work: read-only, finished at once (MetaQ)
            self._finish(tx)
            reply(200, b"3")
            return

        def done(exc: BaseException | None) -> None:
            tx.busy = None
            tx.state = TxState.PREPARED
            if exc is None:
                reply(200, b"0")
            else:
                reply(500, XAError(XAER_RMFAIL, f"prepare not durable: {exc}").body())

        tx.busy = "prepare"
        try:
            self.store.prepare(tx.held, done)
        except JournalError as exc:
            tx.busy = None
            raise XAError(XAER_RMFAIL, f"prepare failed: transaction log: {exc}") from exc
        self._cancel_timeout(tx)

    def commit(self, owner: Any, key: str, one_phase: bool, reply: Reply) -> None:
        self.stats.counters["tx_commit"] += 1
        key, xid, _ = canonical_key(key)
        tx = self.find(owner, key, xid)
        if tx.busy is not None:
            raise XAError(XAER_PROTO, "Cannot call commit now.")
        if tx.xa and tx.state is not TxState.PREPARED and not one_phase:
            raise XAError(
                XAER_PROTO, "Cannot do 2 phase commit if the transaction has not been prepared."
            )
        if tx.state not in (TxState.START, TxState.IN_USE, TxState.PREPARED):
            raise XAError(XAER_PROTO, "Cannot call commit now.")
        self._commit(tx, reply)

    def _commit(self, tx: Tx, reply: Reply) -> None:
        answered = False

        def done(result: CommitResult | None, exc: BaseException | None) -> None:
            nonlocal answered
            if result is not None:
                self.stats.counters["total_messages"] += sum(r[3] for r in result.ranges)
                self._finish(tx)
            if answered:
                return  # a retried append finished later: the client heard of the failure
            answered = True
            if exc is None:
                reply(200, b"")
            else:
                reply(500, XAError(XAER_RMFAIL, _pending_text(tx.key, exc)).body())

        tx.busy = "commit"
        try:
            self.store.commit(tx.held, done)
        except (JournalError, StorageError) as exc:
            tx.busy = None
            raise XAError(
                XAER_RMFAIL, f"Commit failed; the transaction is still open: {exc}"
            ) from exc
        self._cancel_timeout(tx)

    def rollback(self, owner: Any, key: str, reply: Reply) -> None:
        self.stats.counters["tx_rollback"] += 1
        key, xid, _ = canonical_key(key)
        tx = self.find(owner, key, xid)
        if tx.busy is not None or tx.state not in (TxState.START, TxState.IN_USE, TxState.PREPARED):
            raise XAError(XAER_PROTO, "Cannot call rollback now.")
        self._rollback(tx, reply)

    def _rollback(self, tx: Tx, reply: Reply) -> None:
        def done(exc: BaseException | None) -> None:
            if exc is None:
                self._finish(tx)
                reply(200, b"")
            else:
                tx.busy = None
                reply(500, XAError(XAER_RMFAIL, f"rollback not durable: {exc}").body())

        tx.busy = "rollback"
        try:
            self.store.rollback(tx.held, done)
        except JournalError as exc:
            tx.busy = None
            raise XAError(XAER_RMFAIL, f"rollback failed: transaction log: {exc}") from exc
        self._cancel_timeout(tx)

    # -- FORGET / RECOVER / heuristics -----------------------------------------------------------
    def forget(self, key: str, reply: Reply) -> None:
        key, xid, _ = canonical_key(key)
        if xid is None:
            raise XAError(XAER_NOTA, f"{key} is not a valid xid")
        try:
            self.store.forget(key, lambda exc: _answer(reply, exc, "forget"))
        except JournalError as exc:
            raise XAError(XAER_RMFAIL, f"forget failed: transaction log: {exc}") from exc

    def recover(self, qualifier: str | None) -> list[str]:
        """Prepared branches and heuristic decisions whose qualifier matches (all if None)."""
        keys = [
            k
            for k, tx in self._xa.items()
            if tx.state is TxState.PREPARED
            and tx.busy is None
            and qualifier in (None, tx.qualifier)
        ]
        for k in self.store.heuristics:
            xid = parse_tx_key(k)
            if isinstance(xid, XidKey) and qualifier in (None, xid.unique_qualifier):
                keys.append(k)
        return keys

    def heuristic(self, key: str, outcome: Outcome, reply: Reply) -> None:
        """An operator's decision on a PREPARED branch: journal it (fsynced), then carry it
        out; a crash in between makes recovery carry it out."""
        key, xid, _ = canonical_key(key)
        if xid is None:
            raise XAError(XAER_NOTA, f"{key} is not an XA transaction key")
        tx = self.find(None, key, xid)
        if tx.busy is not None or tx.state is not TxState.PREPARED:
            raise XAError(
                XAER_PROTO,
                f"XA transaction '{key}' is {tx.busy or tx.state.name}: only a PREPARED branch "
                f"can be decided heuristically",
            )

        def decided(exc: BaseException | None) -> None:
            tx.busy = None
            if exc is not None:
                reply(500, XAError(XAER_RMFAIL, f"decision not durable: {exc}").body())
                return
            try:
                if outcome is Outcome.COMMIT:
                    self._commit(tx, reply)
                else:
                    self._rollback(tx, reply)
            except TxError as err:
                reply(500, err.body())

        try:
            self.store.heuristic(key, outcome, decided)
        except JournalError as exc:
            raise XAError(XAER_RMFAIL, f"decision not journaled: {exc}") from exc
        tx.busy = "heuristic"

    # -- timeouts, disconnects, bookkeeping ------------------------------------------------------
    def _arm_timeout(self, tx: Tx, requested: int) -> None:
        cap = self.limits.max_timeout_s
        if cap <= 0:
            return
        tx.timeout_s = min(requested, cap) if requested > 0 else cap
        tx.timer = self.loop.call_later(tx.timeout_s, self._expire, tx)

    @staticmethod
    def _cancel_timeout(tx: Tx) -> None:
        if tx.timer is not None:
            tx.timer.cancel()
            tx.timer = None

    def _expire(self, tx: Tx) -> None:
        tx.timer = None
        if tx.busy is not None or tx.state not in (TxState.START, TxState.IN_USE):
            return
        kind = "XA" if tx.xa else "Local"
        message = (
            f"{kind} transaction '{tx.key}' was rolled back: it timed out after {tx.timeout_s} s"
        )
        log.warning("%s", message)
        self._expired[tx.key] = message
        while len(self._expired) > EXPIRED_MEMORY:
            self._expired.popitem(last=False)
        self._rollback(tx, _ignore)
        self._detach(tx)  # from now on the key answers with the timeout message

    def connection_closed(self, owner: Any) -> None:
        """Roll back the local transactions of a closed connection."""
        for tx in list(self._local.get(owner, {}).values()):
            if tx.busy is None and tx.state in (TxState.START, TxState.IN_USE):
                log.info("rolling back local transaction %s: its connection closed", tx.key)
                self._rollback(tx, _ignore)
        table = self._local.get(owner)
        if table is not None and not table:
            del self._local[owner]

    def _finish(self, tx: Tx) -> None:
        if tx.state is TxState.FINISHED:
            return
        tx.state = TxState.FINISHED
        tx.busy = None
        self._cancel_timeout(tx)
        self._detach(tx)

    def _detach(self, tx: Tx) -> None:
        """Take ``tx`` out of its table (once): it no longer counts or answers by its key."""
        table = self._xa if tx.xa else self._local.get(tx.owner)
        if table is not None and table.get(tx.key) is tx:
            del table[tx.key]
            if not tx.xa and not table:
                self._local.pop(tx.owner, None)
            self.open_count -= 1

    def transactions(self) -> list[Tx]:
        """Every open transaction (XA first), for stats and the CLI."""
        out = list(self._xa.values())
        for table in self._local.values():
            out += table.values()
        return out


def _pending_text(key: str, exc: BaseException) -> str:
    return (
        f"Transaction '{key}' is committed in the transaction log but its messages could not be "
        f"stored yet ({exc}); the broker retries, and finishes it at its next start"
    )


def _answer(reply: Reply, exc: BaseException | None, what: str) -> None:
    if exc is None:
        reply(200, b"")
    else:
        reply(500, XAError(XAER_RMFAIL, f"{what} not durable: {exc}").body())


def _ignore(_code: int, _body: bytes) -> None:
    pass
