"""The transaction store: held messages, the commit protocol, recovery and checkpoints.

Transactional messages never touch a partition log before commit: :meth:`TxStore.add` journals
each one (the record exactly as it will be appended, its message id already stamped) and keeps
it in memory.  The commit protocol (:meth:`TxStore.commit`):

1. build each partition's records into one buffer; journal a COMMIT record with, per
   partition, the log's current write offset (a lower bound of where the append will land),
   the record count, the byte length and the CRC32 of the buffer; wait until it is durable
   under ``flushTxLogAtCommit``.  From here on the transaction *is* committed: a crash makes
   replay finish it;
2. append each partition's buffer with one ``PartitionLog.append`` (one contiguous write: a
   consumer never sees half a transaction in a partition) and wait until storage calls it
   durable under the topic's policy;
3. journal an APPLIED record with the offsets.

Success is reported (the broker acknowledges the COMMIT) with ``flushTxLogAtCommit=1`` as soon
as step 1's fsync is done and every append is written: the COMMIT record and the PUT records
before it are on disk, so replay re-appends whatever a power loss takes from the partitions
(consumers still see the messages only after the partitions' fsync).  With 0 or 2 the journal
is not fsynced at commit, so success waits for step 2's durability (MetaQ's behaviour).

Journaling the decision *before* the append (MetaQ journals it after) closes a window MetaQ
has: with the append durable and the commit record lost, a prepared XA branch would come back
PREPARED and a coordinator's retry would append it a second time.  Replay
(:mod:`.recovery`) finishes every COMMIT exactly once, rolls back unprepared transactions and
restores prepared XA branches.

Checkpoints (:meth:`checkpoint_begin` on the owner thread, :meth:`CheckpointJob.run` on any
other): every live transaction or open heuristic decision whose first record sits in an older
journal file is journaled again (*relogged*) at the head; the checkpoint is the first record
any of them needs; the partition logs that commits appended to since the last checkpoint are
fsynced, then the journal, then the checkpoint file is written and older journal files are
deleted.  So the journal holds about one file plus what live transactions hold.

Thread-safety: the store is confined to its owner thread (the broker's event loop): every
method except :meth:`CheckpointJob.run` is called there, and completions that start on the
journal's syncer or storage's flusher threads are handed back through ``post`` (the loop's
``call_soon_threadsafe``).  ``done`` callbacks therefore always run on the owner thread.
"""

from __future__ import annotations

import enum
import logging
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pymetaq.storage.disk import Disk, MmapDisk
from pymetaq.storage.errors import StorageError
from pymetaq.storage.txjournal import crashpoint
from pymetaq.storage.txjournal.format import (
    Applied,
    Begin,
    Commit,
    Forget,
    Heuristic,
    Outcome,
    PartIntent,
    Prepare,
    Put,
    Rollback,
    encode,
    encode_puts,
)
from pymetaq.storage.txjournal.journal import JournalConfig, JournalError, JournalPos, TxJournal

log = logging.getLogger(__name__)

PartKey = tuple[str, int]
Post = Callable[[Callable[[], None]], None]
LogResolver = Callable[[str, int], Any]  # (topic, partition) -> PartitionLog (may raise)
Done = Callable[[BaseException | None], None]
CommitDone = Callable[["CommitResult | None", BaseException | None], None]


class HeldState(enum.Enum):
    OPEN = "open"
    PREPARED = "prepared"
    COMMITTING = "committing"  # the COMMIT record is written; appends in progress or pending
    DONE = "done"


class HeldTx:
    """One transaction's held messages and journal bookkeeping."""

    __slots__ = (
        "applied",
        "count",
        "first",
        "intent",
        "key",
        "nbytes",
        "parts",
        "state",
        "tid",
        "xa",
    )

    def __init__(self, tid: int, key: str, xa: bool) -> None:
        self.tid, self.key, self.xa = tid, key, xa
        self.parts: dict[PartKey, list[bytes]] = {}
        self.nbytes = 0
        self.count = 0
        self.first: JournalPos | None = None  # start of its BEGIN record, once journaled
        self.state = HeldState.OPEN
        self.intent: Commit | None = None
        self.applied: dict[PartKey, int] = {}


