"""Redis Streams as a benchmark peer: ``redis-server`` with an append-only file, ``redis-py``.

Server: ``redis-server --appendonly yes --appendfsync everysec --save ""`` on a free 127.0.0.1
port with its directory under the run's workdir. RDB snapshots are off (``save ""``) so a
background fork does not land in the middle of a case; AOF rewrites keep their defaults.
Modes: ``everysec`` (the configuration above, the default) and ``always`` (``CONFIG SET
appendfsync always`` before the case), the durable-ack counterpart of pymetaq's group commit.

Client calls (redis-py, synchronous, RESP2):

- produce: one non-transactional pipeline of ``batch`` ``XADD key * v <payload>`` per round trip
  (batched like our producer); throughput counts replies received. It is one ``pipe.xadd``
  call per message, so it is also ``produce_each`` (the peer of pymetaq's per-message
  ``send_async`` loop: the same code, reported under both cases).
- consume: the stream is pre-filled (``seconds`` of produce, not timed), then
  ``XREADGROUP GROUP g c COUNT batch STREAMS key >`` in a pipeline with the ``XACK`` of the
  previous batch (at-least-once, like committing an offset).
- latency: open-loop XADD pipelines of whatever is due; e2e reads with ``XREADGROUP ... BLOCK``
  in a second thread and connection.

Durability when Redis acks: everysec — the write reaches the AOF in the OS page cache before the
reply, fsync runs once per second in a background thread → a process crash loses nothing acked,
power loss loses up to about 1 s (2 s if an fsync stalls) of acked writes. always — the AOF is
fsynced before the replies of that event-loop iteration are sent.

Thread-safety: one runner thread; ``e2e_latency`` adds a producer thread with its own connection.
"""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import redis

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

FIELD = b"v"
DURABILITY = (
    "appendfsync everysec: acks after write() to the AOF, before fsync; "
    "power loss loses up to ~1 s of acked messages (process crash: none)"
)
ALWAYS = (
    "appendfsync always: acks after the AOF fsync of the event-loop iteration that wrote it "
    "(one fsync per iteration, shared by a pipeline); an acked message survives power loss"
)


