"""``pymetaq tail`` benchmark: the agent (a real ``pymetaq tail`` process) shipping one file into
a broker subprocess (group commit: a batch is acknowledged after its fsync).

* **throughput**: a file of ``--lines`` 100-byte lines written before the agent starts; lines/s
  from the agent's start line to its checkpoint reaching the end of the file (every line
  acknowledged and checkpointed), and the agent's CPU (user + system, from ``wait4``) per
  100k lines, less the CPU of a run over an empty file (start-up and shutdown);
* **delay**: lines written at ``--rate`` lines/s (open loop: line *i* is due at
  ``start + i/rate`` and carries that time) while the agent runs; the delay from a line's due
  time to its arrival at a consumer long-polling the topic, p50/p99. That is write -> read by
  the agent -> sent -> stored and fsynced -> acknowledged -> fetched: an upper bound of
  write -> acknowledged (the fetch adds the consumer's long-poll wake-up).

Output: a JSON line per case on stdout and a table on stderr.

    .venv/bin/python -m bench.tail --lines 200000 --rate 10000 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import ServerProcess, free_port, progress

LINE = 100


def start_broker(workdir: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    ini = workdir / "server.ini"
    ini.write_text(
        f"[system]\nserverPort={port}\ndashboardHttpPort=0\ndataPath={workdir / 'data'}\n"
        "numPartitions=1\nunflushThreshold=0\n[zookeeper]\nzk.zkEnable=false\n[topic=logs]\n"
    )
    argv = [sys.executable, "-m", "pymetaq.server.cli", "server", "-f", str(ini)]
    server = ServerProcess(argv, workdir / "broker.log", port)
    server.wait_ready()
    return server, f"meta://127.0.0.1:{port}"


class Agent:
    """A ``pymetaq tail`` process; ``stop()`` returns its CPU seconds."""

    def __init__(self, servers: str, path: Path, checkpoint: Path) -> None:
        argv = [sys.executable, "-m", "pymetaq.server.cli", "tail", "--servers", servers,
                "--topic", "logs", "--checkpoint", str(checkpoint), str(path)]  # fmt: skip
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        seen = ""
        while "following" not in seen:  # the start line (after a line per file found)
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"the agent did not start: {seen}")
            seen += line
        self.started = time.perf_counter()
        # the rest of its log is drained so that it never blocks on a full pipe
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> float:
        self.proc.send_signal(signal.SIGTERM)
        _pid, _status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = 0
        return usage.ru_utime + usage.ru_stime


def checkpoint_pos(checkpoint: Path) -> int:
    try:
        doc = json.loads(checkpoint.read_text())
    except (OSError, ValueError):
        return -1
    return max((f["pos"] for f in doc["files"].values()), default=0)


def line(i: int) -> bytes:
    return f"{i:020d} ".encode().ljust(LINE - 1, b"x") + b"\n"


def throughput(servers: str, work: Path, lines: int) -> dict[str, float]:
    empty = work / "empty.log"
    empty.write_bytes(b"")
    a = Agent(servers, empty, work / "cp-empty.json")
    time.sleep(1.0)  # an idle agent: what start-up and a second of idling cost
    base_cpu = a.stop()
    path = work / "big.log"
    with open(path, "wb") as f:
        for start in range(0, lines, 10000):
            f.write(b"".join(line(i) for i in range(start, min(lines, start + 10000))))
    size = path.stat().st_size
    cp = work / "cp-big.json"
    a = Agent(servers, path, cp)
    deadline = time.monotonic() + 600
    while checkpoint_pos(cp) < size:
        if time.monotonic() > deadline:
            raise RuntimeError("the agent did not ship the file within 600 s")
        time.sleep(0.01)
    elapsed = time.perf_counter() - a.started
    cpu = a.stop()
    return {
        "lines": lines,
        "seconds": round(elapsed, 3),
        "lines_per_s": round(lines / elapsed),
        "mb_per_s": round(size / elapsed / 1e6, 1),
        "cpu_s_per_100k": round(max(0.0, cpu - base_cpu) * 100_000 / lines, 3),
        "cpu_idle_run_s": round(base_cpu, 3),
    }


def delay(servers: str, work: Path, rate: int, seconds: float) -> dict[str, float]:
    from pymetaq.client.consumer.sync import Consumer
    from pymetaq.client.types import TopicPartition

    path = work / "live.log"
    path.write_bytes(b"")
    total = int(rate * seconds)
    delays: list[int] = []
    tp = TopicPartition("logs", 0, 0)
    with Consumer(servers, None) as c:  # long-poll gets: woken by the append
        c.assign([tp])
        c.seek_to_end(tp)
        c.poll(0.1)
        agent = Agent(servers, path, work / "cp-live.json")

        def write() -> None:
            with open(path, "ab", buffering=0) as f:
                start = time.perf_counter_ns()
                i = 0
                while i < total:
                    now = time.perf_counter_ns()
                    due = min(total, int((now - start) * rate / 1e9) + 1)
                    if due > i:
                        f.write(b"".join(line(start + j * 10**9 // rate) for j in range(i, due)))
                        i = due
                    time.sleep(0.001)

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + seconds + 60
        while len(delays) < total and time.monotonic() < deadline:
            for m in c.poll(0.5):
                delays.append(time.perf_counter_ns() - int(m.value[:20]))
        writer.join()
        agent.stop()
    delays.sort()
    warm = delays[len(delays) // 10 :] or delays  # the first tenth: the agent warming up

    def pct(q: float) -> float:
        return round(warm[min(len(warm) - 1, int(q * len(warm)))] / 1e6, 2)

    return {
        "rate": rate,
        "lines": len(delays),
        "expected": total,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(warm[-1] / 1e6, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-tail-") as tmp:
        work = Path(tmp)
        server, servers = start_broker(work)
        try:
            progress("throughput")
            t = throughput(servers, work, args.lines)
            print(json.dumps({"case": "throughput", **t}), flush=True)
            progress(f"delay at {args.rate} lines/s")
            d = delay(servers, work, args.rate, args.seconds)
            print(json.dumps({"case": "delay", **d}), flush=True)
        finally:
            server.stop()
    print(
        f"\n{'case':<12}{'figure':>40}\n"
        f"{'throughput':<12}{t['lines_per_s']:>20,} lines/s {t['cpu_s_per_100k']:>8} CPU s/100k\n"
        f"{'delay':<12}{'p50 ' + str(d['p50_ms']) + ' ms  p99 ' + str(d['p99_ms']) + ' ms':>40}"
        f"  at {args.rate:,} lines/s ({d['lines']:,} of {d['expected']:,} lines)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