@dataclass
class HeuristicEntry:
    outcome: Outcome
    time_ms: int
    pos: JournalPos


@dataclass(frozen=True)
class CommitResult:
    """Where each partition's records were appended: ``(topic, partition, offset, count)``."""

    ranges: tuple[tuple[str, int, int, int], ...]


@dataclass
class CheckpointJob:
    """The blocking half of a checkpoint (fsyncs, checkpoint file, deletions)."""

    journal: TxJournal
    position: JournalPos
    next_tid: int
    logs: list[Any] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def run(self) -> None:
        for plog in self.logs:
            if not plog.closed and not plog.failed:
                plog.sync()
        self.journal.force()
        self.journal.write_checkpoint(self.position, self.next_tid)
        self.deleted = self.journal.delete_before(self.position.file)


class _Commit:
    """The in-flight state of one commit (owner thread)."""

    __slots__ = ("acked", "done", "error", "outstanding", "plan", "tx", "written")

    def __init__(
        self, tx: HeldTx, plan: list[tuple[PartKey, Any, bytearray]], done: CommitDone
    ) -> None:
        self.tx, self.plan, self.done = tx, plan, done
        self.outstanding = 0
        self.error: BaseException | None = None
        self.written: dict[PartKey, int] = {}  # handed to storage: offset of the range
        self.acked = False  # ``done`` was told of success

    def result(self, offsets: dict[PartKey, int]) -> CommitResult:
        parts = self.tx.parts
        return CommitResult(
            tuple((t, p, offsets[(t, p)], len(parts[(t, p)])) for (t, p), _, _ in self.plan)
        )


