"""End-to-end broker benchmark over raw TCP: ``python bench/e2e.py --seconds S [--json]``.

Starts a broker subprocess (``tests/_broker.py``: temporary server.ini, free port, group commit
unless ``--threshold N``) and runs each case in ``CASES`` for ``S`` seconds with 100-byte
messages (``--size``):

| case              | what                                                                   |
|-------------------|------------------------------------------------------------------------|
| produce_bput      | ``bput`` batches of ``--batch`` records, ``--inflight`` batches pipelined |
| produce_put       | MetaQ's 7-token ``put``, one message per request, 200 pipelined         |
| consume_get       | ``get`` with maxSize 1 MiB from offset 0, one request in flight          |
| producer_send_many | ``Producer.send_many`` of ``--batch`` messages per call (partition 1)  |
| producer_send_many_lz4 | the same with ``compression="lz4"``                                |
| producer_send_async | ``Producer.send_async`` per message; latency sampled 1 in 64          |
| consumer_poll     | ``Consumer.poll()`` of partition 0, CRCs checked, counted by ``len()``  |
| consumer_poll_values | the same, every payload taken with ``batch.values()``              |
| consumer_poll_messages | the same, a ``Message`` built and read per message              |
| consumer_listener | ``Consumer.start()`` with a listener called per message                |

Latency is per request (send → reply, closed loop); for the ``producer_*`` cases it is
publish → ack through the Producer API (per ``send_many`` call / per sampled message).  Output: one JSON line per case
(``case, msgs_per_s, MB_per_s, p50_ms, p99_ms, messages, seconds``) with ``--json``, and a human
table (stderr with ``--json``, else stdout).  Another case = a function ``(Ctx) -> Result``
appended to ``CASES``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import text_table  # noqa: E402
from pymetaq.client import BatchHandle, Producer, SendHandle  # noqa: E402
from pymetaq.client.consumer import Consumer, Messages, TopicPartition  # noqa: E402
from pymetaq.client.protocol import NEED_DATA, Limits, Parser, ResultReply, Role, ValueReply  # noqa: E402
from pymetaq.storage.checksum import checksum  # noqa: E402
from pymetaq.storage.record import encode_record, iter_records  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402

TOPIC = "bench"


@dataclass
class Ctx:
    address: tuple[str, int]
    seconds: float
    size: int
    batch: int
    inflight: int
    produced: dict[int, int] = field(default_factory=dict)  # partition -> messages


@dataclass
class Result:
    case: str
    messages: int
    seconds: float
    latencies_ms: list[float]
    bytes_per_msg: int

    def row(self) -> dict[str, object]:
        lat = sorted(self.latencies_ms) or [0.0]
        rate = self.messages / self.seconds if self.seconds else 0.0
        return {
            "case": self.case,
            "msgs_per_s": round(rate),
            "MB_per_s": round(rate * self.bytes_per_msg / 1e6, 2),
            "p50_ms": round(lat[len(lat) // 2], 3),
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3),
            "messages": self.messages,
            "seconds": round(self.seconds, 3),
        }


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _pipelined(
    ctx: Ctx, name: str, frame_for: Callable[[int], bytes], per_request: int, window: int
) -> Result:
    """Send frames with ``window`` requests in flight for ``ctx.seconds``; count acked messages."""
    sock = _connect(ctx.address)
    sent_at: dict[int, float] = {}
    latencies: list[float] = []
    slots = threading.Semaphore(window)
    done = threading.Event()
    acked = [0]
    errors: list[ResultReply] = []

    def reader() -> None:
        parser = Parser(Role.CLIENT)
        while not (done.is_set() and not sent_at):
            data = sock.recv(1 << 20)
            if not data:
                return
            parser.feed(data)
            now = time.perf_counter()
            while (event := parser.next_event()) is not NEED_DATA:
                assert isinstance(event, ResultReply)
                latencies.append((now - sent_at.pop(event.opaque)) * 1000)
                if event.code == 200:
                    acked[0] += per_request
                else:
                    errors.append(event)
                slots.release()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    start = time.perf_counter()
    deadline = start + ctx.seconds
    opaque = 0
    while time.perf_counter() < deadline:
        slots.acquire()
        opaque += 1
        frame = frame_for(opaque)
        sent_at[opaque] = time.perf_counter()
        sock.sendall(frame)
    done.set()
    for _ in range(window):
        slots.acquire()
    elapsed = time.perf_counter() - start
    sock.close()
    thread.join(5)
    if errors:
        raise RuntimeError(f"{name}: {len(errors)} error replies, first {errors[0]}")
    return Result(name, acked[0], elapsed, latencies, ctx.size)


def produce_bput(ctx: Ctx) -> Result:
    payload = b"x" * ctx.size
    body = b"".join(encode_record(payload) for _ in range(ctx.batch))
    head = b"bput %s 0 %d %d %d " % (TOPIC.encode(), len(body), ctx.batch, checksum(body))
    result = _pipelined(
        ctx, "produce_bput", lambda op: head + b"%d\r\n" % op + body, ctx.batch, ctx.inflight
    )
    ctx.produced[0] = ctx.produced.get(0, 0) + result.messages
    return result


def produce_put(ctx: Ctx) -> Result:
    payload = b"y" * ctx.size
    head = b"put %s 1 %d 0 %d " % (TOPIC.encode(), len(payload), checksum(payload))
    result = _pipelined(ctx, "produce_put", lambda op: head + b"%d\r\n" % op + payload, 1, 200)
    ctx.produced[1] = ctx.produced.get(1, 0) + result.messages
    return result


def consume_get(ctx: Ctx) -> Result:
    """Fetch partition 0 from the start (what produce_bput wrote) for up to ``ctx.seconds``."""
    sock = _connect(ctx.address)
    parser = Parser(Role.CLIENT, Limits(max_body=2 << 20))
    latencies: list[float] = []
    messages = offset = opaque = 0
    start = time.perf_counter()
    deadline = start + ctx.seconds
    while time.perf_counter() < deadline:
        opaque += 1
        t0 = time.perf_counter()
        sock.sendall(b"get %s g 0 %d 1048576 %d\r\n" % (TOPIC.encode(), offset, opaque))
        while (event := parser.next_event()) is NEED_DATA:
            parser.feed(sock.recv(1 << 21))
        latencies.append((time.perf_counter() - t0) * 1000)
        if isinstance(event, ResultReply):
            break  # 404: consumed everything produced
        assert isinstance(event, ValueReply)
        records = list(iter_records(event.data, offset, verify=False))
        messages += len(records)
        offset = records[-1].offset + records[-1].size
    elapsed = time.perf_counter() - start
    sock.close()
    return Result("consume_get", messages, elapsed, latencies, ctx.size)


# --- Producer-API cases (pymetaq.client.Producer; partition 1, so consume_get is unaffected) ---

PRODUCER_PARTITION = 1


def _producer(ctx: Ctx, **overrides: object) -> Producer:
    """A producer whose buffer holds two in-flight windows, so a closed-loop sender is paced
    by acks (as the raw ``bput`` case is by its window) instead of queueing without bound."""
    host, port = ctx.address
    window_bytes = ctx.inflight * ctx.batch * (ctx.size + 20)
    return Producer(
        f"meta://{host}:{port}",
        batch_messages=ctx.batch,
        max_in_flight=ctx.inflight,
        buffer_bytes=2 * window_bytes,
        **overrides,  # type: ignore[arg-type]
    )


def _producer_bulk(ctx: Ctx, name: str, **overrides: object) -> Result:
    """``send_many`` of ``ctx.batch`` messages per call for ``ctx.seconds``; latency per call
    (``send_many`` → its handle completes: every message of it acknowledged)."""
    payload = b"p" * ctx.size
    values = [payload] * ctx.batch
    latencies: list[float] = []
    failed = [0]

    def done_at(t0: float) -> Callable[[BatchHandle], None]:
        def done(h: BatchHandle) -> None:
            latencies.append((time.perf_counter() - t0) * 1000)
            if h.exception() is not None:
                failed[0] += sum(1 for r in h.result(0) if not r.success)

        return done

    with _producer(ctx, **overrides) as producer:
        producer.partitions(TOPIC)
        sent = 0
        start = time.perf_counter()
        deadline = start + ctx.seconds
        while time.perf_counter() < deadline:
            handle = producer.send_many(TOPIC, values, partition=PRODUCER_PARTITION)
            handle.add_done_callback(done_at(time.perf_counter()))
            sent += ctx.batch
        producer.flush()
        elapsed = time.perf_counter() - start
    if failed[0]:
        raise RuntimeError(f"{name}: {failed[0]} messages failed")
    return Result(name, sent, elapsed, latencies, ctx.size)


def producer_send_many(ctx: Ctx) -> Result:
    return _producer_bulk(ctx, "producer_send_many")


def producer_send_many_lz4(ctx: Ctx) -> Result:
    return _producer_bulk(ctx, "producer_send_many_lz4", compression="lz4")


def producer_send_async(ctx: Ctx) -> Result:
    """One ``send_async`` per message (batched by the accumulator); latency sampled on one
    message in 64 (``send_async`` → its handle completes)."""
    payload = b"q" * ctx.size
    latencies: list[float] = []
    failed = [0]

    def done_at(t0: float) -> Callable[[SendHandle], None]:
        def done(h: SendHandle) -> None:
            latencies.append((time.perf_counter() - t0) * 1000)

        return done

    with _producer(ctx) as producer:
        producer.partitions(TOPIC)
        send = producer.send_async
        sent = 0
        start = time.perf_counter()
        deadline = start + ctx.seconds
        last = None
        while time.perf_counter() < deadline:
            for i in range(ctx.batch):
                last = send(TOPIC, payload, partition=PRODUCER_PARTITION)
                if i & 63 == 0:
                    last.add_done_callback(done_at(time.perf_counter()))
            sent += ctx.batch
        producer.flush()
        elapsed = time.perf_counter() - start
        if last is not None and not last.result(0).success:
            failed[0] += 1
    if failed[0]:
        raise RuntimeError("producer_send_async: the last send failed")
    return Result("producer_send_async", sent, elapsed, latencies, ctx.size)


# --- Consumer-API cases (pymetaq.client.Consumer; read partition 0 = what produce_bput wrote,
# every record's CRC checked; ungrouped, so nothing is committed) ---


def _consumer(ctx: Ctx, listener: Callable[[Any], None] | None = None) -> Consumer:
    host, port = ctx.address
    c = Consumer(f"meta://{host}:{port}", None, initial_position="earliest")
    c.subscribe(TOPIC, listener)
    c.assign([TopicPartition(TOPIC, 0, 0)])
    return c


def _consumer_poll(ctx: Ctx, name: str, count: Callable[[Messages], int]) -> Result:
    """``poll()`` until partition 0 is drained or ``ctx.seconds``; latency per poll call."""
    total = ctx.produced.get(0, 0)
    latencies: list[float] = []
    messages = 0
    with _consumer(ctx) as c:
        start = time.perf_counter()
        deadline = start + ctx.seconds
        while time.perf_counter() < deadline and (messages < total or not total):
            t0 = time.perf_counter()
            batch = c.poll(1.0)
            latencies.append((time.perf_counter() - t0) * 1000)
            if not batch and not total:
                break
            messages += count(batch)
        elapsed = time.perf_counter() - start
        assert c.stats["crc_errors"] == 0
    return Result(name, messages, elapsed, latencies, ctx.size)


def consumer_poll(ctx: Ctx) -> Result:
    """``len(poll())``: headers + CRCs checked, Message objects never built (lazy)."""
    return _consumer_poll(ctx, "consumer_poll", len)


def consumer_poll_values(ctx: Ctx) -> Result:
    """``poll().values()``: every payload sliced out (no Message objects)."""
    return _consumer_poll(ctx, "consumer_poll_values", lambda b: len(b.values()))


def consumer_poll_messages(ctx: Ctx) -> Result:
    """``for m in poll(): m.value``: a Message object per message."""

    def touch(batch: Messages) -> int:
        n = 0
        for m in batch:
            n += m.value is not None
        return n

    return _consumer_poll(ctx, "consumer_poll_messages", touch)


def consumer_listener(ctx: Ctx) -> Result:
    """Listener mode: ``listener(message)`` per message on the fetch worker."""
    total = ctx.produced.get(0, 0)
    seen = [0]
    done = threading.Event()

    def listener(m: object) -> None:
        seen[0] += 1
        if seen[0] >= total:
            done.set()

    c = _consumer(ctx, listener)
    start = time.perf_counter()
    c.start()
    done.wait(ctx.seconds if total else 0)
    elapsed = time.perf_counter() - start
    messages = seen[0]
    c.close()
    return Result("consumer_listener", messages, elapsed, [], ctx.size)


CASES: list[Callable[[Ctx], Result]] = [
    produce_bput,
    produce_put,
    consume_get,
    producer_send_many,
    producer_send_many_lz4,
    producer_send_async,
    consumer_poll,
    consumer_poll_values,
    consumer_poll_messages,
    consumer_listener,
]


def table(rows: list[dict[str, object]]) -> str:
    cols = ["case", "msgs_per_s", "MB_per_s", "p50_ms", "p99_ms", "messages", "seconds"]
    return text_table(cols, [[r[c] for c in cols] for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per case")
    ap.add_argument("--json", action="store_true", help="JSON lines on stdout")
    ap.add_argument("--size", type=int, default=100, help="message payload bytes")
    ap.add_argument("--batch", type=int, default=1000, help="records per bput")
    ap.add_argument("--inflight", type=int, default=8, help="bput batches in flight")
    ap.add_argument("--threshold", type=int, default=0, help="unflushThreshold (0 = group commit)")
    ap.add_argument("--case", action="append", help="run only these cases")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pymetaq-e2e-") as tmp:
        topics = {TOPIC: {"numPartitions": 2}}
        system = {"unflushThreshold": args.threshold}
        with BrokerProcess.start(Path(tmp), topics=topics, system=system) as broker:
            ctx = Ctx(broker.address, args.seconds, args.size, args.batch, args.inflight)
            for case in CASES:
                if args.case and case.__name__ not in args.case:
                    continue
                row = case(ctx).row()
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
    print(table(rows), file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
