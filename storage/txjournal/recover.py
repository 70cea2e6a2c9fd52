"""Startup recovery of the transaction store, reported as NATS reports a rebuild.

Sequence (:func:`recover`, called by :meth:`TxStore.open`):

1. replay the journal from the newest checkpoint into :class:`~.rebuild.Rebuild` (a torn tail
   is cut, see :mod:`.journal`);
2. every transaction with a COMMIT record, in the order of those records: each partition's
   range is made present exactly once (:func:`~.rebuild.ensure_applied`), then an APPLIED
   record is journaled;
3. every other transaction: a prepared XA branch with an operator's (heuristic) decision
   journaled gets it carried out now; any other prepared XA branch is restored as PREPARED
   (held again, for its coordinator to finish); anything else is rolled back;
4. open heuristic decisions are restored; the journal is fsynced; a checkpoint is taken (which
   relogs what is still live and deletes older journal files).

The returned :class:`TxRecovery` is logged (WARNING when anything was re-appended or cut) and
asserted by the tests.  A committed transaction whose topic is no longer configured stops the
broker (:class:`TxRecoveryError`): its messages must not be dropped silently.

Thread-safety: runs once at startup on the caller's thread.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pymetaq.storage.errors import StorageError
from pymetaq.storage.record import MSG_ID
from pymetaq.storage.txjournal.format import Applied, Commit, Outcome, PartIntent, Rollback, encode
from pymetaq.storage.txjournal.journal import JournalCorrupt, ReplayReport
from pymetaq.storage.txjournal.rebuild import (
    How,
    Rebuild,
    Recovered,
    append_records,
    ensure_applied,
    torn,
)

if TYPE_CHECKING:
    from pymetaq.storage.txjournal.store import HeldTx, TxStore

log = logging.getLogger(__name__)


class TxRecoveryError(Exception):
    """Committed transactional messages cannot be applied: the broker must not start."""

    retriable = False


@dataclass
class TxRecovery:
    """What recovery found and did."""

    replay: ReplayReport
    committed: dict[str, int] = field(default_factory=lambda: {h.value: 0 for h in How})
    rolled_back: int = 0
    prepared: list[HeldTx] = field(default_factory=list)
    heuristics: int = 0
    heuristics_completed: int = 0
    orphan_records: int = 0

    @property
    def reapplied(self) -> int:
        return self.committed[How.APPENDED.value] + self.committed[How.COMPLETED.value]

    def __str__(self) -> str:
        r = self.replay
        return (
            f"transaction journal {r.directory}: {r.records} records from {len(r.files)} file(s)"
            f" (checkpoint {tuple(r.checkpoint) if r.checkpoint else None}), {r.bytes_cut} bytes"
            f" cut, {len(r.files_dropped)} file(s) dropped; committed partition ranges"
            f" {self.committed}; rolled back {self.rolled_back}; prepared XA branches restored"
            f" {len(self.prepared)}; heuristic decisions {self.heuristics}"
            f" ({self.heuristics_completed} carried out now)"
        )


def recover(store: TxStore) -> TxRecovery:
    from pymetaq.storage.txjournal.store import HeldState, HeldTx, HeuristicEntry

    rb = Rebuild()
    out = TxRecovery(store.journal.replay(rb))
    cp = store.journal.checkpoint
    store.set_next_tid(max(rb.max_tid + 1, cp.next_tid if cp else 1))
    out.orphan_records = rb.orphans
    committed = [tx for tx in rb.txs.values() if tx.intent is not None]
    # journal order, except that a range a crash tore is completed first: its missing records
    # belong right after its present ones, before anything recovery appends for the others
    # (two commits may reach a partition in the other order than their intents reached the
    # journal)
    committed.sort(key=lambda tx: (not _torn(store, tx), tx.intent_pos or tx.first))
    for rtx in committed:
        _apply(store, rtx, out)
    max_id = 0
    for rtx in rb.txs.values():
        if rtx.intent is not None:
            continue
        decision = rb.heuristics.get(rtx.key) if rtx.prepared and rtx.xa else None
        if decision is not None and decision[0].outcome is Outcome.COMMIT:
            _commit_now(store, rtx)  # an operator's commit that a crash interrupted
            out.heuristics_completed += 1
        elif decision is not None:
            store.journal.append(encode(Rollback(rtx.tid)))
            out.heuristics_completed += 1
        elif rtx.prepared and rtx.xa:
            tx = HeldTx(rtx.tid, rtx.key, True)
            tx.parts, tx.first, tx.state = rtx.parts, rtx.first, HeldState.PREPARED
            for recs in rtx.parts.values():
                tx.nbytes += sum(len(r) for r in recs)
                tx.count += len(recs)
                max_id = max([max_id, *(MSG_ID.unpack_from(r, 8)[0] for r in recs)])
            store.restore(tx)
            out.prepared.append(tx)
        else:
            store.journal.append(encode(Rollback(rtx.tid)))
            out.rolled_back += 1
    for key, (h, pos) in rb.heuristics.items():
        store.heuristics[key] = HeuristicEntry(h.outcome, h.time_ms, pos)
    out.heuristics = len(rb.heuristics)
    store.journal.force()
    if store.ids_observer is not None and max_id:
        store.ids_observer(max_id)
    job = store.checkpoint_begin()
    if job is not None:
        job.run()
        store.checkpoint_end(job, None)
    changed = out.reapplied or out.replay.bytes_cut or out.replay.files_dropped
    if out.replay.records or changed:
        log.log(logging.WARNING if changed else logging.INFO, "recovered %s", out)
    else:  # a fresh or idle journal: nothing worth a line at startup
        log.debug("transaction journal %s is empty", out.replay.directory)
    return out


def _commit_now(store: TxStore, rtx: Recovered) -> None:
    """Commit a prepared branch during recovery: decide (journal + fsync), append, APPLIED."""
    plan = []
    for (topic, partition), recs in rtx.parts.items():
        plog = _resolve(store, rtx, topic, partition, len(recs))
        buf = b"".join(recs)
        plan.append(
            (
                plog,
                recs,
                PartIntent(
                    topic, partition, plog.write_offset, len(recs), len(buf), zlib.crc32(buf)
                ),
            )
        )
    store.journal.append(encode(Commit(rtx.tid, True, tuple(p[2] for p in plan))))
    store.journal.force()
    offsets = [(i.topic, i.partition, append_records(plog, recs)) for plog, recs, i in plan]
    store.journal.append(encode(Applied(rtx.tid, tuple(offsets))))
    log.warning("carried out the heuristic commit of %s", rtx.key)


def _torn(store: TxStore, rtx: Recovered) -> bool:
    """Some partition holds only a first part of ``rtx``'s records (see :func:`torn`)."""
    assert rtx.intent is not None
    for part in rtx.intent.parts:
        key = (part.topic, part.partition)
        recs = rtx.parts.get(key)
        if not recs:
            continue
        try:
            plog = store.resolve_log(part.topic, part.partition)
        except StorageError:
            continue  # _apply says why
        if torn(plog, recs, part.lower_bound, rtx.applied.get(key)):
            return True
    return False


