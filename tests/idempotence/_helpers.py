"""A seeded fault proxy between a producer and a broker, and the numbered sends through it.

Requests go to the broker untouched; each ``bput`` reply frame coming back (parsed with the codec's
client parser, re-encoded byte for byte) is, by a seeded ``random.Random``: forwarded, dropped
(the producer's request times out), delayed (the stream stalls, so every later reply is late
too) or the connection is cut (both sides closed).  The broker's address is asked for at each
new connection, so the broker may be restarted on another port.  Runs an asyncio loop on its
own thread; counts what it did in ``actions``.
"""

from __future__ import annotations

import asyncio
import collections
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pymetaq.client import Producer
from pymetaq.client.producer.batch import SendHandle
from pymetaq.client.protocol import NEED_DATA, Limits, Parser, ResultReply, Role, encode


@dataclass(frozen=True)
class Faults:
    drop: float = 0.05
    delay: float = 0.05
    cut: float = 0.02
    max_delay_s: float = 0.3


def _bput_reply(reply: ResultReply) -> bool:
    """A ``bput`` ack (``<id> <partition> <offset> <count>``) or a 409."""
    tokens = reply.body.split()
    return reply.code == 409 or (len(tokens) == 4 and all(t.isdigit() for t in tokens))


class FaultProxy:
    def __init__(self, upstream: Callable[[], tuple[str, int]], seed: int, faults: Faults) -> None:
        self.upstream = upstream
        self.rng = random.Random(seed)
        self.faults = faults
        self.actions: collections.Counter[str] = collections.Counter()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")

    @property
    def url(self) -> str:
        return f"meta://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self._writers.add(cw)
        try:
            br, bw = await asyncio.open_connection(*self.upstream())
        except OSError:
            self.actions["refused"] += 1
            cw.close()
            self._writers.discard(cw)
            return
        self._writers.add(bw)
        up = asyncio.ensure_future(self._pipe(cr, bw))
        down = asyncio.ensure_future(self._replies(br, cw))
        try:
            await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            for w in (cw, bw):
                w.close()
                self._writers.discard(w)

    @staticmethod
    async def _pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while chunk := await r.read(1 << 16):
            w.write(chunk)
            await w.drain()

    async def _replies(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        parser = Parser(Role.CLIENT, Limits(max_body=64 << 20))
        f = self.faults
        while chunk := await r.read(1 << 16):
            parser.feed(chunk)
            while (event := parser.next_event()) is not NEED_DATA:
                assert isinstance(event, ResultReply)
                if not _bput_reply(event):  # the producer's metadata requests pass
                    w.write(encode(event))
                    continue
                x = self.rng.random()
                if x < f.cut:
                    self.actions["cut"] += 1
                    return
                if x < f.cut + f.drop:
                    self.actions["drop"] += 1
                    continue
                if x < f.cut + f.drop + f.delay:
                    self.actions["delay"] += 1
                    await asyncio.sleep(self.rng.random() * f.max_delay_s)
                self.actions["forward"] += 1
                w.write(encode(event))
                await w.drain()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def retrying_producer(url: str, idempotence: bool = True) -> Producer:
    """A producer that retries for ever, quickly, in small batches (the faults' tests)."""
    return Producer(
        url,
        idempotence=idempotence,
        retries=1_000_000,
        retry_backoff_ms=20,
        request_timeout_ms=400,
        connect_timeout_ms=400,
        batch_messages=10,
        linger_ms=1,
    )


class NumberedSends:
    """Sends ``m000000``, ``m000001``, ... (message i to partition i % partitions) on a
    thread of its own; ``handles`` in send order."""

    def __init__(self, producer: Producer, topic: str, total: int, partitions: int) -> None:
        self.handles: list[SendHandle] = []
        self._acked = threading.Semaphore(0)

        def run() -> None:
            for i in range(total):
                h = producer.send_async(topic, b"m%06d" % i, partition=i % partitions)
                h.add_done_callback(lambda _h: self._acked.release())
                self.handles.append(h)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def wait_done(self, n: int, timeout: float = 60) -> None:
        """Until ``n`` more sends are done (``timeout`` for each)."""
        for _ in range(n):
            assert self._acked.acquire(timeout=timeout), "no progress through the proxy"

    def join(self, timeout: float = 60) -> None:
        self._thread.join(timeout)