class TxStore:
    """Held transactional messages over a :class:`TxJournal` (see the module docstring)."""

    def __init__(
        self,
        config: JournalConfig,
        logs: LogResolver,
        *,
        ids: Any = None,
        disk: Disk | None = None,
        post: Post | None = None,
    ) -> None:
        self.config = config
        self.journal = TxJournal(config, disk or MmapDisk())
        self.resolve_log = logs
        self.ids_observer: Callable[[int], None] | None = ids.observe if ids is not None else None
        self._post: Post = post or (lambda fn: fn())
        self._live: dict[int, HeldTx] = {}  # journaled, not finished (incl. prepared/committing)
        self.heuristics: dict[str, HeuristicEntry] = {}
        self._touched: dict[int, Any] = {}  # logs appended by commits since the last checkpoint
        self._pending: dict[int, _Commit] = {}  # commits whose appends failed; retried
        self._next_tid = 1
        self.held_bytes = 0
        self.checkpoint_running = False

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> Any:
        """Replay and recover (blocking; storage's flusher must be running).  Returns a
        :class:`~pymetaq.storage.txjournal.recover.TxRecovery` report."""
        from pymetaq.storage.txjournal.recover import recover

        return recover(self)

    def start(self, post: Post | None = None) -> None:
        """Start the journal's syncer; completions go through ``post`` from now on."""
        if post is not None:
            self._post = post
        self.journal.start()

    def close(self) -> None:
        """Checkpoint (so the next start replays little) and close the journal."""
        if not self.journal.failed:
            try:
                job = self.checkpoint_begin()
                if job is not None:
                    job.run()
            except (OSError, StorageError, JournalError) as exc:
                log.warning("final transaction checkpoint failed: %s", exc)
        self.journal.close()

    # -- bookkeeping used by recovery ------------------------------------------------------------
    def restore(self, tx: HeldTx) -> None:
        self._live[tx.tid] = tx
        self.held_bytes += tx.nbytes

    def set_next_tid(self, tid: int) -> None:
        self._next_tid = max(self._next_tid, tid)

    def live(self) -> Iterable[HeldTx]:
        return self._live.values()

    def _write(self, data: bytes) -> tuple[JournalPos, JournalPos]:
        return self.journal.append(data)

    # -- transactions --------------------------------------------------------------------------
    def begin(self, key: str, xa: bool) -> HeldTx:
        """A new transaction (memory only: journaled with its first message)."""
        tx = HeldTx(self._next_tid, key, xa)
        self._next_tid += 1
        return tx

    def add(self, tx: HeldTx, topic: str, partition: int, record: bytes) -> None:
        """Journal and hold one record (20-byte header with its msg id + data)."""
        if tx.state is not HeldState.OPEN:
            raise ValueError(f"transaction {tx.key} is {tx.state.value}")
        put = encode(Put(tx.tid, topic, partition, record))
        if tx.first is None:
            start, _ = self._write(encode(Begin(tx.tid, tx.xa, tx.key)) + put)
            tx.first = start
            self._live[tx.tid] = tx
        else:
            self._write(put)
        tx.parts.setdefault((topic, partition), []).append(record)
        tx.nbytes += len(record)
        tx.count += 1
        self.held_bytes += len(record)

    def add_many(self, tx: HeldTx, topic: str, partition: int, records: list[bytes]) -> None:
        """Journal and hold several records with ONE journal write (a transactional ``bput``):
        the same PUT records :meth:`add` writes one by one, so replay cannot tell them apart."""
        if tx.state is not HeldState.OPEN:
            raise ValueError(f"transaction {tx.key} is {tx.state.value}")
        if not records:
            return
        tid = tx.tid
        data = encode_puts(tid, topic, partition, records)
        if tx.first is None:
            start, _ = self._write(encode(Begin(tid, tx.xa, tx.key)) + data)
            tx.first = start
            self._live[tid] = tx
        else:
            self._write(data)
        tx.parts.setdefault((topic, partition), []).extend(records)
        nbytes = sum(map(len, records))
        tx.nbytes += nbytes
        tx.count += len(records)
        self.held_bytes += nbytes

    def prepare(self, tx: HeldTx, done: Done) -> None:
        """Journal PREPARE; ``done`` once it is durable (raises JournalError if unwritable)."""
        if tx.first is None or tx.state is not HeldState.OPEN:
            raise ValueError(f"cannot prepare {tx.key} in state {tx.state.value}")
        _, end = self._write(encode(Prepare(tx.tid)))
        tx.state = HeldState.PREPARED
        self.journal.sync(end, lambda exc: self._post(lambda: done(exc)))

    def rollback(self, tx: HeldTx, done: Done) -> None:
        """Drop the held messages and journal ROLLBACK (``done`` once durable).

        An unprepared transaction is dropped even if the journal cannot be written (replay
        rolls it back anyway); a prepared one stays PREPARED and the error goes to ``done``.
        """
        if tx.state not in (HeldState.OPEN, HeldState.PREPARED):
            raise ValueError(f"cannot roll back {tx.key} in state {tx.state.value}")
        if tx.first is None:
            tx.state = HeldState.DONE
            self._post(lambda: done(None))
            return
        try:
            _, end = self._write(encode(Rollback(tx.tid)))
        except JournalError as exc:
            if tx.state is HeldState.PREPARED:
                raise
            self._finish(tx)
            log.warning("rollback of %s not journaled (%s); replay rolls it back", tx.key, exc)
            self._post(lambda: done(None))
            return
        self._finish(tx)
        self.journal.sync(end, lambda exc: self._post(lambda: done(exc)))

    def _finish(self, tx: HeldTx) -> None:
        tx.state = HeldState.DONE
        if self._live.pop(tx.tid, None) is not None:
            self.held_bytes -= tx.nbytes
        tx.parts = {}

    def commit(self, tx: HeldTx, done: CommitDone) -> None:
        """Run the commit protocol (module docstring); ``done(result, None)`` once every
        partition append is durable, ``done(None, exc)`` if it cannot finish now (the
        transaction then stays COMMITTING: :meth:`retry_pending` retries the appends and calls
        ``done(result, None)`` when they succeed, or replay finishes it after a restart)."""
        if tx.state not in (HeldState.OPEN, HeldState.PREPARED):
            raise ValueError(f"cannot commit {tx.key} in state {tx.state.value}")
        if not tx.parts:
            self._finish(tx)
            self._post(lambda: done(CommitResult(()), None))
            return
        plan, intents = [], []
        for (topic, partition), recs in tx.parts.items():
            plog = self.resolve_log(topic, partition)  # StorageError propagates: nothing written
            buf = bytearray().join(recs)
            plan.append(((topic, partition), plog, buf))
            crc = zlib.crc32(buf) & 0xFFFFFFFF
            intents.append(
                PartIntent(topic, partition, plog.write_offset, len(recs), len(buf), crc)
            )
        intent = Commit(tx.tid, tx.state is HeldState.PREPARED, tuple(intents))
        _, end = self._write(encode(intent))
        tx.state, tx.intent = HeldState.COMMITTING, intent
        c = _Commit(tx, plan, done)
        self.journal.sync(end, lambda exc: self._post(lambda: self._intent_durable(c, exc)))

    def _intent_durable(self, c: _Commit, exc: BaseException | None) -> None:
        if exc is not None:  # the decision may or may not be on disk: only replay can tell
            self._pending[c.tx.tid] = c
            c.done(None, exc)
            return
        crashpoint.reached("commit-intent")
        self._append_parts(c)

    def _append_parts(self, c: _Commit) -> None:
        todo = [p for p in c.plan if p[0] not in c.written]
        for i, (key, plog, buf) in enumerate(todo):
            if i == 1:
                crashpoint.reached("commit-mid-append")

            def durable(result: Any, exc: BaseException | None, key: PartKey = key) -> None:
                self._post(lambda: self._part_durable(c, key, result, exc))

            c.outstanding += 1
            try:
                c.written[key] = plog.append(buf, stamp_ids=False, on_durable=durable).offset
            except StorageError as exc:
                c.outstanding -= 1
                c.error = exc
                log.error("commit of %s: append to %s failed: %s", c.tx.key, plog.name, exc)
                break
        if self.config.flush_at_commit == 1 and len(c.written) == len(c.plan) and not c.acked:
            # the COMMIT record and every PUT before it are fsynced: the transaction is durable
            # (replay re-appends whatever a power loss takes from the partitions), so the
            # client need not wait for the partitions' fsyncs as well
            c.acked = True
            c.done(c.result(c.written), None)
        self._maybe_done(c)

    def _part_durable(
        self, c: _Commit, key: PartKey, result: Any, exc: BaseException | None
    ) -> None:
        c.outstanding -= 1
        if exc is not None:
            c.error = exc
        else:
            c.tx.applied[key] = result.offset
        self._maybe_done(c)

    def _maybe_done(self, c: _Commit) -> None:
        if c.outstanding:
            return
        tx = c.tx
        if len(tx.applied) < len(c.plan):
            first_failure = tx.tid not in self._pending
            self._pending[tx.tid] = c
            if first_failure and not c.acked:  # the same ``done`` hears of a later success
                c.done(None, c.error or StorageError("append failed"))
            elif c.acked:
                log.error("committed %s waits for its partitions: %s", tx.key, c.error)
            return
        crashpoint.reached("commit-appended")
        offsets = tuple((t, p, tx.applied[(t, p)]) for (t, p), _, _ in c.plan)
        try:
            self._write(encode(Applied(tx.tid, offsets)))
        except JournalError as exc:  # harmless: replay finds the ranges by content
            log.warning("APPLIED record of %s not journaled: %s", tx.key, exc)
        for _, plog, _ in c.plan:
            self._touched[id(plog)] = plog
        result = c.result(tx.applied)
        self._pending.pop(tx.tid, None)
        self._finish(tx)
        if not c.acked:
            c.acked = True
            c.done(result, None)

    def retry_pending(self) -> int:
        """Retry the appends of commits that could not finish (a full disk, say); returns how
        many commits are still pending.  Their clients were already told of the failure."""
        for c in list(self._pending.values()):
            if c.outstanding or self.journal.failed:
                continue
            if any(plog.failed for _, plog, _ in c.plan):
                continue  # a failed log accepts nothing until restart: replay finishes it
            c.error = None
            self._append_parts(c)
        return len(self._pending)

    def pending(self) -> list[HeldTx]:
        return [c.tx for c in self._pending.values()]

    # -- heuristics ----------------------------------------------------------------------------
    def heuristic(self, key: str, outcome: Outcome, done: Done) -> None:
        """Journal an operator's heuristic decision on ``key`` (before it is carried out:
        recovery carries out a decision whose branch is still prepared)."""
        now = int(time.time() * 1000)
        start, end = self._write(encode(Heuristic(outcome, now, key)))
        self.heuristics[key] = HeuristicEntry(outcome, now, start)
        self.journal.sync(end, lambda exc: self._post(lambda: done(exc)))

    def forget(self, key: str, done: Done) -> None:
        """Journal that the heuristic decision on ``key`` is forgotten (no-op if none)."""
        if key not in self.heuristics:
            self._post(lambda: done(None))
            return
        _, end = self._write(encode(Forget(key)))
        del self.heuristics[key]
        self.journal.sync(end, lambda exc: self._post(lambda: done(exc)))

    # -- checkpoints ---------------------------------------------------------------------------
    def checkpoint_begin(self) -> CheckpointJob | None:
        """Relog what older journal files still hold and compute the checkpoint (owner
        thread); run the returned job on another thread, then call :meth:`checkpoint_end`."""
        if self.checkpoint_running or self.journal.failed:
            return None
        current = self.journal.end().file
        try:
            for tx in list(self._live.values()):
                if tx.first is not None and tx.first.file < current:
                    self._relog(tx)
            for key, h in self.heuristics.items():
                if h.pos.file < current:
                    h.pos = self._write(encode(Heuristic(h.outcome, h.time_ms, key)))[0]
        except JournalError as exc:  # nothing is deleted: the next checkpoint tries again
            log.error("transaction checkpoint skipped: %s", exc)
            return None
        firsts = [tx.first for tx in self._live.values() if tx.first is not None]
        firsts += [h.pos for h in self.heuristics.values()]
        position = min([*firsts, self.journal.end()])
        logs, self._touched = list(self._touched.values()), {}
        self.checkpoint_running = True
        return CheckpointJob(self.journal, position, self._next_tid, logs)

    def checkpoint_end(self, job: CheckpointJob, exc: BaseException | None) -> None:
        self.checkpoint_running = False
        if exc is not None:
            for plog in job.logs:  # sync them again next time
                self._touched[id(plog)] = plog
            log.error("transaction checkpoint failed: %s", exc)
        elif job.deleted:
            log.info("transaction checkpoint at %s; deleted %s", job.position, job.deleted)

    def _relog(self, tx: HeldTx) -> None:
        """Journal ``tx`` again at the head: BEGIN resets it on replay, then its state."""
        parts = [encode(Begin(tx.tid, tx.xa, tx.key))]
        for (topic, partition), recs in tx.parts.items():
            parts += [encode(Put(tx.tid, topic, partition, r)) for r in recs]
        if tx.state is HeldState.PREPARED or (tx.intent is not None and tx.intent.was_prepared):
            parts.append(encode(Prepare(tx.tid)))
        if tx.intent is not None:
            parts.append(encode(tx.intent))
        if tx.applied and tx.intent is not None:
            offsets = tuple((t, p, off) for (t, p), off in tx.applied.items())
            parts.append(encode(Applied(tx.tid, offsets)))
        tx.first = self._write(b"".join(parts))[0]