def _resolve(store: TxStore, rtx: Recovered, topic: str, partition: int, count: int) -> Any:
    try:
        return store.resolve_log(topic, partition)
    except StorageError as exc:
        raise TxRecoveryError(
            f"committed transaction {rtx.key} holds {count} message(s) for "
            f"{topic}-{partition}, which this broker cannot store: {exc}. "
            f"Configure the topic again (or move {store.config.directory} away) and restart."
        ) from exc


def _apply(store: TxStore, rtx: Recovered, out: TxRecovery) -> None:
    assert rtx.intent is not None
    offsets = []
    for part in rtx.intent.parts:
        key = (part.topic, part.partition)
        recs = rtx.parts.get(key, [])
        buf = b"".join(recs)
        if len(recs) != part.count or len(buf) != part.length or zlib.crc32(buf) != part.crc:
            raise JournalCorrupt(
                f"transaction {rtx.key}: the journal's messages for {part.topic}-{part.partition}"
                f" do not match its COMMIT record ({len(recs)} of {part.count} records)"
            )
        plog = _resolve(store, rtx, part.topic, part.partition, part.count)
        res = ensure_applied(plog, recs, part.lower_bound, rtx.applied.get(key))
        out.committed[res.how.value] += 1
        if res.how in (How.APPENDED, How.COMPLETED):
            log.warning(
                "committed transaction %s: %s %d of %d record(s) to %s at %d",
                rtx.key,
                "appended" if res.how is How.APPENDED else "completed the range by appending",
                part.count - res.kept,
                part.count,
                plog.name,
                res.offset,
            )
        offsets.append((part.topic, part.partition, res.offset))
    store.journal.append(encode(Applied(rtx.tid, tuple(offsets))))
