"""The flusher thread: group commit and MetaQ's periodic (threshold-mode) flushing.

RocketMQ's GroupCommitService pattern: appends register their log with :meth:`request`; the
thread swaps the pending set, and for each log runs :meth:`PartitionLog.sync` — one
fdatasync per dirty segment covering every append written so far, then every waiter of that
log is completed.  Appends arriving during the fsync wait for the next round and share it.

Threshold-mode logs are also fsynced when their ``unflush_interval_ms`` has elapsed since their
last sync (MetaQ's FlushRunner), and at once when an append reaches ``unflush_threshold``.
A sync postponed by a transient shortage (no descriptor for the fsync) is retried after
``RETRY_S`` (:meth:`retry_later`), so it neither spins nor fails the log.

Thread-safety: :meth:`request` may be called from any thread (one lock + condition); all
fsyncs happen on the flusher thread.
"""

from __future__ import annotations

import logging
import threading
import time

from pymetaq.storage.log import PartitionLog

log = logging.getLogger(__name__)

RETRY_S = 0.05


class Flusher:
    """One background thread that fsyncs partition logs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[PartitionLog, None] = {}
        self._periodic: dict[PartitionLog, None] = {}
        self._retry: dict[PartitionLog, float] = {}  # log -> monotonic time of the retry
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pymetaq-flusher", daemon=True)
            self._thread.start()

    def request(self, plog: PartitionLog) -> None:
        """Ask for an fsync of ``plog`` as soon as possible."""
        with self._cond:
            if not self._pending:
                self._cond.notify()
            self._pending[plog] = None

    def retry_later(self, plog: PartitionLog) -> None:
        """Sync ``plog`` again in ``RETRY_S`` (its last sync hit a transient shortage)."""
        with self._cond:
            self._retry.setdefault(plog, time.monotonic() + RETRY_S)
            self._cond.notify()

    def watch(self, plog: PartitionLog) -> None:
        """Flush ``plog`` every ``unflush_interval_ms`` (threshold mode)."""
        with self._cond:
            self._periodic[plog] = None
            self._cond.notify()

    def unwatch(self, plog: PartitionLog) -> None:
        with self._cond:
            self._periodic.pop(plog, None)
            self._pending.pop(plog, None)
            self._retry.pop(plog, None)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def run_once(self, now: float | None = None) -> None:
        """One round: pending logs, then due periodic ones (the thread's body; tests call it)."""
        now = time.monotonic() if now is None else now
        with self._cond:
            pending, self._pending = self._pending, {}
            for plog, due in list(self._retry.items()):
                if due <= now:
                    del self._retry[plog]
                    pending[plog] = None
        for plog in pending:
            self._sync(plog, now)
        for plog in self._due(now):
            self._sync(plog, now)

    def _due(self, now: float) -> list[PartitionLog]:
        with self._cond:
            logs = list(self._periodic)
        return [
            p for p in logs if now - p.last_sync + 1e-9 >= p.config.unflush_interval_ms / 1000.0
        ]

    def _next_wait(self, now: float) -> float | None:
        with self._cond:
            logs = list(self._periodic)
            retries = list(self._retry.values())
        dues = [p.last_sync + p.config.unflush_interval_ms / 1000.0 for p in logs] + retries
        if not dues:
            return None
        return max(0.0, min(dues) - now)

    @staticmethod
    def _sync(plog: PartitionLog, now: float) -> None:
        if plog.closed:
            return
        try:
            plog.sync(now)
        except Exception:  # sync reports fsync errors to waiters; anything else is a bug
            log.exception("%s: flush failed", plog.name)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    wait = self._next_wait(time.monotonic())
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopping and not self._pending:
                    return
            self.run_once()
