"""Where a consumer's ``poll()`` spends its time: ``python bench/poll_timeline.py [--mode M] [--json]``.

One broker (``tests/_broker.py``), ``--messages`` messages of ``--size`` bytes in one
partition, one ungrouped consumer in this process reading them all with ``poll()`` (CRCs
checked), either counting them (``--mode len``) or building and reading every ``Message``
(``--mode messages``: ``for m in poll(): m.value``). Each ``poll()`` is cut into phases by
timestamps taken in the caller's thread and, through wrappers patched onto the client's
internals for this run only, in the I/O loop's thread:

| phase | from → to |
|---|---|
| ``to_loop`` | the caller calls ``poll()`` → the engine's ``poll`` starts on the loop thread |
| ``first_data`` | → the first bytes of a reply reach the connection's protocol (0 when the whole reply was read before the engine's ``poll`` started) |
| ``receive`` | → the whole reply is parsed (the engine's ``_on_data`` starts) |
| ``scan_apply`` | → the reply is scanned and buffered (``_on_data`` returns) |
| ``to_caller`` | → ``poll()`` returns in the caller's thread |
| ``poll`` | the whole call |
| ``iterate`` | the caller's loop over what it returned |

and ``queued``: the bytes already waiting in the connection's socket (``FIONREAD``) when
``poll()`` is called, i.e. how much of the read-ahead reply had arrived. Only polls that
went through every phase count (a poll served from the buffer has no reply to receive).
Prints a table of medians and 90th percentiles in µs (stderr with ``--json``) and, with
``--json``, one JSON line per phase.

Thread-safety: a script; the patched wrappers run on the threads they time.
"""

from __future__ import annotations

import argparse
import array
import fcntl
import itertools
import json
import statistics
import sys
import tempfile
import termios
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import percentile, text_table  # noqa: E402
from pymetaq.client import Producer  # noqa: E402
from pymetaq.client.consumer import Consumer, TopicPartition  # noqa: E402
from pymetaq.client.consumer import engine as engine_mod  # noqa: E402
from pymetaq.client.transport import connection as connection_mod  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402

PHASES = ("to_loop", "first_data", "receive", "scan_apply", "to_caller", "poll", "iterate")


class Marks:
    """The timestamps of the poll in progress (written by both threads, read between polls)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    def once(self, name: str) -> None:
        self.t.setdefault(name, time.perf_counter())


def instrument(marks: Marks) -> None:
    """Wrap the engine's ``poll`` and ``_on_data`` and the protocol's ``buffer_updated``."""
    engine = engine_mod.ConsumerEngine
    poll, on_data = engine.poll, engine._on_data
    protocol = connection_mod._Protocol
    received = protocol.buffer_updated

    async def timed_poll(self: Any, *args: Any, **kwargs: Any) -> Any:
        marks.once("loop")
        return await poll(self, *args, **kwargs)

    async def timed_on_data(self: Any, *args: Any, **kwargs: Any) -> Any:
        # only a reply handled after this poll reached the loop is this poll's (one handled
        # in between - a read-ahead, under load - would give a negative receive phase)
        mine = "loop" in marks.t
        if mine:
            marks.once("parsed")
        try:
            return await on_data(self, *args, **kwargs)
        finally:
            if mine:
                marks.once("applied")

    def timed_received(self: Any, nbytes: int) -> None:
        if "loop" in marks.t:
            marks.once("data")
        received(self, nbytes)

    engine.poll = timed_poll  # type: ignore[method-assign]
    engine._on_data = timed_on_data  # type: ignore[method-assign]
    protocol.buffer_updated = timed_received  # type: ignore[method-assign]


def queued(consumer: Consumer) -> int:
    """Bytes waiting in the consumer's one broker connection (-1 if it cannot be read)."""
    try:
        conn = consumer._engine.transport.brokers._brokers[0].conn  # type: ignore[attr-defined]
        sock = conn._transport.get_extra_info("socket")
        out = array.array("i", [0])
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, out)
        return int(out[0])
    except (AttributeError, IndexError, OSError):
        return -1


