"""The probes of ``python -m bench.timeline``, in whichever process they run.

* :func:`install_loop_lag` — every asyncio loop started after it (``run_forever``: the
  broker's loop, a ``LoopThread``'s, ``asyncio.run``'s) runs a task that sleeps ``period`` and
  records by how much its wake-up was late: ``(t_ns, lag_ns, loop name)``. A late wake-up means
  the loop was busy (or the process was not scheduled) for that long.
* :func:`install_gc` — ``gc.callbacks``: ``(start_ns, duration_ns, generation)`` per collection.
* :func:`install_fsync` — wraps ``StoreMetrics.sync_round`` (what the broker's fsync histogram
  records): ``(end_ns, duration_ns, messages)`` per fsync round of a log.
* :class:`ProcSampler` — a thread reading ``/proc/<pid>/stat`` (minor and major page faults,
  CPU ticks) of the given processes and ``/proc/stat`` (steal, iowait) every ``period``.
* :data:`MACHINE_PROBE` — a separate process (no other work, so no GIL or loop of ours in the
  way) that sleeps 1 ms in a loop and records every wake-up more than 1 ms late, until SIGTERM,
  then prints them as JSON: lag the machine itself (the scheduler, other processes) imposes.
* :func:`agent_main` — the broker-side entry (``python -c`` prologue of the timeline): installs
  the first three, runs ``pymetaq.server.cli.main()`` and writes what they recorded as JSON to
  the path in ``sys.argv[1]`` when the broker exits (SIGTERM: a clean exit).

Times are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux: one clock for every process on
the machine, so the broker's and the client's events line up). Recording is a list append.

Thread-safety: the recorders are lists appended under the GIL from any thread; read them after
the run.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import json
import os
import sys
import threading
import time
from typing import Any

from bench.common import machine_ticks

_now = time.perf_counter_ns

#: (t_ns, lag_ns, loop) — loop wake-ups later than asked
LOOP_LAG: list[tuple[int, int, str]] = []
#: (start_ns, duration_ns, generation)
GC_PAUSES: list[tuple[int, int, int]] = []
#: (end_ns, duration_ns, messages)
FSYNCS: list[tuple[int, int, int]] = []


MACHINE_PROBE = """
import json, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
now, out = time.perf_counter_ns, []
print("ready", flush=True)
while not stop:
    t0 = now()
    time.sleep(0.001)
    lag = now() - t0 - 1_000_000
    if lag > 1_000_000:
        out.append((now(), lag))
print(json.dumps(out), flush=True)
"""


def install_loop_lag(period_s: float = 0.001) -> None:
    """Start a lag probe on every event loop that starts running from now on."""
    base = asyncio.BaseEventLoop
    if getattr(base.run_forever, "_timeline", False):
        return
    original = base.run_forever
    period_ns = int(period_s * 1e9)

    async def probe(name: str) -> None:
        while True:
            t0 = _now()
            await asyncio.sleep(period_s)
            t1 = _now()
            LOOP_LAG.append((t1, t1 - t0 - period_ns, name))

    def run_forever(self: asyncio.BaseEventLoop) -> None:
        name = threading.current_thread().name
        task = self.create_task(probe(name))
        try:
            original(self)
        finally:
            task.cancel()

    run_forever._timeline = True  # type: ignore[attr-defined]
    base.run_forever = run_forever  # type: ignore[method-assign]


def install_gc() -> None:
    started: list[int] = [0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = _now()
        elif started[0]:
            GC_PAUSES.append((started[0], _now() - started[0], info.get("generation", -1)))

    gc.callbacks.append(callback)


def install_fsync() -> None:
    from pymetaq.storage.metrics import StoreMetrics

    original = StoreMetrics.sync_round

    def sync_round(self: StoreMetrics, seconds: float, nbytes: int, messages: int) -> None:
        FSYNCS.append((_now(), int(seconds * 1e9), messages))
        original(self, seconds, nbytes, messages)

    StoreMetrics.sync_round = sync_round  # type: ignore[method-assign]


def _stat_fields(pid: int | str) -> tuple[int, int, int] | None:
    """(minflt, majflt, utime+stime ticks) of a process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rindex(b")") + 2 :].split()  # after "pid (comm) "; fields from 3 on
    return int(rest[7]), int(rest[9]), int(rest[11]) + int(rest[12])


class ProcSampler:
    """Samples page faults and CPU ticks of ``pids`` (name -> pid) and the machine's steal and
    iowait every ``period_s``: rows ``(t_ns, {name: (minflt, majflt, ticks)}, steal, iowait)``."""

    def __init__(self, pids: dict[str, int], period_s: float = 0.005) -> None:
        self.pids = pids
        self.period_s = period_s
        self.rows: list[tuple[int, dict[str, tuple[int, int, int]], int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timeline-proc", daemon=True)

    def start(self) -> ProcSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            per: dict[str, tuple[int, int, int]] = {}
            for name, pid in self.pids.items():
                got = _stat_fields(pid)
                if got is not None:
                    per[name] = got
            steal, iowait = machine_ticks() or (0, 0)
            self.rows.append((_now(), per, steal, iowait))


def recorded() -> dict[str, Any]:
    return {"loop_lag": LOOP_LAG, "gc": GC_PAUSES, "fsync": FSYNCS, "pid": os.getpid()}


def agent_main() -> None:
    """Broker side: ``python -c <prologue> OUT server -f INI`` (see ``bench/timeline.py``)."""
    from pymetaq.server.cli import main as run

    out = sys.argv.pop(1)
    install_loop_lag()
    install_gc()
    install_fsync()

    def dump() -> None:
        with open(out, "w") as f:
            json.dump(recorded(), f)

    atexit.register(dump)
    sys.argv[0] = "pymetaq"
    code = run()
    dump()
    raise SystemExit(code)
