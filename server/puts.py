"""The write path: single puts coalesced into one append per log, batch puts, durable acks.

Single ``put`` commands that arrive in the same event-loop iteration (a pipelining client, or
several clients) for the same partition are concatenated and written with **one**
``PartitionLog.append``; the append's consecutive ids and the records' sizes give every put
its own ``"<msgId> <partition> <offset>"``.  A ``bput`` body is appended as it is, after any
coalesced puts of that log were written, so one connection's writes keep their order.  A
gregor slave's ``sync`` records are coalesced the same way (one append per log and loop
iteration, the master's ids kept); a ``bsync`` body is appended as it is, after that log's
queued syncs.  Every
append passes ``max_record_size = maxTransferSize - 20``: storage rejects (400, nothing
stored) a batch holding a record that no ``get`` could ever return.

Acknowledgement: storage calls ``on_durable`` once the append is durable under the topic's
policy; the completion is queued and every waiting put gets its reply, each connection's
replies written at once (one ``transport.write`` per connection).  Nothing is acknowledged
before ``on_durable``.  Appends are made with ``defer_flush``: one loop iteration later the
loop fsyncs each log it appended to **inline** when that is cheap (``sync_inline``: at most
``INLINE_SYNC_BYTES`` unsynced, no roll pending, no other sync running, and the last inline
fsync was fast), then answers at once; otherwise it hands the log to the flusher thread, whose
``on_durable`` queues the completion and wakes the loop once per burst
(``call_soon_threadsafe``: one wake-up per fsync, however many appends it covered).  The
inline path saves the loop -> flusher -> loop handoffs (about 100 us per round trip here).
In threshold mode nothing waits for that fsync but the readers (they see data once it is
fsynced): while inline fsyncs are backed off, a small append there is still handed to the
flusher one iteration later, so consumers do not wait for N/2 acked messages or
``unflushInterval`` (``e2e_latency`` p99 at 10k msgs/s: 8.5-12.5 ms instead of 54-981 ms).

Thread-safety: everything runs on the event-loop thread except ``on_durable`` closures from
the flusher, which only append to a deque and wake the loop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from pymetaq.server.connection import result_frame
from pymetaq.server.errors import describe_os_error
from pymetaq.server.idempotence import IdemBatch, Idempotence, SequenceConflict
from pymetaq.server.stats import Stats
from pymetaq.storage import AppendResult, InvalidRecords, PartitionLog, StorageError
from pymetaq.storage.record import HEADER, HEADER_SIZE

if TYPE_CHECKING:
    from pymetaq.server.connection import Connection

log = logging.getLogger("pymetaq.server")

#: a coalesced append is written at once when it reaches this many bytes
COALESCE_LIMIT = 512 * 1024
#: an fsync of at most this many unsynced bytes may run inline on the loop
INLINE_SYNC_BYTES = 64 * 1024
#: an inline fsync slower than this sends the next ones to the flusher for INLINE_BACKOFF_S
INLINE_SLOW_S = 0.001
INLINE_BACKOFF_S = 0.1
_FIRST_ID = struct.Struct(">q")


class PutWaiter(NamedTuple):
    """One ``put`` in a coalesced append: its reply carries its own id and offset."""

    conn: Connection
    opaque: int
    size: int  # the record's bytes (header + data): the next put's offset is this far on


class SyncWaiter(NamedTuple):
    """One ``sync`` (a gregor slave): its reply carries the master's id and the offset."""

    conn: Connection
    opaque: int
    size: int
    msg_id: int


class BatchWaiter(NamedTuple):
    """A whole ``bput`` or ``bsync``: one reply carrying the first id and the count."""

    conn: Connection
    opaque: int
    msg_id: int = 0  # a bsync's first record's id (the master's); 0: the id storage stamped
    idem: IdemBatch | None = None  # an idempotent bput (its producer's memory)


Waiters = list[PutWaiter] | list[SyncWaiter] | BatchWaiter


