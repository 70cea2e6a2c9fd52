"""NATS JetStream as a benchmark peer: ``nats-server -js`` with a file store, ``nats-py``.

Server: ``nats-server -js -sd <workdir>/nats`` on a free 127.0.0.1 port. Each case creates a
fresh file-storage stream (one subject) and deletes it afterwards.

Client calls (nats-py, asyncio; each case runs its own event loop and connection):

- produce: ``js.publish_async`` continuously (up to ``publish_async_max_pending`` = 4000 in
  flight, the library default), then ``publish_async_completed()``; counts successful PubAcks.
- consume: the stream is pre-filled (``seconds`` of produce, not timed), then a durable pull
  consumer with ``AckPolicy.ALL`` does ``fetch(batch)`` and acks the last message of each batch
  (the offset-commit equivalent; per-message acks would cost one publish each).
- latency: open-loop ``publish_async`` of whatever is due. e2e receives with a *push* consumer
  (callback, ``AckPolicy.ALL``, an ack every ``E2E_ACK_EVERY`` = 100 messages) on its own thread,
  event loop and connection: a pull consumer's ``fetch`` in nats-py waits on its outstanding pull
  request until the batch fills or expires, which measured 67-457 ms p50 at 10k msgs/s (batch
  100-1000) against ~0.4 ms for push on this machine; push is JetStream's low-latency delivery.

Durability when JetStream acks: the message is in the stream's file store (OS page cache, the
block write may lag a moment) and fsync runs every ``sync_interval`` (2 min by default) → power
loss can lose up to ~2 min of acked messages.

Thread-safety: one runner thread; every call owns its event loop for its duration.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StorageType

from bench.common import (
    NS,
    Latency,
    LatencyRecorder,
    Mode,
    OpenLoop,
    ServerProcess,
    SystemUnavailable,
    Throughput,
    filler,
    free_port,
    stamp_of,
    stamped,
)
from bench.systems.base import System

DURABILITY = (
    "file store, default sync_interval 2 min: acks before fsync; "
    "power loss loses up to ~2 min of acked messages"
)
MAX_PENDING = 4000
E2E_ACK_EVERY = 100
T = TypeVar("T")


class NatsSystem(System):
    name = "nats"
    modes = (Mode("file", DURABILITY),)
    #: no produce_each: nats-py's JetStream publish awaits each ack (no pipelined call)
    cases = ("produce", "consume", "ack_latency", "e2e_latency")

    def __init__(self) -> None:
        self._server: ServerProcess | None = None
        self._port = 0
        self._ids = itertools.count()

    def start(self, workdir: Path) -> None:
        binary = shutil.which("nats-server")
        if binary is None:
            raise SystemUnavailable("nats: nats-server not found on PATH")
        data = workdir / "nats"
        data.mkdir(parents=True, exist_ok=True)
        self._port = free_port()
        argv = [binary, "-a", "127.0.0.1", "-p", str(self._port), "-js", "-sd", str(data)]
        self._server = ServerProcess(argv, data / "nats.log", self._port)
        self._server.wait_ready()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def produce(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        return asyncio.run(self._with_stream("produce", self._produce, msg_bytes, batch, seconds))

    def consume(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        return asyncio.run(self._with_stream("consume", self._consume, msg_bytes, batch, seconds))

    def ack_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        return asyncio.run(
            self._with_stream("ack", self._ack_latency, rate, msg_bytes, batch, seconds)
        )

    def e2e_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        return asyncio.run(
            self._with_stream("e2e", self._e2e_latency, rate, msg_bytes, batch, seconds)
        )

    async def _connect(self) -> NATS:
        return await nats.connect(f"nats://127.0.0.1:{self._port}", max_reconnect_attempts=0)

    async def _with_stream(self, case: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Connects, creates stream ``bench-<case>-<n>``, runs ``fn(js, subject, *args)``."""
        nc = await self._connect()
        js = nc.jetstream(publish_async_max_pending=MAX_PENDING)
        name = f"bench-{case}-{next(self._ids)}"
        subject = f"{name}.msgs"
        await js.add_stream(name=name, subjects=[subject], storage=StorageType.FILE)
        try:
            return await fn(js, subject, *args)
        finally:
            await js.delete_stream(name)
            await nc.close()

    async def _produce(
        self, js: JetStreamContext, subject: str, msg_bytes: int, batch: int, seconds: float
    ) -> Throughput:
        count, elapsed = await _fill(js, subject, filler(msg_bytes), batch, seconds)
        return Throughput(count, count * msg_bytes, elapsed)

    async def _consume(
        self, js: JetStreamContext, subject: str, msg_bytes: int, batch: int, seconds: float
    ) -> Throughput:
        total, _ = await _fill(js, subject, filler(msg_bytes), batch, seconds)
        psub = await js.pull_subscribe(
            subject, durable="c", config=ConsumerConfig(ack_policy=AckPolicy.ALL)
        )
        got = 0
        start = time.perf_counter()
        deadline = start + seconds
        while got < total and time.perf_counter() < deadline:
            try:
                msgs = await psub.fetch(batch, timeout=1.0)
            except NatsTimeout:
                continue
            await msgs[-1].ack()
            got += len(msgs)
        elapsed = time.perf_counter() - start
        await psub.unsubscribe()
        return Throughput(got, got * msg_bytes, elapsed, prefilled=total)

    async def _ack_latency(
        self,
        js: JetStreamContext,
        subject: str,
        rate: int,
        msg_bytes: int,
        batch: int,
        seconds: float,
    ) -> Latency:
        loop = OpenLoop(rate, seconds)
        rec = LatencyRecorder(loop.record_from_ns)
        sent = await _send_open_loop(js, subject, loop, batch, msg_bytes, rec)
        await asyncio.wait_for(js.publish_async_completed(), 30)
        elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
        return rec.result(rate, sent, elapsed, note=loop.shortfall_note(sent))

    async def _e2e_latency(
        self,
        js: JetStreamContext,
        subject: str,
        rate: int,
        msg_bytes: int,
        batch: int,
        seconds: float,
    ) -> Latency:
        """Open-loop publishing here; a push consumer on its own thread, loop and connection."""
        loop = OpenLoop(rate, seconds)
        rec = LatencyRecorder(loop.record_from_ns)
        ready, stop = threading.Event(), threading.Event()
        failure: list[BaseException] = []

        def consume() -> None:
            try:
                asyncio.run(self._push_consume(subject, rec, ready, stop))
            except BaseException as exc:  # reported by the runner thread below
                failure.append(exc)
                ready.set()

        thread = threading.Thread(target=consume, name="nats-e2e-consumer", daemon=True)
        thread.start()
        try:
            await asyncio.to_thread(ready.wait, 15)
            if failure or not ready.is_set():
                raise RuntimeError(f"nats e2e consumer did not start: {failure!r}")
            sent = await _send_open_loop(js, subject, loop, batch, msg_bytes, None)
            await asyncio.wait_for(js.publish_async_completed(), 30)
            deadline = time.monotonic() + seconds * 2 + 10
            while rec.completed < sent and time.monotonic() < deadline and not failure:
                await asyncio.sleep(0.01)
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, 30)
        elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
        return rec.result(rate, sent, elapsed, note=loop.shortfall_note(sent))

    async def _push_consume(
        self, subject: str, rec: LatencyRecorder, ready: threading.Event, stop: threading.Event
    ) -> None:
        nc = await self._connect()
        js = nc.jetstream()
        got = 0
        last: Msg | None = None

        async def on_msg(msg: Msg) -> None:
            nonlocal got, last
            rec.record(stamp_of(msg.data), time.perf_counter_ns())
            got += 1
            last = msg
            if got % E2E_ACK_EVERY == 0:
                await msg.ack()

        config = ConsumerConfig(ack_policy=AckPolicy.ALL)
        sub = await js.subscribe(subject, durable="e2e", cb=on_msg, manual_ack=True, config=config)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.01)
        if last is not None:
            await last.ack()
        await sub.unsubscribe()
        await nc.close()


