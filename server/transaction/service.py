"""Transactions in the broker's lifecycle: recovery at start, periodic work, clean close.

``TransactionService.open(config, store)`` (before the broker listens; blocking) opens the
journal under ``<dataLogPath>/transactions`` and recovers it: committed transactions are
applied exactly once, unprepared ones rolled back, prepared XA branches restored.
``attach(loop, stats, max_record)`` (on the event loop) builds the manager and the wire
handler and starts the periodic work:

- a checkpoint every ``checkpointInterval`` ms and whenever the journal starts a new file (the
  blocking half runs in the loop's default executor, one at a time);
- every second while a commit is pending (its appends failed, e.g. a full disk): a retry.

``aclose()`` (on the loop, after the connections are closed) waits for a running checkpoint,
takes a final one and closes the journal.

Thread-safety: ``open`` before the loop runs; everything else on the loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

from pymetaq.server.config import BrokerConfig
from pymetaq.server.transaction.handler import TxHandler
from pymetaq.server.transaction.manager import Counters, TransactionManager, TxLimits
from pymetaq.storage.txjournal import JournalConfig, TxRecovery, TxStore

log = logging.getLogger("pymetaq.server.transaction")

RETRY_S = 1.0


class TransactionService:
    """The broker's transaction subsystem (see the module docstring)."""

    def __init__(
        self, config: BrokerConfig, store: TxStore, recovery: TxRecovery, ids: Any
    ) -> None:
        self.config = config
        self.store = store
        self.recovery = recovery
        self._ids = ids
        self.manager: TransactionManager | None = None
        self.handler: TxHandler | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._checkpoint: asyncio.Future[None] | None = None
        self._closing = False

    @classmethod
    def open(cls, config: BrokerConfig, messages: Any) -> TransactionService:
        """Open and recover the journal (blocking; ``messages`` is the started store manager)."""
        s = config.system
        jconf = JournalConfig(
            directory=os.path.join(s.data_log_path, "transactions"),
            file_size=s.tx_journal_file_size,
            flush_at_commit=s.flush_tx_log_at_commit,
            max_checkpoints=s.max_checkpoints,
        )
        store = TxStore(jconf, lambda t, p: messages.get_log(t, p), ids=messages.ids)
        recovery = store.open()
        return cls(config, store, recovery, messages.ids)

    def attach(
        self, loop: asyncio.AbstractEventLoop, stats: Counters, max_record: int
    ) -> TxHandler:
        s = self.config.system
        limits = TxLimits(
            max_open=s.max_tx_timeout_timer_capacity,
            max_per_connection=s.max_tx_per_connection,
            max_held_bytes=s.max_tx_held_bytes,
            max_timeout_s=s.max_tx_timeout_seconds,
        )
        self._loop = loop
        self.manager = TransactionManager(self.store, limits, loop, stats, self._ids)
        self.manager.restore(self.recovery.prepared)
        self.handler = TxHandler(self.manager, stats, s.max_put_size)

        def post(fn: Callable[[], None]) -> None:
            try:
                loop.call_soon_threadsafe(fn)
            except RuntimeError:  # the loop is closed (shutdown): nobody is waiting any more
                pass

        self.store.journal.on_roll = lambda: post(self.checkpoint)
        self.store.start(post)
        self._timers.append(loop.call_later(s.checkpoint_interval_ms / 1000.0, self._periodic))
        self._timers.append(loop.call_later(RETRY_S, self._retry))
        return self.handler

    def _periodic(self) -> None:
        assert self._loop is not None
        self.checkpoint()
        if not self._closing:
            interval = self.config.system.checkpoint_interval_ms / 1000.0
            self._timers.append(self._loop.call_later(interval, self._periodic))

    def _retry(self) -> None:
        assert self._loop is not None
        if self.store.pending():
            left = self.store.retry_pending()
            if left:
                log.warning("%d committed transaction(s) still wait for their appends", left)
        if not self._closing:
            self._timers.append(self._loop.call_later(RETRY_S, self._retry))

    def checkpoint(self) -> None:
        """Start a checkpoint unless one is running (loop thread)."""
        loop = self._loop
        if loop is None or self._closing or self._checkpoint is not None:
            return
        job = self.store.checkpoint_begin()
        if job is None:
            return
        fut = loop.run_in_executor(None, job.run)
        self._checkpoint = fut

        def finished(f: asyncio.Future[None]) -> None:
            self._checkpoint = None
            exc = f.exception() if not f.cancelled() else asyncio.CancelledError()
            self.store.checkpoint_end(job, exc)

        fut.add_done_callback(finished)

    async def aclose(self) -> None:
        """Stop the periodic work, take a final checkpoint, close the journal."""
        self._closing = True
        for t in self._timers:
            t.cancel()
        if self._checkpoint is not None:
            try:
                await self._checkpoint
            except Exception:  # reported by checkpoint_end
                pass
        loop = asyncio.get_running_loop()
        job = None if self.store.journal.failed else self.store.checkpoint_begin()
        if job is not None:
            try:
                await loop.run_in_executor(None, job.run)
                self.store.checkpoint_end(job, None)
            except Exception as exc:
                self.store.checkpoint_end(job, exc)
        await loop.run_in_executor(None, self.store.journal.close)

    def close_blocking(self) -> None:
        """Close without a loop (a broker that failed before serving)."""
        self.store.close()