class Completion(NamedTuple):
    """An append storage reported durable (or failed), waiting for the loop to answer it."""

    plog: PartitionLog
    stat: bool
    waiters: Waiters
    result: AppendResult
    exc: BaseException | None


def _conns(waiters: Waiters) -> list[Connection]:
    return [waiters.conn] if isinstance(waiters, BatchWaiter) else [w.conn for w in waiters]


class _Pending:
    __slots__ = ("nbytes", "parts", "plog", "stat", "waiters")

    def __init__(self, plog: PartitionLog, stat: bool) -> None:
        self.plog = plog
        self.stat = stat
        self.parts: list[bytes] = []
        self.waiters: list[PutWaiter] = []
        self.nbytes = 0


class Appender:
    """Owns every append the broker makes and the replies that acknowledge them."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        stats: Stats,
        max_record_size: int | None = None,
        *,
        producers_sync: str = "auto",
    ) -> None:
        self.loop = loop
        self.stats = stats
        #: largest record data storage accepts (``maxTransferSize - 20``: every stored record
        #: must fit one ``get`` reply)
        self.max_record_size = max_record_size
        self._loop_thread = threading.get_ident()
        self._pending: dict[int, _Pending] = {}
        self._flush_scheduled = False
        self._done: collections.deque[Completion] = collections.deque()
        self._wake_pending = False
        self._syncing = False  # in _sync_appended, which drains the completions itself
        #: logs appended with ``defer_flush`` this iteration (synced by ``_sync_appended``)
        self._to_sync: dict[int, PartitionLog] = {}
        self._inline_after = 0.0  # monotonic time before which no inline fsync is tried
        #: a samsa master's link to its slave (pymetaq.ha.sync.SyncLink): a put is acked
        #: only when the slave confirms it too
        self.replicator: Any = None
        #: a gregor slave's ``sync`` records waiting for this iteration's append, per log
        self._synced: dict[int, tuple[PartitionLog, bool, bytearray, list[SyncWaiter]]] = {}
        #: idempotent producers' memory per partition (``bput`` with a producer id)
        self.idempotence = Idempotence(producers_sync)

    # -- intake -------------------------------------------------------------------------------
    def put(
        self,
        conn: Connection,
        plog: PartitionLog,
        stat: bool,
        data: bytes,
        flag: int,
        crc: int,
        opaque: int,
    ) -> None:
        """Queue one put's record (header built here, id stamped by storage)."""
        conn.request_started()
        pending = self._pending.get(id(plog))
        if pending is None:
            pending = self._pending[id(plog)] = _Pending(plog, stat)
        pending.parts.append(HEADER.pack(len(data), crc, 0, flag))
        pending.parts.append(data)
        size = HEADER_SIZE + len(data)
        pending.waiters.append(PutWaiter(conn, opaque, size))
        pending.nbytes += size
        if pending.nbytes >= COALESCE_LIMIT:
            self.flush_log(plog)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush_all)

    def batch(
        self,
        conn: Connection,
        plog: PartitionLog,
        stat: bool,
        body: bytearray,
        opaque: int,
        producer: tuple[str, int] | None = None,
    ) -> None:
        """Append a validated ``bput`` body as one unit; ``producer`` = (id, sequence) of an
        idempotent one (see :mod:`pymetaq.server.idempotence`)."""
        self.flush_log(plog)
        conn.request_started()
        if producer is None:
            self._append(plog, stat, body, BatchWaiter(conn, opaque))
            return
        pid, seq = producer
        try:
            producers = self.idempotence.producers(plog)
            dup = producers.check(pid, seq)
        except SequenceConflict as exc:
            self.stats.counters["put_conflict"] += 1
            self._fail(BatchWaiter(conn, opaque), 409, str(exc))
            return
        except OSError as exc:  # producers.idem could not be read
            reason = describe_os_error(exc)
            log.error("%s: producers file: %s", plog.name, reason)
            self._fail(BatchWaiter(conn, opaque), 500, f"Put message failed: {reason}")
            return
        if dup is None:
            self._append(
                plog, stat, body, BatchWaiter(conn, opaque, idem=IdemBatch(producers, pid, seq))
            )
            return
        self.stats.counters["put_duplicate"] += 1
        if dup.waiters is not None:  # the original is not durable yet: answer with it
            dup.waiters.append((conn, opaque))
            return
        conn.request_done()
        conn.reply(result_frame(200, dup.body(plog.partition), opaque))

    def synced(
        self,
        conn: Connection,
        plog: PartitionLog,
        stat: bool,
        record: bytes,
        msg_id: int,
        opaque: int,
    ) -> None:
        """Queue one ``sync`` record (the master's id and flag kept): every sync of a log read
        in one loop iteration is written with one append."""
        conn.request_started()
        entry = self._synced.get(id(plog))
        if entry is None:
            entry = self._synced[id(plog)] = (plog, stat, bytearray(), [])
        entry[2].extend(record)
        entry[3].append(SyncWaiter(conn, opaque, len(record), msg_id))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush_all)

    def synced_batch(
        self,
        conn: Connection,
        plog: PartitionLog,
        stat: bool,
        body: bytearray,
        opaque: int,
        offset: int | None = None,
        producer: tuple[str, int] | None = None,
    ) -> None:
        """Append a ``bsync`` body as it is (the master's ids and flags), after any ``sync``
        records of that log queued earlier in this iteration (one connection's order kept);
        with ``offset`` (the 8-token form) only if the log ends exactly there (409 else,
        nothing written).  ``producer`` = (id, sequence) of a batch the master took as an
        idempotent ``bput``: recorded in ``producers.idem`` before its bytes are written, that
        file synced before the reply - as the master did (no sequence check: the master
        decided)."""
        entry = self._synced.pop(id(plog), None)
        if entry is not None:
            self._append(entry[0], entry[1], entry[2], entry[3], stamp_ids=False)
        if offset is not None and offset != plog.write_offset:
            self.stats.counters["put_failed"] += 1
            why = f"offset mismatch: this log ends at {plog.write_offset}, not at {offset}"
            conn.result(409, why.encode(), opaque)
            return
        idem = None
        if producer is not None:
            try:
                producers = self.idempotence.producers(plog)
                producers.replicated(*producer)
            except OSError as exc:  # producers.idem could not be read
                reason = describe_os_error(exc)
                self._fail(BatchWaiter(conn, opaque), 500, f"Put message failed: {reason}")
                return
            idem = IdemBatch(producers, *producer)
        conn.request_started()
        first = _FIRST_ID.unpack_from(body, 8)[0] if len(body) >= HEADER_SIZE else 0
        self._append(plog, stat, body, BatchWaiter(conn, opaque, first, idem), stamp_ids=False)

    def flush_all(self) -> None:
        self._flush_scheduled = False
        synced, self._synced = self._synced, {}
        for plog, stat, records, waiters in synced.values():
            self._append(plog, stat, records, waiters, stamp_ids=False)
        for key in list(self._pending):
            pending = self._pending.pop(key)
            self._append(
                pending.plog, pending.stat, bytearray().join(pending.parts), pending.waiters
            )

    def flush_log(self, plog: PartitionLog) -> None:
        pending = self._pending.pop(id(plog), None)
        if pending is not None:
            self._append(plog, pending.stat, bytearray().join(pending.parts), pending.waiters)

    # -- storage ---------------------------------------------------------------------------------
    def _append(
        self,
        plog: PartitionLog,
        stat: bool,
        records: bytearray,
        waiters: Waiters,
        *,
        stamp_ids: bool = True,
    ) -> None:
        done = self._done
        wake = self._wake
        link = self.replicator if stamp_ids else None
        if link is not None and (refused := link.check()) is not None:
            self._fail(waiters, 500, refused)  # MetaQ: nothing written while the slave is away
            return

        idem = waiters.idem if isinstance(waiters, BatchWaiter) else None

        def on_durable(result: AppendResult, exc: BaseException | None) -> None:
            if idem is not None and exc is None:
                try:
                    idem.sync_file()  # the batch's producers.idem entry is durable too
                except OSError as e:
                    exc = e
            done.append(Completion(plog, stat, waiters, result, exc))
            wake()

        both = _Both(on_durable) if link is not None else None

        # a small append goes through _sync_appended one iteration later (fsynced inline when
        # that is cheap, else handed to the flusher); a large one (a bulk load) leaves the
        # fsync it owes to the append itself, which asks the flusher at once, so the fsync
        # overlaps the loop's next reads.  Threshold mode sends small appends through it also
        # while inline fsyncs are backed off: the append itself asks for an fsync only at N/2
        # acked messages, and readers see nothing before an fsync
        via_loop = len(records) <= INLINE_SYNC_BYTES and (
            not plog.group_commit or time.monotonic() >= self._inline_after
        )
        try:
            appended = plog.append(
                records,
                stamp_ids=stamp_ids,
                on_durable=both.local if both is not None else on_durable,
                max_record_size=self.max_record_size if stamp_ids else None,
                defer_flush=via_loop,
                before_write=idem.before_write(len(records)) if idem is not None else None,
            )
            if both is not None and link is not None:  # stamped: send these very records
                producer = (idem.pid, idem.seq) if idem is not None else None
                link.replicate(
                    plog.topic, plog.partition, records, appended.offset, producer
                ).add_done_callback(both.remote)
            if via_loop:
                if not self._to_sync:
                    self.loop.call_soon(self._sync_appended)
                self._to_sync[id(plog)] = plog
        except InvalidRecords as exc:
            self._fail(waiters, 400, f"invalid records: {exc.reason}")
        except (StorageError, OSError) as exc:
            reason = describe_os_error(exc)
            log.error("append to %s-%d failed: %s", plog.topic, plog.partition, reason)
            self._fail(waiters, 500, f"Put message failed: {reason}")
        except Exception as exc:  # a bug: answer and log, never leave a put unanswered
            log.exception("append to %s-%d failed", plog.topic, plog.partition)
            self._fail(waiters, 500, f"internal error: {exc!r}")

    def _sync_appended(self) -> None:
        """Make this iteration's appends durable: a small fsync inline on the loop (no
        handoff to the flusher thread and back), anything else by the flusher.

        Runs one iteration after the appends (``call_soon``), so every put the loop read in
        that iteration shares the fsync; an inline fsync slower than ``INLINE_SLOW_S`` (a busy
        disk) turns inline fsyncs off for ``INLINE_BACKOFF_S``, so the loop is not blocked.
        """
        logs = list(self._to_sync.values())
        self._to_sync.clear()
        self._syncing = True
        try:
            for plog in logs:
                start = time.monotonic()
                if start < self._inline_after or not self._try_inline(plog):
                    plog.request_flush()
                    continue
                if time.monotonic() - start > INLINE_SLOW_S:
                    self._inline_after = time.monotonic() + INLINE_BACKOFF_S
        finally:
            self._syncing = False
            if self._done:  # also this iteration's inline completions (_wake left them here)
                self._drain()

    @staticmethod
    def _try_inline(plog: PartitionLog) -> bool:
        try:
            return bool(plog.sync_inline(INLINE_SYNC_BYTES))
        except Exception:  # sync reports fsync errors to waiters; anything else: flusher
            log.exception("inline sync of %s-%d failed", plog.topic, plog.partition)
            return False

    def _fail(self, waiters: Waiters, code: int, reason: str) -> None:
        answered: list[tuple[Connection, int]]
        if isinstance(waiters, BatchWaiter):
            answered = [(waiters.conn, waiters.opaque)]
            if waiters.idem is not None:  # duplicates waiting for it: the same answer
                answered += waiters.idem.failed()
        else:
            answered = [(w.conn, w.opaque) for w in waiters]
        self.stats.counters["put_failed"] += len(answered)
        body = reason.encode("utf-8", "replace")
        for conn, opaque in answered:
            conn.request_done()
            conn.reply(result_frame(code, body, opaque))

    def _wake(self) -> None:
        if self._wake_pending:
            return
        self._wake_pending = True
        if threading.get_ident() == self._loop_thread:
            if self._syncing:  # an inline fsync's completion: _sync_appended drains it next
                return
            self.loop.call_soon(self._drain)
            return
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # loop closed during shutdown: nobody left to answer
            pass

    def _drain(self) -> None:
        self._wake_pending = False
        done = self._done
        touched: dict[Connection, None] = {}
        while done:
            plog, stat, waiters, result, exc = done.popleft()
            for conn in _conns(waiters):
                touched[conn] = None
            if exc is not None:
                reason = describe_os_error(exc)
                log.error("write to %s-%d failed: %s", plog.topic, plog.partition, reason)
                self._fail(waiters, 500, f"Put message failed: {reason}")
                continue
            try:
                self._acknowledge(plog, stat, waiters, result)
            except Exception:  # pragma: no cover - a bug; keep serving the other completions
                log.exception("acknowledging a write to %s-%d failed", plog.topic, plog.partition)
        for conn in touched:  # write the acks now, not one loop iteration later
            conn.flush_replies()

    def _acknowledge(
        self, plog: PartitionLog, stat: bool, waiters: Waiters, result: AppendResult
    ) -> None:
        """Answer a durable append's waiters (their replies are written by :meth:`_drain`'s
        ``flush_replies``, which runs after every completion)."""
        self.stats.counters["total_messages"] += result.count
        batch = isinstance(waiters, BatchWaiter)
        if stat:
            self.stats.realtime("put", plog.topic, result.count, 1 if batch else len(waiters))
            self.stats.realtime("message_size", plog.topic, result.length, result.count)
        partition = plog.partition
        if isinstance(waiters, BatchWaiter):
            conn, opaque, first, idem = waiters
            first = first or result.first_msg_id
            body = b"%d %d %d %d" % (first, partition, result.offset, result.count)
            conn.request_done()
            conn.reply(result_frame(200, body, opaque), caller_flushes=True)
            if idem is not None:
                for dup_conn, dup_opaque in idem.acknowledged():
                    dup_conn.request_done()
                    dup_conn.reply(result_frame(200, body, dup_opaque), caller_flushes=True)
                    dup_conn.flush_replies()
            return
        offset = result.offset
        if waiters and isinstance(waiters[0], SyncWaiter):
            for conn, opaque, size, msg_id in waiters:
                conn.request_done()
                conn.reply(
                    result_frame(200, b"%d %d %d" % (msg_id, partition, offset), opaque),
                    caller_flushes=True,
                )
                offset += size
            return
        msg_id = result.first_msg_id
        for conn, opaque, size in waiters:  # type: ignore[misc]
            conn.request_done()
            conn.reply(
                result_frame(200, b"%d %d %d" % (msg_id, partition, offset), opaque),
                caller_flushes=True,
            )
            msg_id += 1
            offset += size


class _Both:
    """A samsa put's two confirmations - the local append durable, the slave's replies - and
    the first failure; the completion runs once both are in (either thread)."""

    __slots__ = ("exc", "finish", "left", "lock", "result")

    def __init__(self, finish: Any) -> None:
        self.finish = finish
        self.left = 2
        self.result: AppendResult | None = None
        self.exc: BaseException | None = None
        self.lock = threading.Lock()

    def local(self, result: AppendResult, exc: BaseException | None) -> None:
        self.result = result
        self._one(exc)

    def remote(self, fut: asyncio.Future[None]) -> None:
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError("sync cancelled")
        self._one(exc)

    def _one(self, exc: BaseException | None) -> None:
        with self.lock:
            if exc is not None and self.exc is None:
                self.exc = exc
            self.left -= 1
            if self.left:
                return
        assert self.result is not None
        self.finish(self.result, self.exc)
