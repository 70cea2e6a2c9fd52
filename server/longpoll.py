"""Long-poll gets (pymetaq's 8-token ``get ... <maxWaitMs> <opaque>``).

A get that finds no data registers a waiter on its partition and arms a timer.  Storage calls
the log's listener (any thread) after the durable high-water mark advances; the listener wakes
the loop only if that partition has waiters, and the loop re-tries each waiter's read.  When
the timer fires first, the get is answered exactly like a 7-token get (404 / 301).

A get on a configured partition that has no store yet waits too, without creating one (a get
never creates anything): the put that creates the store hands it over (:meth:`store_created`)
and the waiters are tried at once.

No lost wake-up: a waiter is registered *before* its read is retried, so an advance either
sees the waiter or happens before the retry, which then finds the data.  Waiters are bounded by
the connections' in-flight limit (each counts as an in-flight request).

Thread-safety: ``_on_advance`` may run on any thread and only reads a dict and schedules a
callback; everything else runs on the event-loop thread.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pymetaq.client.protocol import GetCommand
    from pymetaq.server.connection import Connection
    from pymetaq.server.dispatch import Dispatcher
    from pymetaq.storage import PartitionLog

#: upper bound on one long-poll wait, whatever the client asks for.
MAX_WAIT_MS = 300_000

Key = tuple[str, int]  # (topic, partition)


@dataclass(eq=False, slots=True)
class Waiter:
    """One parked get; ``plog`` is None until the partition's store exists."""

    conn: Connection
    cmd: GetCommand
    plog: PartitionLog | None
    timer: asyncio.TimerHandle | None = field(default=None)

    @property
    def key(self) -> Key:
        return (self.cmd.topic, self.cmd.partition)


class LongPoll:
    """The waiting gets of one broker."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._loop = dispatcher.loop
        self._loop_thread = threading.get_ident()
        self._waiters: dict[Key, list[Waiter]] = {}
        self._listening: set[Key] = set()
        self._scheduled: set[Key] = set()

    def waiting(self) -> int:
        """How many gets are parked now (monitoring)."""
        return sum(len(w) for w in self._waiters.values())

    def wait(self, conn: Connection, cmd: GetCommand, plog: PartitionLog | None) -> None:
        """Park ``cmd`` until data arrives or its maxWaitMs elapses."""
        waiter = Waiter(conn, cmd, plog)
        key = waiter.key
        if plog is not None:
            self._listen(key, plog)
        self._waiters.setdefault(key, []).append(waiter)
        conn.request_started()
        delay = min(cmd.max_wait_ms or 0, MAX_WAIT_MS) / 1000.0
        waiter.timer = self._loop.call_later(delay, self._expire, waiter)
        if plog is not None and self._dispatcher.answer_get(conn, cmd, plog, final=False):
            self._finish(waiter)

    def store_created(self, topic: str, partition: int, plog: PartitionLog) -> None:
        """A put created the store of ``(topic, partition)``: its waiters read from it now."""
        key = (topic, partition)
        waiters = self._waiters.get(key)
        if not waiters:
            return
        for waiter in waiters:
            waiter.plog = plog
        self._listen(key, plog)
        self._loop.call_soon(self._wake, key)

    def _listen(self, key: Key, plog: PartitionLog) -> None:
        if key not in self._listening:
            self._listening.add(key)

            def listener(_max_offset: int) -> None:
                self._on_advance(key)

            plog.add_listener(listener)

    def _on_advance(self, key: Key) -> None:
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

    def _wake(self, key: Key) -> None:
        self._scheduled.discard(key)
        for waiter in list(self._waiters.get(key, ())):
            if waiter.plog is None:
                continue
            if waiter.conn.closed or self._dispatcher.answer_get(
                waiter.conn, waiter.cmd, waiter.plog, final=False
            ):
                self._finish(waiter)

    def _expire(self, waiter: Waiter) -> None:
        waiter.timer = None
        if not self._finish(waiter) or waiter.conn.closed:
            return
        if waiter.plog is None:
            tc = self._dispatcher.broker.config.topic_config(waiter.cmd.topic)
            self._dispatcher.answer_missing(waiter.conn, waiter.cmd, tc)
        else:
            self._dispatcher.answer_get(waiter.conn, waiter.cmd, waiter.plog, final=True)

    def _finish(self, waiter: Waiter) -> bool:
        """Unregister ``waiter``; False if it was already gone."""
        key = waiter.key
        waiters = self._waiters.get(key)
        if not waiters or waiter not in waiters:
            return False
        waiters.remove(waiter)
        if not waiters:
            del self._waiters[key]
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        waiter.conn.request_done()
        return True

    def drop_connection(self, conn: Connection) -> None:
        for waiters in list(self._waiters.values()):
            for waiter in [w for w in waiters if w.conn is conn]:
                self._finish(waiter)

    def expire_all(self) -> None:
        """Answer every waiting get now (shutdown)."""
        for waiters in list(self._waiters.values()):
            for waiter in list(waiters):
                self._expire(waiter)