def run(port: int, total: int, mode: str) -> tuple[dict[str, list[float]], list[int], int]:
    """Read ``total`` messages; the phases of every complete poll (seconds), ``queued`` per
    poll, and the messages per poll's median."""
    marks = Marks()
    instrument(marks)
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    waiting: list[int] = []
    sizes: list[int] = []
    consumer = Consumer(f"meta://127.0.0.1:{port}", None, initial_position="earliest")
    consumer.subscribe("bench")
    consumer.assign([TopicPartition("bench", 0, 0)])
    with consumer:
        n = 0
        while n < total:
            marks.t.clear()
            ahead = queued(consumer)
            t0 = time.perf_counter()
            batch = consumer.poll(1.0)
            t1 = time.perf_counter()
            if mode == "len":
                k = len(batch)
            else:
                k = 0
                for m in batch:
                    k += m.value is not None
            t2 = time.perf_counter()
            n += k
            sizes.append(k)
            t = marks.t
            if not k or not all(x in t for x in ("loop", "parsed", "applied")):
                continue
            if t["applied"] > t1:  # the next reply's, read ahead: this poll was the buffer's
                continue
            if t["loop"] < t0:  # set by an earlier poll's coroutine (one that timed out on
                continue  # the caller's side) after the marks were cleared: not this poll's
            # no read after the loop turn began, or the first one after it was already the
            # next reply's (read ahead): this reply had been received before the poll
            data = t.get("data", t["loop"])
            if data > t["parsed"]:
                data = t["loop"]
            steps = (t0, t["loop"], data, t["parsed"], t["applied"], t1)
            for name, (a, b) in zip(PHASES, itertools.pairwise(steps)):
                phases[name].append(b - a)
            phases["poll"].append(t1 - t0)
            phases["iterate"].append(t2 - t1)
            waiting.append(ahead)
    return phases, waiting, int(statistics.median(sizes)) if sizes else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--mode", choices=("len", "messages"), default="messages")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    per_call = max(1, min(10_000, (1 << 20) // (args.size + 20)))
    topics = {"bench": {"numPartitions": 1}}
    with (
        tempfile.TemporaryDirectory(prefix="poll-timeline-") as tmp,
        BrokerProcess.start(Path(tmp), topics=topics) as b,
    ):
        with Producer(f"meta://127.0.0.1:{b.port}") as p:
            value = b"x" * args.size
            for _ in range(args.messages // per_call):
                p.send_many("bench", [value] * per_call, partition=0)
            p.flush()
        total = args.messages // per_call * per_call
        print(f"{total} messages of {args.size} bytes stored; reading", file=sys.stderr)
        phases, waiting, per_poll = run(b.port, total, args.mode)
    polls = len(phases["poll"])
    if not polls:
        print("no poll went through every phase (too few messages?)", file=sys.stderr)
        return 1
    rows = []
    for name in PHASES:
        values = sorted(phases[name])
        med, p90 = statistics.median(values), percentile(values, 90)
        rows.append((name, f"{med * 1e6:,.0f}", f"{p90 * 1e6:,.0f}", f"{med / per_poll * 1e9:.0f}"))
        if args.json:
            row = {"phase": name, "median_us": round(med * 1e6), "p90_us": round(p90 * 1e6)}
            print(json.dumps({**row, "ns_per_msg": round(med / per_poll * 1e9)}))
    waiting.sort()
    out = sys.stderr if args.json else sys.stdout
    print(f"mode {args.mode}: {polls} polls timed, {per_poll} messages per poll (median)", file=out)
    print(text_table(["phase", "median µs", "p90 µs", "ns/msg"], rows), file=out)
    print(f"queued at poll(): median {waiting[len(waiting) // 2]:,} bytes", file=out)
    if args.json:
        print(json.dumps({"queued_median_bytes": waiting[len(waiting) // 2], "polls": polls}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
