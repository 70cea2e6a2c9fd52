"""Storage engine benchmark: durable (group-commit) appends vs the raw write+fdatasync bound.

For each case (message size x batch size) a producer thread appends pre-built batches (records
with header + CRC, id 0, as a producer client sends them) to one partition in group-commit mode,
keeping at most ``--inflight`` un-acknowledged appends; the flusher thread fsyncs and acks.
Latency is append() -> on_durable.  The bound is measured in the same run: the same batch bytes
written with ``os.write`` + ``os.fdatasync`` per batch (no Python per message, no sharing).

Output: one JSON line per case (``--json``) with case, msg_bytes, batch, msgs_per_s, MB_per_s
(record bytes incl. the 20-byte header), p50_ms, p99_ms, bound_msgs_per_s, ratio; a human table
on stderr (stdout without ``--json``); progress on stderr.

    .venv/bin/python bench/storage.py --seconds 3 --json
    .venv/bin/python bench/storage.py --seconds 3 --profile 100x1000   # cProfile one case
    .venv/bin/python bench/storage.py --seconds 3 --segment-writes mmap   # the mapped path
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time

from pymetaq.storage import AppendResult, MessageStoreManager, StoreConfig, TopicStoreConfig
from pymetaq.storage.config import WRITE_MODES
from pymetaq.storage.record import encode_record

CASES = [(100, 1), (100, 100), (100, 1000), (1024, 1), (1024, 100), (1024, 1000)]


def build_batch(msg_bytes: int, batch: int) -> bytearray:
    out = bytearray()
    for i in range(batch):
        out += encode_record(os.urandom(msg_bytes - 8) + i.to_bytes(8, "big"))
    return out


def pct(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(p * len(sorted_vals)))]


def run_store(
    directory: str,
    buf: bytearray,
    batch: int,
    seconds: float,
    inflight: int,
    writes: str = "pwrite",
) -> dict[str, float]:
    cfg = TopicStoreConfig(unflush_threshold=0)
    m = MessageStoreManager(StoreConfig(directory, segment_writes=writes), lambda t: cfg)
    m.open()
    m.start()
    plog = m.get_log("bench", 0)
    assert plog is not None
    sem = threading.Semaphore(inflight)
    lat: list[float] = []
    acked = [0]
    perf = time.perf_counter

    def cb(_r: AppendResult, e: BaseException | None, t0: float) -> None:
        if e is not None:
            raise e
        lat.append(perf() - t0)
        acked[0] += 1
        sem.release()

    n = 0
    start = perf()
    deadline = start + seconds
    while perf() < deadline:
        sem.acquire()
        t0 = perf()
        plog.append(buf, on_durable=lambda r, e, t0=t0: cb(r, e, t0))
        n += 1
    for _ in range(inflight):  # drain
        sem.acquire()
    elapsed = perf() - start
    m.close()
    lat.sort()
    return {
        "msgs_per_s": acked[0] * batch / elapsed,
        "MB_per_s": acked[0] * len(buf) / elapsed / 1e6,
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "appends": n,
    }


def run_bound(directory: str, buf: bytearray, batch: int, seconds: float) -> float:
    path = os.path.join(directory, "bound.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    data = bytes(buf)
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    try:
        while time.perf_counter() < deadline:
            os.write(fd, data)
            os.fdatasync(fd)
            n += 1
    finally:
        os.close(fd)
        os.unlink(path)
    return n * batch / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="per case and per bound")
    ap.add_argument("--json", action="store_true", help="JSON lines on stdout, table on stderr")
    ap.add_argument("--inflight", type=int, default=16, help="max un-acked appends (K)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--cases", default=None, help="e.g. 100x1000,1024x100")
    ap.add_argument("--profile", default=None, help="cProfile this case, e.g. 100x1000")
    ap.add_argument(
        "--segment-writes",
        choices=WRITE_MODES,
        default="pwrite",
        help="how appends reach the segment file (the broker's [system] segmentWrites)",
    )
    args = ap.parse_args(argv)
    cases = CASES
    if args.cases:
        cases = [tuple(map(int, c.split("x"))) for c in args.cases.split(",")]  # type: ignore[misc]
    root = tempfile.mkdtemp(prefix="pymetaq-bench-", dir=args.dir)
    rows = []
    try:
        if args.profile:
            msg, b = map(int, args.profile.split("x"))
            buf = build_batch(msg, b)
            prof = cProfile.Profile()
            prof.enable()
            res = run_store(
                os.path.join(root, "p"), buf, b, args.seconds, args.inflight, args.segment_writes
            )
            prof.disable()
            print(json.dumps({"case": args.profile, **res}), file=sys.stderr)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
            return 0
        for i, (msg, b) in enumerate(cases):
            print(
                f"[{i + 1}/{len(cases)}] {msg} B x {b}: store ...",
                file=sys.stderr,
                end="",
                flush=True,
            )
            buf = build_batch(msg, b)
            res = run_store(
                os.path.join(root, f"c{i}"),
                buf,
                b,
                args.seconds,
                args.inflight,
                args.segment_writes,
            )
            print(" bound ...", file=sys.stderr, end="", flush=True)
            bound = run_bound(root, buf, b, args.seconds)
            print(" done", file=sys.stderr, flush=True)
            row = {
                "case": f"{msg}x{b}",
                "msg_bytes": msg,
                "batch": b,
                "inflight": args.inflight,
                "seconds": args.seconds,
                **{k: round(v, 3) for k, v in res.items()},
                "bound_msgs_per_s": round(bound, 1),
                "ratio": round(res["msgs_per_s"] / bound, 3),
            }
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = sys.stderr if args.json else sys.stdout
    hdr = f"{'case':>10} {'msgs/s':>12} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'bound msgs/s':>13} {'ratio':>6}"
    print(hdr, file=table)
    for r in rows:
        print(
            f"{r['case']:>10} {r['msgs_per_s']:>12,.0f} {r['MB_per_s']:>8.1f} {r['p50_ms']:>8.2f} "
            f"{r['p99_ms']:>8.2f} {r['bound_msgs_per_s']:>13,.0f} {r['ratio']:>6.2f}",
            file=table,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
