"""Shared pieces of the benchmark suite: result values, latency recording, open-loop scheduling,
payloads, server processes and plain-text tables.

Owns the measurement rules every system follows, so the systems differ only in client calls:

- **Throughput** = messages acknowledged (produce) or received (consume) ÷ the wall time from the
  first send/fetch to the last ack/receipt.
- **Latency is open-loop.** Message *i* is *scheduled* at ``start + i / rate``; the sender sends
  whatever is due (as one batch) and latency is measured from the scheduled time, not from the
  moment the send actually happened. A sender that falls behind therefore shows the queueing delay
  in its figures instead of hiding it (no coordinated omission). The first ``warmup`` of each run
  is sent but not recorded.
- **End-to-end payloads** carry their scheduled time (``>q`` nanoseconds of ``perf_counter_ns``,
  one process, one clock) in their first 8 bytes; the rest is random filler (incompressible).

Thread-safety: ``LatencyRecorder.record`` may be called from any thread (``list.append`` is atomic
under the GIL; ``completed`` is only ever incremented by one thread per run); everything else is
used by one thread at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

STAMP = struct.Struct(">q")
NS = 1_000_000_000


class BenchError(Exception):
    """Base class of benchmark faults."""

    retriable = False


class SystemUnavailable(BenchError):
    """The system cannot run here (binary or client library missing): skipped with a note."""


class ServerFailed(BenchError):
    """A server process did not come up, or died."""

    retriable = True


@dataclass(frozen=True)
class Mode:
    """One durability configuration of a system and what it promises when it acks."""

    name: str
    durability: str


@dataclass(frozen=True)
class Throughput:
    msgs: int
    payload_bytes: int
    seconds: float
    note: str = ""
    prefilled: int = 0  # consume: messages written before the timed part

    @property
    def msgs_per_s(self) -> float:
        return self.msgs / self.seconds if self.seconds > 0 else 0.0

    @property
    def mib_per_s(self) -> float:
        return self.payload_bytes / self.seconds / (1 << 20) if self.seconds > 0 else 0.0

    def metrics(self) -> dict[str, Any]:
        return {
            "msgs": self.msgs,
            "seconds": round(self.seconds, 4),
            "msgs_per_s": round(self.msgs_per_s, 1),
            "mib_per_s": round(self.mib_per_s, 2),
            "prefilled": self.prefilled,
            "note": self.note,
        }


@dataclass(frozen=True)
class Latency:
    offered_rate: int
    sent: int
    completed: int
    recorded: int
    seconds: float
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float
    note: str = ""

    def metrics(self) -> dict[str, Any]:
        return {
            "offered_rate": self.offered_rate,
            "sent": self.sent,
            "completed": self.completed,
            "recorded": self.recorded,
            "achieved_rate": round(self.completed / self.seconds, 1) if self.seconds else 0.0,
            "p50_us": round(self.p50_us, 1),
            "p99_us": round(self.p99_us, 1),
            "p999_us": round(self.p999_us, 1),
            "max_us": round(self.max_us, 1),
            "note": self.note,
        }


_N = TypeVar("_N", int, float)


def percentile(sorted_values: Sequence[_N], q: float) -> _N:
    """Nearest-rank percentile (q in [0, 100]) of an ascending sequence; 0 if empty."""
    if not sorted_values:
        return 0
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n * q / 100)
    return sorted_values[min(len(sorted_values), int(rank)) - 1]


_TRACE: list[tuple[int, int]] | None = None


def trace_latencies() -> list[tuple[int, int]]:
    """From now on every recorded sample is also appended to the returned list as
    (scheduled_ns, latency_ns) (diagnostics: ``bench/stalls.py``)."""
    global _TRACE
    _TRACE = []
    return _TRACE


class LatencyRecorder:
    """Collects (scheduled, completed) pairs in ns; samples scheduled before ``record_from_ns``
    (the warm-up) count as completed but are not recorded."""

    def __init__(self, record_from_ns: int) -> None:
        self.record_from_ns = record_from_ns
        self.samples: list[int] = []
        self.completed = 0

    def record(self, scheduled_ns: int, done_ns: int) -> None:
        self.completed += 1
        if scheduled_ns >= self.record_from_ns:
            self.samples.append(done_ns - scheduled_ns)
            if _TRACE is not None:
                _TRACE.append((scheduled_ns, done_ns - scheduled_ns))

    def result(self, rate: int, sent: int, seconds: float, note: str = "") -> Latency:
        values = sorted(self.samples)
        us = [percentile(values, q) / 1000 for q in (50, 99, 99.9)]
        return Latency(
            offered_rate=rate,
            sent=sent,
            completed=self.completed,
            recorded=len(values),
            seconds=seconds,
            p50_us=us[0],
            p99_us=us[1],
            p999_us=us[2],
            max_us=(values[-1] / 1000) if values else 0.0,
            note=note,
        )


class OpenLoop:
    """The schedule of an open-loop run: ``total`` messages at ``rate`` per second from ``start``.

    ``due(now_ns, sent, cap)`` says how many more messages are due now (at most ``cap``);
    ``scheduled_ns(i)`` is message i's scheduled send time; ``pause(sent)`` sleeps until the next
    one is due (a benchmark pacing sleep, at most 1 ms).
    """

    def __init__(self, rate: int, seconds: float, warmup_s: float | None = None) -> None:
        self.rate = rate
        self.total = max(1, int(rate * seconds))
        self.start_ns = time.perf_counter_ns()
        warm = min(0.5, seconds * 0.2) if warmup_s is None else warmup_s
        self.record_from_ns = self.start_ns + int(warm * NS)
        self.give_up_ns = self.start_ns + int(3 * seconds * NS)

    def gave_up(self, now_ns: int) -> bool:
        """True after 3x the planned duration: the system cannot sustain the offered rate."""
        return now_ns > self.give_up_ns

    def shortfall_note(self, sent: int) -> str:
        """A note for the result when the run gave up before sending the whole schedule."""
        if sent < self.total:
            return f"could not sustain the offered rate: sent {sent} of {self.total} in 3x the time"
        return ""

    def scheduled_ns(self, i: int) -> int:
        return self.start_ns + i * NS // self.rate

    def due(self, now_ns: int, sent: int, cap: int) -> int:
        by_now = min(self.total, (now_ns - self.start_ns) * self.rate // NS + 1)
        return max(0, min(cap, by_now - sent))

    def wait_s(self, sent: int) -> float:
        """Seconds until message ``sent`` is due (0 if due already), capped at 1 ms."""
        delta = (self.scheduled_ns(sent) - time.perf_counter_ns()) / NS
        return min(max(delta, 0.0), 0.001)

    def pause(self, sent: int) -> None:
        delay = self.wait_s(sent)
        if delay > 0:
            time.sleep(delay)

    def batches(self, cap: int) -> Iterator[range]:
        """The schedule as runs of due message indexes (at most ``cap`` each), pacing with
        :meth:`pause` while nothing is due; stops early once the run gives up.  Messages sent
        = the last run's ``stop`` (0 if none)."""
        sent = 0
        while sent < self.total:
            now = time.perf_counter_ns()
            if self.gave_up(now):
                return
            n = self.due(now, sent, cap)
            if n == 0:
                self.pause(sent)
                continue
            yield range(sent, sent + n)
            sent += n

    async def abatches(
        self, cap: int, pause: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> AsyncIterator[range]:
        """:meth:`batches` on an event loop: waits with ``pause(wait_s)`` while nothing is due,
        and yields to the loop (``asyncio.sleep(0)``) after each run so it can do its I/O."""
        sent = 0
        while sent < self.total:
            now = time.perf_counter_ns()
            if self.gave_up(now):
                return
            n = self.due(now, sent, cap)
            if n == 0:
                await pause(self.wait_s(sent))
                continue
            yield range(sent, sent + n)
            sent += n
            await asyncio.sleep(0)


def filler(msg_bytes: int) -> bytes:
    """Random (incompressible) payload of ``msg_bytes`` bytes, made once per size."""
    data = _FILLERS.get(msg_bytes)
    if data is None:  # not setdefault: that would call os.urandom on every message
        data = _FILLERS[msg_bytes] = os.urandom(msg_bytes)
    return data


_FILLERS: dict[int, bytes] = {}


def stamped(scheduled_ns: int, msg_bytes: int) -> bytes:
    """A payload of ``msg_bytes`` bytes (at least 8) whose first 8 carry ``scheduled_ns``.

    Runs once per message in every system's latency loop: the bytes after the stamp are
    sliced from the filler once per size (before: on every call, about half of this
    function's 1.1 us per message at 100k msgs/s in a py-spy profile of the client)."""
    tail = _TAILS.get(msg_bytes)
    if tail is None:
        tail = _TAILS[msg_bytes] = filler(msg_bytes)[STAMP.size : max(msg_bytes, STAMP.size)]
    return _pack_stamp(scheduled_ns) + tail


_TAILS: dict[int, bytes] = {}
_pack_stamp = STAMP.pack


def stamp_of(payload: bytes) -> int:
    return int(STAMP.unpack_from(payload)[0])


def variant_table(
    found: dict[str, list[dict[str, float]]], fields: Sequence[str], first: str, width: int
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The A/B scripts' summary (``bench/send_cpu.py``, ``bench/round_cpu.py``): per variant
    (name -> its runs' rows), the median of each field, and the table's lines - a header, then
    one row per variant with each field's median and its min-max over the runs."""
    lines = [f"{first:<9}" + "".join(f"{f:>{width}}" for f in fields)]
    medians: dict[str, dict[str, float]] = {}
    for name, rows in found.items():
        medians[name] = {f: statistics.median(r[f] for r in rows) for f in fields}
        cells = [
            f"{medians[name][f]:,.0f} ({min(r[f] for r in rows):,.0f}-"
            f"{max(r[f] for r in rows):,.0f})"
            for f in fields
        ]
        lines.append(f"{name:<9}" + "".join(f"{c:>{width}}" for c in cells))
    return medians, lines


def machine_ticks() -> tuple[int, int] | None:
    """The whole machine's (steal, iowait) clock ticks so far, from ``/proc/stat``'s ``cpu``
    line (steal: CPU time the hypervisor did not give this VM), or None where there is no such
    file."""
    try:
        with open("/proc/stat", "rb") as f:
            cols = f.readline().split()
        return int(cols[8]), int(cols[5])
    except (OSError, IndexError, ValueError):
        return None


def parse_cpus(text: str) -> set[int]:
    """``--cpus``: "0" or "0,1" -> {0, 1}; ValueError with the reason when it is not a list of
    CPUs this process may run on."""
    try:
        cpus = {int(c) for c in text.split(",")}
    except ValueError:
        raise ValueError(f"a comma-separated list of CPU numbers, not {text!r}") from None
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ValueError(f"this process may run on CPUs {sorted(allowed)}, not {sorted(cpus)}")
    return cpus


def progress(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def text_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: the column names, then one line per row, columns left-aligned to
    their widest cell and separated by two spaces."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server started as a subprocess, output to ``log_path``, ready when its port accepts."""

    def __init__(self, argv: list[str], log_path: Path, port: int, cwd: Path | None = None) -> None:
        self.argv = argv
        self.log_path = log_path
        self.port = port
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd)

    def wait_ready(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"{self.argv[0]} exited {self.proc.returncode}: {self.tail()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        raise ServerFailed(f"{self.argv[0]} not listening on {self.port} after {timeout_s}s")

    def tail(self, n: int = 800) -> str:
        self._log.flush()
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self._log.close()
