"""The harness floor: a "system" that acks every send at once, in process (``--systems null``).

It runs the same loops as the real systems (a completed ``concurrent.futures.Future`` per send, a
deque as the log, the same open-loop scheduler and recorder), so its figures are the ceiling the
Python harness itself imposes on this machine in this run: throughput no client can beat here, and
the latency added by scheduling, pacing sleeps and noise from other processes.

Thread-safety: one runner thread; ``e2e_latency`` adds one producer thread (deque appends and
pops are atomic).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path

from bench.common import (
    NS,
    Latency,
    LatencyRecorder,
    Mode,
    OpenLoop,
    Throughput,
    filler,
    stamp_of,
    stamped,
)
from bench.systems.base import System


class NullSystem(System):
    name = "null"
    modes = (Mode("none", "nothing: the harness floor (acks in process, keeps nothing)"),)

    def start(self, workdir: Path) -> None:
        pass

    def stop(self) -> None:
        pass

    def produce(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        count, elapsed = _fill(deque(), filler(msg_bytes), batch, seconds)
        return Throughput(count, count * msg_bytes, elapsed)

    def produce_each(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        return self.produce(msg_bytes, batch, seconds, mode)  # it is one call per message

    def consume(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        log: deque[bytes] = deque()
        total, _ = _fill(log, filler(msg_bytes), batch, seconds)
        got = 0
        start = time.perf_counter()
        deadline = start + seconds
        while log and time.perf_counter() < deadline:
            got += len([log.popleft() for _ in range(min(batch, len(log)))])
        elapsed = time.perf_counter() - start
        return Throughput(got, got * msg_bytes, elapsed, prefilled=total)

    def ack_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        loop = OpenLoop(rate, seconds)
        rec = LatencyRecorder(loop.record_from_ns)
        sent = _send_open_loop(deque(), loop, batch, msg_bytes, rec)
        elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
        return rec.result(rate, sent, elapsed, note=loop.shortfall_note(sent))

    def e2e_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        log: deque[bytes] = deque()
        loop = OpenLoop(rate, seconds)
        rec = LatencyRecorder(loop.record_from_ns)
        sent: list[int] = []
        thread = threading.Thread(
            target=lambda: sent.append(_send_open_loop(log, loop, batch, msg_bytes, None)),
            name="null-e2e-producer",
            daemon=True,
        )
        thread.start()
        got = 0
        deadline = time.monotonic() + seconds * 3 + 10
        while time.monotonic() < deadline and not (sent and got >= sent[0]):
            if not log:
                time.sleep(0.0001)  # the consumer's poll interval
                continue
            now = time.perf_counter_ns()
            while log:
                rec.record(stamp_of(log.popleft()), now)
                got += 1
        thread.join(30)
        elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
        total = sent[0] if sent else 0
        return rec.result(rate, total, elapsed, note=loop.shortfall_note(total))


def _ack(log: deque[bytes], value: bytes) -> Future[None]:
    log.append(value)
    fut: Future[None] = Future()
    fut.set_result(None)
    return fut


def _fill(log: deque[bytes], value: bytes, batch: int, seconds: float) -> tuple[int, float]:
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(batch):
            _ack(log, value)
        count += batch
    return count, time.perf_counter() - start


def _send_open_loop(
    log: deque[bytes], loop: OpenLoop, batch: int, msg_bytes: int, rec: LatencyRecorder | None
) -> int:
    sent = 0
    for due in loop.batches(batch):
        for i in due:
            _ack(log, stamped(loop.scheduled_ns(i), msg_bytes))
            if rec is not None:
                rec.record(loop.scheduled_ns(i), time.perf_counter_ns())
        sent = due.stop
    return sent