class RedisSystem(System):
    name = "redis"
    modes = (Mode("everysec", DURABILITY), Mode("always", ALWAYS))

    def __init__(self) -> None:
        self._server: ServerProcess | None = None
        self._port = 0
        self._keys = itertools.count()

    def start(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemUnavailable("redis: redis-server not found on PATH")
        data = workdir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        self._port = free_port()
        argv = [
            binary,
            "--port", str(self._port), "--bind", "127.0.0.1", "--dir", str(data),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--protected-mode", "no", "--daemonize", "no", "--logfile", "",
        ]  # fmt: skip
        self._server = ServerProcess(argv, data / "redis.log", self._port)
        self._server.wait_ready()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def _client(self, mode: str | None = None) -> redis.Redis:
        """A connection; with ``mode``, first switches the server's appendfsync to it."""
        r = redis.Redis(host="127.0.0.1", port=self._port, socket_timeout=30)
        if mode is not None:
            r.config_set("appendfsync", self.mode(mode).name)
        return r

    def _key(self, case: str) -> str:
        return f"bench-{case}-{next(self._keys)}"

    def produce(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        r = self._client(mode)
        key = self._key("produce")
        try:
            count, elapsed = _fill(r, key, filler(msg_bytes), batch, seconds)
            return Throughput(count, count * msg_bytes, elapsed)
        finally:
            r.delete(key)
            r.close()

    def produce_each(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        return self.produce(msg_bytes, batch, seconds, mode)

    def consume(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        r = self._client(mode)
        key = self._key("consume")
        try:
            total, _ = _fill(r, key, filler(msg_bytes), batch, seconds)
            r.xgroup_create(key, "g", id="0")
            pipe = r.pipeline(transaction=False)
            got, pending = 0, list[bytes]()
            start = time.perf_counter()
            deadline = start + seconds
            while got < total and time.perf_counter() < deadline:
                if pending:
                    pipe.xack(key, "g", *pending)
                pipe.xreadgroup("g", "c", {key: ">"}, count=batch)
                entries = _entries(pipe.execute()[-1])
                pending = [entry_id for entry_id, _ in entries]
                got += len(entries)
            if pending:
                r.xack(key, "g", *pending)
            elapsed = time.perf_counter() - start
            return Throughput(got, got * msg_bytes, elapsed, prefilled=total)
        finally:
            r.delete(key)
            r.close()

    def ack_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        r = self._client(mode)
        key = self._key("ack")
        try:
            loop = OpenLoop(rate, seconds)
            rec = LatencyRecorder(loop.record_from_ns)
            sent = _send_open_loop(r, key, loop, batch, msg_bytes, rec)
            elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
            return rec.result(rate, sent, elapsed, note=loop.shortfall_note(sent))
        finally:
            r.delete(key)
            r.close()

    def e2e_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        r = self._client(mode)
        key = self._key("e2e")
        try:
            r.xgroup_create(key, "g", id="$", mkstream=True)
            loop = OpenLoop(rate, seconds)
            rec = LatencyRecorder(loop.record_from_ns)
            sent: list[int] = []

            def produce() -> None:
                pr = self._client()
                try:
                    sent.append(_send_open_loop(pr, key, loop, batch, msg_bytes, None))
                finally:
                    pr.close()

            producer = threading.Thread(target=produce, name="redis-e2e-producer", daemon=True)
            producer.start()
            _receive(r, key, batch, rec, lambda: sent[0] if sent else None, seconds * 3 + 10)
            producer.join(30)
            elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
            total = sent[0] if sent else 0
            return rec.result(rate, total, elapsed, note=loop.shortfall_note(total))
        finally:
            r.delete(key)
            r.close()


def _fill(r: redis.Redis, key: str, value: bytes, batch: int, seconds: float) -> tuple[int, float]:
    """XADD pipelines of ``batch`` for ``seconds``; returns (messages acked, elapsed s)."""
    pipe = r.pipeline(transaction=False)
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(batch):
            pipe.xadd(key, {FIELD: value})
        count += len(pipe.execute())
    return count, time.perf_counter() - start


def _send_open_loop(
    r: redis.Redis,
    key: str,
    loop: OpenLoop,
    batch: int,
    msg_bytes: int,
    rec: LatencyRecorder | None,
) -> int:
    """Sends ``loop``'s schedule as pipelines of whatever is due; records acks into ``rec``."""
    pipe = r.pipeline(transaction=False)
    sent = 0
    for due in loop.batches(batch):
        for i in due:
            pipe.xadd(key, {FIELD: stamped(loop.scheduled_ns(i), msg_bytes)})
        pipe.execute()
        done = time.perf_counter_ns()
        if rec is not None:
            for i in due:
                rec.record(loop.scheduled_ns(i), done)
        sent = due.stop
    return sent


def _receive(
    r: redis.Redis,
    key: str,
    batch: int,
    rec: LatencyRecorder,
    sent_total: Any,
    timeout_s: float,
) -> None:
    """Reads the group until ``sent_total()`` messages arrived (or ``timeout_s``)."""
    pipe = r.pipeline(transaction=False)
    got, pending = 0, list[bytes]()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        total = sent_total()
        if total is not None and got >= total:
            break
        if pending:
            pipe.xack(key, "g", *pending)
        pipe.xreadgroup("g", "c", {key: ">"}, count=batch, block=100)
        entries = _entries(pipe.execute()[-1])
        now = time.perf_counter_ns()
        for _, fields in entries:
            rec.record(stamp_of(fields[FIELD]), now)
        pending = [entry_id for entry_id, _ in entries]
        got += len(entries)
    if pending:
        r.xack(key, "g", *pending)


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of a one-stream XREADGROUP reply (RESP2: [[key, [(id, fields), ...]]])."""
    if not reply:
        return []
    return list(reply[0][1])
