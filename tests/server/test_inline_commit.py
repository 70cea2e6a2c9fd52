"""The broker's inline group commit (``pymetaq.server.puts.Appender``).

A small group-commit put is fsynced on the event loop and answered in the next loop
iteration, without the flusher thread (here the flusher is never started, so an answer proves
the inline path); a large bput (over ``INLINE_SYNC_BYTES``) is handed to the flusher and is not
answered before the flusher's fsync. Either way the reply carries the stored position and
nothing is answered before it is durable.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pymetaq.server.puts import INLINE_SYNC_BYTES, Appender
from pymetaq.server.stats import Stats
from pymetaq.storage import MessageStoreManager, StoreConfig, TopicStoreConfig
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import encode_record


class FakeConn:
    """A connection whose replies count as written once flushed: a reply queued with
    ``caller_flushes`` (no flush scheduled) reaches ``replies`` only through the
    ``flush_replies`` the appender promised."""

    def __init__(self) -> None:
        self.replies: list[bytes] = []
        self.unflushed: list[bytes] = []
        self.started = 0
        self.done = 0

    def request_started(self) -> None:
        self.started += 1

    def request_done(self) -> None:
        self.done += 1

    def reply(self, frame: bytes, *, caller_flushes: bool = False) -> None:
        (self.unflushed if caller_flushes else self.replies).append(frame)

    def flush_replies(self) -> None:
        self.replies += self.unflushed
        self.unflushed.clear()


def _store(path: Path) -> MessageStoreManager:
    cfg = TopicStoreConfig(num_partitions=1, unflush_threshold=0)
    m = MessageStoreManager(StoreConfig(str(path)), lambda t: cfg)
    m.open()  # flusher thread NOT started
    return m


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_small_puts_are_fsynced_inline_and_answered_without_the_flusher(tmp_path: Path) -> None:
    m = _store(tmp_path)
    plog = m.get_log("t", 0)
    assert plog is not None

    async def main() -> list[bytes]:
        appender = Appender(asyncio.get_running_loop(), Stats(), None)
        conn: Any = FakeConn()
        for i, value in enumerate((b"one", b"two", b"three")):
            appender.put(conn, plog, False, value, 0, checksum(value), 10 + i)
        body = bytearray(encode_record(b"x" * 5) + encode_record(b"y" * 6))
        appender.batch(conn, plog, False, body, 20)
        assert conn.replies == [] and plog.max_offset == 0  # not durable yet: no answer
        await _turns(3)
        return list(conn.replies)

    replies = asyncio.run(main())
    first_id = int(replies[0].split(b"\r\n")[1].split()[0])
    bput_id = int(replies[3].split(b"\r\n")[1].split()[0])  # a later append: a later id
    assert bput_id > first_id + 2
    assert replies == [
        b"result 200 %d 10\r\n%d 0 0" % (len(b"%d 0 0" % first_id), first_id),
        b"result 200 %d 11\r\n%d 0 23" % (len(b"%d 0 23" % (first_id + 1)), first_id + 1),
        b"result 200 %d 12\r\n%d 0 46" % (len(b"%d 0 46" % (first_id + 2)), first_id + 2),
        b"result 200 %d 20\r\n%d 0 71 2" % (len(b"%d 0 71 2" % bput_id), bput_id),
    ]
    assert plog.max_offset == plog.write_offset == 71 + 25 + 26  # durable before answered
    m.close()


def test_a_large_bput_waits_for_the_flusher(tmp_path: Path) -> None:
    m = _store(tmp_path)
    plog = m.get_log("t", 0)
    assert plog is not None
    body = bytearray(encode_record(b"z" * (INLINE_SYNC_BYTES + 1)))

    async def main() -> tuple[list[bytes], list[bytes]]:
        appender = Appender(asyncio.get_running_loop(), Stats(), None)
        conn: Any = FakeConn()
        appender.batch(conn, plog, False, body, 7)
        await _turns(3)
        before = list(conn.replies)  # no flusher yet: not durable, not answered
        await asyncio.to_thread(m._flusher.run_once)
        for _ in range(100):
            if conn.replies:
                break
            await asyncio.sleep(0.01)
        return before, list(conn.replies)

    before, after = asyncio.run(main())
    assert before == [] and len(after) == 1
    assert after[0].startswith(b"result 200 ") and after[0].endswith(b" 0 0 1")
    assert plog.max_offset == len(body)
    m.close()


def test_threshold_appends_reach_readers_while_inline_fsyncs_are_backed_off(
    tmp_path: Path,
) -> None:
    """Threshold mode acks a small put at once; readers see it after an fsync. After a slow
    inline fsync the loop stops fsyncing for a while: the put must then go to the flusher at
    once, not wait for N/2 acked messages or ``unflushInterval`` (here a minute)."""
    cfg = TopicStoreConfig(num_partitions=1, unflush_threshold=1000, unflush_interval_ms=60_000)
    m = MessageStoreManager(StoreConfig(str(tmp_path)), lambda t: cfg)
    m.open()  # flusher thread NOT started: run_once below is the only fsync
    plog = m.get_log("t", 0)
    assert plog is not None

    async def main() -> list[bytes]:
        appender = Appender(asyncio.get_running_loop(), Stats(), None)
        appender._inline_after = time.monotonic() + 60  # as after a slow inline fsync
        conn: Any = FakeConn()
        appender.put(conn, plog, False, b"line", 0, checksum(b"line"), 5)
        await _turns(3)
        return list(conn.replies)

    replies = asyncio.run(main())
    assert len(replies) == 1 and replies[0].startswith(b"result 200 ")  # acked at once
    assert plog.max_offset == 0  # not fsynced by the loop: backed off
    m._flusher.run_once(now=plog.last_sync)  # asked for it: the interval is a minute away
    assert plog.max_offset == plog.write_offset == 24
    m.close()


def test_a_reply_the_caller_flushes_schedules_no_loop_turn() -> None:
    """The acknowledgements of a put round are written by the appender's flush_replies; a
    flush scheduled for them too ran as an empty loop iteration on every round."""
    from types import SimpleNamespace

    from pymetaq.client.protocol import Limits
    from pymetaq.server.connection import Connection

    soon: list[Any] = []
    written: list[bytes] = []
    loop = SimpleNamespace(call_soon=lambda fn, *a: soon.append(fn))
    conn = Connection(SimpleNamespace(loop=loop, limits=Limits()))  # type: ignore[arg-type]
    conn.transport = SimpleNamespace(write=written.append)  # type: ignore[assignment]
    conn.reply(b"a", caller_flushes=True)
    conn.reply(b"b", caller_flushes=True)
    assert soon == [] and written == []
    conn.flush_replies()
    assert written == [b"ab"]
    conn.reply(b"c")  # any other reply: written at the end of this loop iteration
    assert len(soon) == 1 and written == [b"ab"]
    soon.pop()()
    assert written == [b"ab", b"c"]
