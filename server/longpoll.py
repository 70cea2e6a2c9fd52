"""Long-poll gets (pymetaq's 8-token ``get ... <maxWaitMs> <opaque>``).

A get that finds no data registers a waiter on its partition log and arms a timer.  Storage
calls the log's listener (any thread) after the durable high-water mark advances; the listener
wakes the loop only if that log has waiters, and the loop re-tries each waiter's read.  When
the timer fires first, the get is answered exactly like a 7-token get (404 / 301).

No lost wake-up: a waiter is registered *before* its read is retried, so an advance either
sees the waiter or happens before the retry, which then finds the data.

Thread-safety: ``_on_advance`` may run on any thread and only reads a dict and schedules a
callback; everything else runs on the event-loop thread.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymetaq.client.protocol import GetCommand
    from pymetaq.server.connection import Connection
    from pymetaq.server.dispatch import Dispatcher

#: upper bound on one long-poll wait, whatever the client asks for.
MAX_WAIT_MS = 300_000


@dataclass(eq=False)
class Waiter:
    conn: Connection
    cmd: GetCommand
    plog: Any
    timer: asyncio.TimerHandle | None = field(default=None)


class LongPoll:
    """The waiting gets of one broker."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._loop = dispatcher.loop
        self._loop_thread = threading.get_ident()
        self._waiters: dict[int, list[Waiter]] = {}
        self._listening: set[int] = set()
        self._scheduled: set[int] = set()

    def wait(self, conn: Connection, cmd: GetCommand, plog: Any) -> None:
        """Park ``cmd`` until data arrives or its maxWaitMs elapses."""
        key = id(plog)
        if key not in self._listening:
            self._listening.add(key)
            plog.add_listener(lambda _max_offset, key=key: self._on_advance(key))
        waiter = Waiter(conn, cmd, plog)
        self._waiters.setdefault(key, []).append(waiter)
        conn.request_started()
        delay = min(cmd.max_wait_ms or 0, MAX_WAIT_MS) / 1000.0
        waiter.timer = self._loop.call_later(delay, self._expire, waiter)
        if self._dispatcher.answer_get(conn, cmd, plog, final=False):
            self._finish(waiter)

    def _on_advance(self, key: int) -> None:
        if not self._waiters.get(key) or key in self._scheduled:
            return
        self._scheduled.add(key)
        if threading.get_ident() == self._loop_thread:
            self._loop.call_soon(self._wake, key)
        else:
            try:
                self._loop.call_soon_threadsafe(self._wake, key)
            except RuntimeError:  # loop closed at shutdown
                pass

    def _wake(self, key: int) -> None:
        self._scheduled.discard(key)
        for waiter in list(self._waiters.get(key, ())):
            if waiter.conn.closed or self._dispatcher.answer_get(
                waiter.conn, waiter.cmd, waiter.plog, final=False
            ):
                self._finish(waiter)

    def _expire(self, waiter: Waiter) -> None:
        waiter.timer = None
        if self._finish(waiter) and not waiter.conn.closed:
            self._dispatcher.answer_get(waiter.conn, waiter.cmd, waiter.plog, final=True)

    def _finish(self, waiter: Waiter) -> bool:
        """Unregister ``waiter``; False if it was already gone."""
        waiters = self._waiters.get(id(waiter.plog))
        if not waiters or waiter not in waiters:
            return False
        waiters.remove(waiter)
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        waiter.conn.request_done()
        return True

    def drop_connection(self, conn: Connection) -> None:
        for waiters in self._waiters.values():
            for waiter in [w for w in waiters if w.conn is conn]:
                self._finish(waiter)

    def expire_all(self) -> None:
        """Answer every waiting get now (shutdown)."""
        for waiters in list(self._waiters.values()):
            for waiter in list(waiters):
                self._expire(waiter)