async def _fill(
    js: JetStreamContext, subject: str, value: bytes, batch: int, seconds: float
) -> tuple[int, float]:
    """publish_async for ``seconds`` (checking the clock every ``batch``), then waits for every
    ack; returns (messages acked without error, elapsed s)."""
    acked = 0

    def on_done(fut: asyncio.Future[Any]) -> None:
        nonlocal acked
        if not fut.cancelled() and fut.exception() is None:
            acked += 1

    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(batch):
            fut = await js.publish_async(subject, value)
            fut.add_done_callback(on_done)
        await asyncio.sleep(0)
    await asyncio.wait_for(js.publish_async_completed(), 30)
    await asyncio.sleep(0)  # let the last done-callbacks run
    return acked, time.perf_counter() - start


async def _send_open_loop(
    js: JetStreamContext,
    subject: str,
    loop: OpenLoop,
    batch: int,
    msg_bytes: int,
    rec: LatencyRecorder | None,
) -> int:
    """Publishes ``loop``'s schedule, whatever is due at once; records PubAcks into ``rec``."""
    sent = 0
    async for due in loop.abatches(batch):
        for i in due:
            scheduled = loop.scheduled_ns(i)
            fut = await js.publish_async(subject, stamped(scheduled, msg_bytes))
            if rec is not None:
                fut.add_done_callback(_recorder(rec, scheduled))
        sent = due.stop
    return sent


def _recorder(rec: LatencyRecorder, scheduled: int) -> Callable[[asyncio.Future[Any]], None]:
    def done(fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            rec.record(scheduled, time.perf_counter_ns())

    return done
