"""pymetaq as a benchmarked system: a broker subprocess and the ``pymetaq.client`` clients.

Client calls (``pymetaq.client``; ``start`` raises ``SystemUnavailable`` when the client or the
``pymetaq server`` CLI is missing, and the runner prints a skip note):

- ``Producer(servers, linger_ms=..., batch_messages=batch)``; ``send_many(topic, values)`` ->
  ``BatchHandle`` (``add_done_callback``, ``exception()``) is the batched path, the analogue of
  a Redis pipeline: produce sends ``batch`` values per call, the latency cases send whatever is
  due as one call; ``flush()``, ``close()``.
- ``Consumer(servers, group, FileOffsetStore(path), recover_dir=...)``, ``subscribe(topic)``,
  ``poll(timeout_s) -> Messages`` (long-poll gets, CRCs checked; ``Message.value``; consume
  takes every payload with ``.values()``, as the peers' clients hand back payloads), ``close()``.

Broker: ``pymetaq server -f <workdir>/pymetaq/server.ini`` (the venv's console script), one
partition per topic, two topic patterns, one per durability mode:

| topic pattern | unflushThreshold | unflushInterval | mode |
|---|---|---|---|
| ``bench-g*`` | 0 | 1000 ms | ``group``: group commit, ack after the covering fdatasync |
| ``bench-t*`` | 1000 | 1000 ms | ``threshold``: MetaQ's default mode, ack before fsync |

Two more modes run the same topics through the **asyncio face** (``AsyncProducer`` on the
case's own event loop: no app-thread to I/O-thread handoff): ``group-asyncio`` and
``threshold-asyncio`` (topic patterns by their first letter, as above). There ack latency
sends every due message with ``send_nowait`` on the loop and yields to it after each burst;
produce sends ``send_many`` batches (at most ``ASYNC_WINDOW`` unacknowledged, completion
from ``add_done_callback`` as in the thread face); e2e runs the asyncio producer in its thread
with ``asyncio.run``.

Cases mirror the peers (see ``bench/systems/redis_sys.py``): produce = ``send_many`` of
``batch`` messages for ``seconds`` then ``flush()`` (counted: acks without error);
produce_each = one ``send_async`` per message (asyncio modes: ``send_nowait``, yielding to the
loop every ``batch`` messages, waiting while ``ASYNC_WINDOW`` such bursts are unacknowledged)
for ``seconds``, then ``flush()``, with the producer's default ``batch_messages`` - the loop a
Kafka or Redis user writes first, against
redis-py's pipelined XADD (counted: the messages stored, from the offset of a final ``send``,
since every record of the topic has the same size); consume =
pre-fill then ``poll`` until drained or ``seconds``; ack latency = open-loop, every due message
sent with ``send_async`` (the public per-message API), each message's latency taken when its
own handle completes (the producer batches adaptively: it sends at once when nothing is in
flight and batches what accumulates meanwhile); e2e = a producer thread (``send_many`` of what
is due) plus a long-polling consumer.

Thread-safety: one runner thread; handles complete on the producer's I/O thread (the recorder
and the error counter are safe there); ``e2e_latency`` adds one producer thread.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import itertools
import shutil
import sys
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

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

GROUP = (
    "group commit (unflushThreshold=0): acks after the fdatasync that covers the message; "
    "an acked message survives power loss"
)
THRESHOLD = (
    "threshold (unflushThreshold=1000, unflushInterval=1000 ms): acks before fsync; "
    "power loss loses up to 1000 msgs / 1 s of acked messages"
)
ASYNCIO = " - asyncio face: AsyncProducer on the caller's event loop (no app-to-I/O-thread handoff)"
PARTITIONS = 1
THROUGHPUT_LINGER_MS = 5
LATENCY_LINGER_MS = 0
ASYNC_WINDOW = 32  # produce (asyncio face): unacknowledged send_many handles at most
RECORD_HEADER = 20  # MetaQ's message header: every record of a produce_each topic is 20 + size

SERVER_INI = """\
[system]
brokerId=0
hostName=127.0.0.1
serverPort={port}
dashboardHttpPort={http_port}
dataPath={data}
numPartitions={partitions}
unflushThreshold=0
unflushInterval=1000
maxSegmentSize=1073741824
maxTransferSize=1048576
producersSync={producers_sync}

[zookeeper]
zk.zkEnable=false

[topic=bench]

[topic=bench-g*]
unflushThreshold=0
unflushInterval=1000

