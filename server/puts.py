"""The write path: single puts coalesced into one append per log, batch puts, durable acks.

Single ``put`` commands that arrive in the same event-loop iteration (a pipelining client, or
several clients) for the same partition are concatenated and written with **one**
``PartitionLog.append``; the append's consecutive ids and the records' sizes give every put
its own ``"<msgId> <partition> <offset>"``.  A ``bput`` body is appended as it is, after any
coalesced puts of that log were written, so one connection's writes keep their order.  Every
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

Thread-safety: everything runs on the event-loop thread except ``on_durable`` closures from
the flusher, which only append to a deque and wake the loop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from pymetaq.server.connection import result_frame
from pymetaq.server.stats import Stats
from pymetaq.storage import InvalidRecords, StorageError
from pymetaq.storage.record import HEADER

if TYPE_CHECKING:
    from pymetaq.server.connection import Connection

log = logging.getLogger("pymetaq.server")

#: a coalesced append is written at once when it reaches this many bytes
COALESCE_LIMIT = 512 * 1024
#: size marker of a waiter that is a whole ``bput`` (reply carries the count)
BATCH = -1
#: an fsync of at most this many unsynced bytes may run inline on the loop
INLINE_SYNC_BYTES = 64 * 1024
#: an inline fsync slower than this sends the next ones to the flusher for INLINE_BACKOFF_S
INLINE_SLOW_S = 0.001
INLINE_BACKOFF_S = 0.1

Waiter = tuple["Connection", int, int]  # connection, opaque, record size (or BATCH)


class _Pending:
    __slots__ = ("nbytes", "parts", "plog", "stat", "waiters")

    def __init__(self, plog: Any, stat: bool) -> None:
        self.plog = plog
        self.stat = stat
        self.parts: list[bytes] = []
        self.waiters: list[Waiter] = []
        self.nbytes = 0


class Appender:
    """Owns every append the broker makes and the replies that acknowledge them."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stats: Stats, max_record_size: int | None = None
    ) -> None:
        self.loop = loop
        self.stats = stats
        #: largest record data storage accepts (``maxTransferSize - 20``: every stored record
        #: must fit one ``get`` reply)
        self.max_record_size = max_record_size
        self._loop_thread = threading.get_ident()
        self._pending: dict[int, _Pending] = {}
        self._flush_scheduled = False
        self._done: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake_pending = False
        #: logs appended with ``defer_flush`` this iteration (synced by ``_sync_appended``)
        self._to_sync: dict[int, Any] = {}
        self._inline_after = 0.0  # monotonic time before which no inline fsync is tried

    # -- intake -------------------------------------------------------------------------------
    def put(
        self, conn: Connection, plog: Any, stat: bool, data: bytes, flag: int, crc: int, opaque: int
    ) -> None:
        """Queue one put's record (header built here, id stamped by storage)."""
        conn.request_started()
        pending = self._pending.get(id(plog))
        if pending is None:
            pending = self._pending[id(plog)] = _Pending(plog, stat)
        pending.parts.append(HEADER.pack(len(data), crc, 0, flag))
        pending.parts.append(data)
        size = 20 + len(data)
        pending.waiters.append((conn, opaque, size))
        pending.nbytes += size
        if pending.nbytes >= COALESCE_LIMIT:
            self.flush_log(plog)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush_all)

    def batch(self, conn: Connection, plog: Any, stat: bool, body: bytearray, opaque: int) -> None:
        """Append a validated ``bput`` body as one unit."""
        self.flush_log(plog)
        conn.request_started()
        self._append(plog, stat, body, [(conn, opaque, BATCH)])

    def flush_all(self) -> None:
        self._flush_scheduled = False
        for key in list(self._pending):
            pending = self._pending.pop(key)
            self._append(
                pending.plog, pending.stat, bytearray().join(pending.parts), pending.waiters
            )

    def flush_log(self, plog: Any) -> None:
        pending = self._pending.pop(id(plog), None)
        if pending is not None:
            self._append(plog, pending.stat, bytearray().join(pending.parts), pending.waiters)

    # -- storage ---------------------------------------------------------------------------------
    def _append(self, plog: Any, stat: bool, records: bytearray, waiters: list[Waiter]) -> None:
        done = self._done
        wake = self._wake

        def on_durable(result: Any, exc: BaseException | None) -> None:
            done.append((plog, stat, waiters, result, exc))
            wake()

        # a large append (a bulk load) goes to the flusher at once, so its fsync overlaps
        # the loop's next reads; a small one may be fsynced inline by _sync_appended
        inline = len(records) <= INLINE_SYNC_BYTES and time.monotonic() >= self._inline_after
        try:
            plog.append(
                records,
                on_durable=on_durable,
                max_record_size=self.max_record_size,
                defer_flush=inline,
            )
            if inline:
                if not self._to_sync:
                    self.loop.call_soon(self._sync_appended)
                self._to_sync[id(plog)] = plog
        except InvalidRecords as exc:
            self._fail(waiters, 400, f"invalid records: {exc.reason}")
        except StorageError as exc:
            log.error("append to %s-%d failed: %r", plog.topic, plog.partition, exc)
            self._fail(waiters, 500, f"Put message failed: {exc}")
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
        for plog in logs:
            start = time.monotonic()
            if start < self._inline_after or not self._try_inline(plog):
                plog.request_flush()
                continue
            if time.monotonic() - start > INLINE_SLOW_S:
                self._inline_after = time.monotonic() + INLINE_BACKOFF_S
        if self._done:
            self._drain()

    @staticmethod
    def _try_inline(plog: Any) -> bool:
        try:
            return bool(plog.sync_inline(INLINE_SYNC_BYTES))
        except Exception:  # sync reports fsync errors to waiters; anything else: flusher
            log.exception("inline sync of %s-%d failed", plog.topic, plog.partition)
            return False

    def _fail(self, waiters: list[Waiter], code: int, reason: str) -> None:
        self.stats.counters["put_failed"] += len(waiters)
        body = reason.encode("utf-8", "replace")
        for conn, opaque, _size in waiters:
            conn.request_done()
            conn.reply(result_frame(code, body, opaque))

    def _wake(self) -> None:
        if self._wake_pending:
            return
        self._wake_pending = True
        if threading.get_ident() == self._loop_thread:
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
            for waiter in waiters:
                touched[waiter[0]] = None
            if exc is not None:
                log.error("write to %s-%d failed: %r", plog.topic, plog.partition, exc)
                self._fail(waiters, 500, f"Put message failed: {exc}")
                continue
            try:
                self._acknowledge(plog, stat, waiters, result)
            except Exception:  # pragma: no cover - a bug; keep serving the other completions
                log.exception("acknowledging a write to %s-%d failed", plog.topic, plog.partition)
        for conn in touched:  # write the acks now, not one loop iteration later
            conn.flush_replies()

    def _acknowledge(self, plog: Any, stat: bool, waiters: list[Waiter], result: Any) -> None:
        self.stats.counters["total_messages"] += result.count
        if stat:
            self.stats.realtime("put", plog.topic, result.count, len(waiters))
            self.stats.realtime("message_size", plog.topic, result.length, result.count)
        partition = plog.partition
        if len(waiters) == 1 and waiters[0][2] == BATCH:
            conn, opaque, _ = waiters[0]
            body = b"%d %d %d %d" % (result.first_msg_id, partition, result.offset, result.count)
            conn.request_done()
            conn.reply(result_frame(200, body, opaque))
            return
        msg_id, offset = result.first_msg_id, result.offset
        for conn, opaque, size in waiters:
            conn.request_done()
            conn.reply(result_frame(200, b"%d %d %d" % (msg_id, partition, offset), opaque))
            msg_id += 1
            offset += size