[topic=bench-t*]
unflushThreshold=1000
unflushInterval=1000
"""


class PymetaqSystem(System):
    """``pymetaq``: the broker with its HTTP port on and ``/metrics`` scraped every
    ``SCRAPE_S`` (15x Prometheus's default rate) during every case; ``pymetaq-nometrics``: the
    same broker with ``dashboardHttpPort=0`` - the two in one run measure what monitoring costs;
    ``pymetaq-noidem``: the producers with ``idempotence=False`` (the plain ``bput``: no
    ``producers.idem`` entry to make durable) - what the default's exactly-once retries cost;
    ``pymetaq-idemfsync``: the broker with ``producersSync=fdatasync`` (the entry fdatasynced
    beside the log, a second device flush per round, instead of written in place before the
    log's flush)."""

    name = "pymetaq"
    metrics = True
    #: the producers' ``idempotence`` option (the client's default: True)
    idempotence = True
    #: the broker's ``[system] producersSync`` (its default: auto)
    producers_sync = "auto"
    modes = (
        Mode("group", GROUP),
        Mode("threshold", THRESHOLD),
        Mode("group-asyncio", GROUP + ASYNCIO),
        Mode("threshold-asyncio", THRESHOLD + ASYNCIO),
    )

    def __init__(self) -> None:
        self._server: ServerProcess | None = None
        self._port = 0
        self._workdir = Path()
        self._ids = itertools.count()
        self._client: Any = None  # the pymetaq.client module, once available
        self._offsets: Any = None  # pymetaq.offsets.FileOffsetStore
        self._scraper: Scraper | None = None

    def start(self, workdir: Path) -> None:
        self._client, self._offsets = _import_clients()
        argv0 = _server_command()
        self._workdir = workdir / "pymetaq"
        data = self._workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self._port = free_port()
        http_port = free_port() if self.metrics else 0
        ini = self._workdir / "server.ini"
        ini.write_text(
            SERVER_INI.format(
                port=self._port,
                http_port=http_port,
                data=data,
                partitions=PARTITIONS,
                producers_sync=self.producers_sync,
            )
        )
        argv = [*argv0, "server", "-f", str(ini)]
        self._server = ServerProcess(argv, self._workdir / "broker.log", self._port, self._workdir)
        self._server.wait_ready()
        if self.metrics:
            self._scraper = Scraper(f"http://127.0.0.1:{http_port}/metrics")
            self._scraper.start()

    def stop(self) -> None:
        if self._scraper is not None:
            self._scraper.stop()
            self._scraper = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    # ------------------------------------------------------------------ clients

    @property
    def _servers(self) -> str:
        return f"meta://127.0.0.1:{self._port}"

    def _topic(self, mode: str, case: str) -> str:
        return f"bench-{mode[0]}-{case}-{next(self._ids)}"

    def _producer_options(self, batch: int | None, linger_ms: int) -> dict[str, Any]:
        """What both faces' producers are built with (``batch`` None: the producer's own
        ``batch_messages``)."""
        options = {"linger_ms": linger_ms, "max_in_flight": 8, "idempotence": self.idempotence}
        if batch is not None:
            options["batch_messages"] = batch
        return options

    def _producer(self, batch: int | None, linger_ms: int) -> Any:
        return self._client.Producer(self._servers, **self._producer_options(batch, linger_ms))

    def _async_producer(self, batch: int | None, linger_ms: int) -> Any:
        return self._client.AsyncProducer(self._servers, **self._producer_options(batch, linger_ms))

    def _consumer(self, topic: str) -> Any:
        store = self._offsets(self._workdir / "offsets" / f"{topic}.json")
        recover = str(self._workdir / "recover")
        consumer = self._client.Consumer(self._servers, "bench", store, recover_dir=recover)
        consumer.subscribe(topic)
        return consumer

    # ------------------------------------------------------------------ cases

    def produce(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        count, elapsed, note = self._fill(
            self._topic(mode, "produce"), msg_bytes, batch, seconds, mode
        )
        return Throughput(count, count * msg_bytes, elapsed, note=note)

    def produce_each(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        topic = self._topic(mode, "each")
        value = filler(msg_bytes)
        # the producer's own batch_messages: the loop as a user writes it (``batch`` is how
        # many sends go between clock checks, and between yields on the asyncio face)
        if _asyncio_face(mode):
            producer = self._async_producer(None, THROUGHPUT_LINGER_MS)
            sent, elapsed, stored = asyncio.run(_each_async(producer, topic, value, batch, seconds))
        else:
            with self._producer(None, THROUGHPUT_LINGER_MS) as producer:
                producer.partitions(topic)
                send = producer.send_async
                sent = 0
                start = time.perf_counter()
                deadline = start + seconds
                while time.perf_counter() < deadline:
                    for _ in range(batch):
                        send(topic, value)
                    sent += batch
                producer.flush()
                elapsed = time.perf_counter() - start
                stored = _stored(producer.send(topic, value), msg_bytes)
        note = f"{sent - stored} of {sent} sends not stored" if stored != sent else ""
        return Throughput(stored, stored * msg_bytes, elapsed, note=note)

    def consume(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        topic = self._topic(mode, "consume")
        total, _, _ = self._fill(topic, msg_bytes, batch, seconds)
        consumer = self._consumer(topic)
        try:
            got = 0
            start = time.perf_counter()
            deadline = start + seconds
            while got < total and time.perf_counter() < deadline:
                got += len(consumer.poll(1.0).values())  # payloads as bytes, like the peers
            elapsed = time.perf_counter() - start
        finally:
            consumer.close()
        return Throughput(got, got * msg_bytes, elapsed, prefilled=total)

    def ack_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        topic = self._topic(mode, "ack")
        if _asyncio_face(mode):
            return asyncio.run(self._ack_latency_async(topic, rate, msg_bytes, batch, seconds))
        loop = OpenLoop(rate, seconds)
        rec = LatencyRecorder(loop.record_from_ns)
        producer = self._producer(batch, LATENCY_LINGER_MS)
        try:
            sent = _send_async_open_loop(producer, topic, loop, batch, msg_bytes, rec)
            producer.flush()
        finally:
            producer.close()
        elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
        return rec.result(rate, sent, elapsed, note=loop.shortfall_note(sent))

    async def _ack_latency_async(
        self, topic: str, rate: int, msg_bytes: int, batch: int, seconds: float
    ) -> Latency:
        """ack_latency through ``AsyncProducer``: the schedule runs on the event loop that does
        the I/O, and each message's ack is taken from its handle's callback."""
        async with self._async_producer(batch, LATENCY_LINGER_MS) as producer:
            await producer.publish(topic)
            loop = OpenLoop(rate, seconds)
            rec = LatencyRecorder(loop.record_from_ns)
            sent = await _send_nowait_open_loop(producer, topic, loop, batch, msg_bytes, rec)
            await producer.flush()
        elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
        return rec.result(rate, sent, elapsed, note=loop.shortfall_note(sent))

    def e2e_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        topic = self._topic(mode, "e2e")
        # The broker creates a topic's store on its first put: create it with one unstamped
        # message (stamp 0, skipped below) and position the consumer before the clock starts.
        warm = self._producer(batch, LATENCY_LINGER_MS)
        try:
            warm.send(topic, stamped(0, msg_bytes))
        finally:
            warm.close()
        consumer = self._consumer(topic)
        consumer.poll(0.1)
        loop = OpenLoop(rate, seconds)
        rec = LatencyRecorder(loop.record_from_ns)
        sent: list[int] = []

        async def produce_async() -> None:
            async with self._async_producer(batch, LATENCY_LINGER_MS) as producer:
                await producer.publish(topic)
                sent.append(await _send_nowait_open_loop(producer, topic, loop, batch, msg_bytes))
                await producer.flush()

        def produce() -> None:
            if _asyncio_face(mode):
                asyncio.run(produce_async())
                return
            producer = self._producer(batch, LATENCY_LINGER_MS)
            try:
                sent.append(_send_open_loop(producer, topic, loop, batch, msg_bytes, None))
                producer.flush()
            finally:
                producer.close()

        thread = threading.Thread(target=produce, name="pymetaq-e2e-producer", daemon=True)
        thread.start()
        try:
            got = 0
            deadline = time.monotonic() + seconds * 3 + 10
            while time.monotonic() < deadline and not (sent and got >= sent[0]):
                messages = consumer.poll(0.1)
                now = time.perf_counter_ns()
                for message in messages:
                    stamp = stamp_of(message.value)
                    if stamp:
                        rec.record(stamp, now)
                        got += 1
        finally:
            consumer.close()
            thread.join(30)
        elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
        total = sent[0] if sent else 0
        return rec.result(rate, total, elapsed, note=loop.shortfall_note(total))

    def _fill(
        self, topic: str, msg_bytes: int, batch: int, seconds: float, mode: str = "group"
    ) -> tuple[int, float, str]:
        """send_many ``batch`` messages at a time for ``seconds``, then flush."""
        values = [filler(msg_bytes)] * batch
        errors = _ErrorCount()
        if _asyncio_face(mode):
            return asyncio.run(_fill_async(self._async_producer(batch, 5), topic, values, seconds))
        producer = self._producer(batch, THROUGHPUT_LINGER_MS)
        sent = 0
        try:
            start = time.perf_counter()
            deadline = start + seconds
            while time.perf_counter() < deadline:
                producer.send_many(topic, values).add_done_callback(errors.on_done)
                sent += batch
            producer.flush()
            elapsed = time.perf_counter() - start
        finally:
            producer.close()
        note = f"{errors.count} sends failed: {errors.first!r}" if errors.count else ""
        return sent - errors.count, elapsed, note


def _stored(last: Any, msg_bytes: int) -> int:
    """How many records precede ``last`` (a SendResult) in its one-partition topic."""
    if not last.success:
        raise RuntimeError(f"the final send failed: {last.error!r}")
    return int(last.offset) // (RECORD_HEADER + msg_bytes)


async def _each_async(
    producer: Any, topic: str, value: bytes, batch: int, seconds: float
) -> tuple[int, float, int]:
    """produce_each through ``AsyncProducer.send_nowait``: ``batch`` sends, then a yield to the
    loop (which does the I/O); at most ``ASYNC_WINDOW`` bursts unacknowledged."""
    async with producer:
        await producer.publish(topic)
        send = producer.send_nowait
        pending: list[Any] = []
        sent = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(batch):
                handle = send(topic, value)
            sent += batch
            pending.append(handle)
            if len(pending) >= ASYNC_WINDOW:
                await pending.pop(0)
            else:
                await asyncio.sleep(0)
        await producer.flush()
        elapsed = time.perf_counter() - start
        last = await producer.send(topic, value)
    return sent, elapsed, _stored(last, len(value))


class _ErrorCount:
    """Counts failed messages from completed batch handles (on the client's I/O thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.first: BaseException | None = None

    def on_done(self, handle: Any) -> None:
        if handle.exception() is not None:
            failed = sum(1 for r in handle.result(0) if not r.success)
            with self._lock:
                self.count += failed
                self.first = self.first or handle.exception()


def _send_open_loop(
    producer: Any,
    topic: str,
    loop: OpenLoop,
    batch: int,
    msg_bytes: int,
    rec: LatencyRecorder | None,
) -> int:
    """Sends ``loop``'s schedule, whatever is due at once (one ``send_many``); records acks."""
    sent = 0
    for due in loop.batches(batch):
        scheduled = [loop.scheduled_ns(i) for i in due]
        handle = producer.send_many(topic, [stamped(t, msg_bytes) for t in scheduled])
        if rec is not None:
            handle.add_done_callback(_recorder(rec, scheduled))
        sent = due.stop
    return sent


def _send_async_open_loop(
    producer: Any, topic: str, loop: OpenLoop, batch: int, msg_bytes: int, rec: LatencyRecorder
) -> int:
    """``loop``'s schedule through the public per-message API: every due message is one
    ``send_async``, and its ack is taken from its own handle's callback (measured from the
    message's scheduled time, so a sender that falls behind shows in the figures)."""
    sent = 0
    send = producer.send_async
    for due in loop.batches(batch):
        for i in due:
            t = loop.scheduled_ns(i)
            send(topic, stamped(t, msg_bytes)).add_done_callback(partial(_acked, rec, t))
        sent = due.stop
    return sent


async def _fill_async(
    producer: Any, topic: str, values: list[bytes], seconds: float
) -> tuple[int, float, str]:
    """``_fill`` through ``AsyncProducer.send_many``, yielding to the loop between batches
    (and waiting while ``ASYNC_WINDOW`` batches are unacknowledged, as the thread face's buffer
    limit would). Completion is taken from ``add_done_callback``, as in the thread face's
    ``_fill``: awaiting a handle would also build its list of SendResults, which neither face
    needs here."""
    errors = _ErrorCount()
    sent = 0
    async with producer:
        await producer.publish(topic)
        window = asyncio.Semaphore(ASYNC_WINDOW)

        def done(handle: Any) -> None:
            errors.on_done(handle)
            window.release()

        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            await window.acquire()
            producer.send_many(topic, values).add_done_callback(done)
            sent += len(values)
            await asyncio.sleep(0)
        await producer.flush()
        elapsed = time.perf_counter() - start
    note = f"{errors.count} sends failed: {errors.first!r}" if errors.count else ""
    return sent - errors.count, elapsed, note


async def _send_nowait_open_loop(
    producer: Any,
    topic: str,
    loop: OpenLoop,
    batch: int,
    msg_bytes: int,
    rec: LatencyRecorder | None = None,
) -> int:
    """``loop``'s schedule on the event loop: every due message is one ``send_nowait``
    (acks recorded from each handle's callback when ``rec`` is given), then the loop runs
    its I/O. Pacing: a wait shorter than 50 us blocks in ``time.sleep`` (the selector's
    timeout has 1 ms granularity), a longer one is an ``asyncio.sleep``."""
    sent = 0
    send = producer.send_nowait
    async for due in loop.abatches(batch, _fine_pause):
        for i in due:
            t = loop.scheduled_ns(i)
            handle = send(topic, stamped(t, msg_bytes))
            if rec is not None:
                handle.add_done_callback(partial(_acked, rec, t))
        sent = due.stop
    return sent


async def _fine_pause(delay: float) -> None:
    """A pacing wait on the event loop: under 50 us it blocks in ``time.sleep`` (the
    selector's timeout has 1 ms granularity), a longer one is an ``asyncio.sleep``."""
    if delay < 50e-6:
        time.sleep(delay)
        await asyncio.sleep(0)
    else:
        await asyncio.sleep(delay)


def _asyncio_face(mode: str) -> bool:
    return mode.endswith("-asyncio")


def _acked(rec: LatencyRecorder, scheduled: int, handle: Any) -> None:
    """A message's ack (on the producer's I/O thread); failures are not recorded."""
    now = time.perf_counter_ns()
    if handle.exception() is None:
        rec.record(scheduled, now)


def _recorder(rec: LatencyRecorder, scheduled: list[int]) -> Any:
    def done(handle: Any) -> None:
        if handle.exception() is None:
            now = time.perf_counter_ns()
            for t in scheduled:
                rec.record(t, now)

    return done


SCRAPE_S = 1.0


class Scraper(threading.Thread):
    """GETs ``/metrics`` every ``SCRAPE_S`` until stopped, as a (busy) Prometheus would."""

    def __init__(self, url: str) -> None:
        super().__init__(name="bench-scraper", daemon=True)
        self.url = url
        self.stopping = threading.Event()
        self.scrapes = 0

    def run(self) -> None:
        while not self.stopping.wait(SCRAPE_S):
            with urllib.request.urlopen(self.url, timeout=10) as reply:
                reply.read()
            self.scrapes += 1

    def stop(self) -> None:
        self.stopping.set()
        self.join(15)
        if self.scrapes == 0:
            raise RuntimeError(f"{self.url} was never scraped")


class PymetaqNoMetricsSystem(PymetaqSystem):
    name = "pymetaq-nometrics"
    metrics = False


class PymetaqNoIdemSystem(PymetaqSystem):
    name = "pymetaq-noidem"
    idempotence = False


class PymetaqIdemFsyncSystem(PymetaqSystem):
    name = "pymetaq-idemfsync"
    producers_sync = "fdatasync"


def _import_clients() -> tuple[Any, Any]:
    """(pymetaq.client, FileOffsetStore), or SystemUnavailable while they are not written yet."""
    try:
        client = importlib.import_module("pymetaq.client")
        offsets = importlib.import_module("pymetaq.offsets")
    except ImportError as exc:
        raise SystemUnavailable(f"pymetaq: client not importable yet ({exc})") from exc
    missing = [n for n in ("Producer", "Consumer") if not hasattr(client, n)]
    if missing or not hasattr(offsets, "FileOffsetStore"):
        raise SystemUnavailable(
            f"pymetaq: client not available yet (pymetaq.client lacks {', '.join(missing)})"
        )
    return client, offsets.FileOffsetStore


def _server_command() -> list[str]:
    """The ``pymetaq`` console script of this interpreter's environment."""
    if importlib.util.find_spec("pymetaq.server.cli") is None:
        raise SystemUnavailable("pymetaq: broker CLI (pymetaq.server.cli) not available yet")
    script = Path(sys.executable).with_name("pymetaq")
    if script.exists():
        return [str(script)]
    found = shutil.which("pymetaq")
    if found is None:
        raise SystemUnavailable("pymetaq: the `pymetaq` console script is not installed")
    return [found]
