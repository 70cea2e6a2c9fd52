"""BrokerConnection against a scripted asyncio server: opaque matching, timeouts, lost
connections; LoopThread basics; the accumulator and partitioner without a broker."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest

from pymetaq.client.errors import (
    ClientClosed,
    ConnectionLost,
    NoBrokerAvailable,
    OffsetOutOfRange,
    RequestTimeout,
    UnknownTopicOrPartition,
)
from pymetaq.client.producer.accumulator import Accumulator
from pymetaq.client.producer.lanes import LaneHandle
from pymetaq.client.producer.partitioner import (
    OutgoingMessage,
    RoundRobin,
    key_hash_index,
    resolve_custom,
    resolve_explicit,
)
from pymetaq.client.protocol import (
    NEED_DATA,
    Parser,
    ResultReply,
    Role,
    StatsCommand,
    ValueReply,
    VersionCommand,
    encode,
)
from pymetaq.client.transport.connection import BrokerConnection, raise_for_reply
from pymetaq.client.transport.loop import LoopThread
from pymetaq.client.transport.records import decode_messages
from pymetaq.client.types import TopicPartition

Handler = Callable[[list[object], asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.base_events.Server, int]:
    """A server that parses requests and passes each to ``handler(seen, writer)``."""

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = Parser(Role.SERVER)
        seen: list[object] = []
        try:
            while data := await reader.read(65536):
                parser.feed(data)
                while (ev := parser.next_event()) is not NEED_DATA:
                    seen.append(ev)
                    await handler(seen, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_replies_are_matched_by_opaque_even_out_of_order() -> None:
    async def handler(seen: list[object], w: asyncio.StreamWriter) -> None:
        if len(seen) == 3:  # answer the three requests in reverse order
            for ev in reversed(seen):
                assert isinstance(ev, StatsCommand)
                w.write(encode(ResultReply(200, ev.item.encode(), ev.opaque)))
            await w.drain()

    async def main() -> list[bytes]:
        server, port = await _serve(handler)
        async with server:
            conn = await BrokerConnection.open("127.0.0.1", port)
            futs = [conn.send_request(StatsCommand(item, 0)) for item in ("a", "b", "c")]
            replies = await asyncio.gather(*futs)
            conn.close()
            return [r.body for r in replies]  # type: ignore[union-attr]

    assert asyncio.run(main()) == [b"a", b"b", b"c"]


def test_long_replies_arrive_whole_in_any_chunking_between_short_ones() -> None:
    """A ``get`` reply of about 1 MiB is received in place (the parser's body window): the
    server writes replies of 1 MiB, 300 KB and a few bytes, pipelined, in random pieces with
    pauses, so bodies start mid-read, end mid-read and arrive in one read or in many."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    sizes = [1 << 20, 300_000, 5, (1 << 20) - 1, 262_144, 2] * 3
    bodies = {i + 1: rng.randbytes(n) for i, n in enumerate(sizes)}

    async def handler(seen: list[object], w: asyncio.StreamWriter) -> None:
        if len(seen) < len(bodies):
            return
        wire = b"".join(encode(ValueReply(bodies[ev.opaque], ev.opaque)) for ev in seen)  # type: ignore[attr-defined]
        at = 0
        while at < len(wire):
            n = rng.choice([1, 100, 4096, 65_536, 700_000, len(wire)])
            w.write(wire[at : at + n])
            at += n
            await w.drain()
            if rng.random() < 0.3:
                await asyncio.sleep(0.002)  # the client reads what has arrived so far

    async def main() -> dict[int, bytes]:
        server, port = await _serve(handler)
        async with server:
            conn = await BrokerConnection.open("127.0.0.1", port)
            futs = [conn.send_request(VersionCommand(op), timeout_s=30) for op in bodies]
            replies = await asyncio.gather(*futs)
            conn.close()
            return {r.opaque: r.data for r in replies}  # type: ignore[union-attr]

    got = asyncio.run(main())
    assert got == bodies
    assert all(type(b) is bytes for b in got.values())


def test_a_connection_lost_mid_body_fails_the_request_and_frees_the_body() -> None:
    async def half(seen: list[object], w: asyncio.StreamWriter) -> None:
        w.write(encode(ValueReply(b"x" * (1 << 20), seen[0].opaque))[:600_000])  # type: ignore[attr-defined]
        await w.drain()
        await asyncio.sleep(0.05)
        w.close()

    async def main() -> None:
        server, port = await _serve(half)
        async with server:
            conn = await BrokerConnection.open("127.0.0.1", port)
            with pytest.raises(ConnectionLost):
                await conn.request(VersionCommand(9), timeout_s=30)
            assert conn.closed
            assert conn._parser.pending_bytes == 0 and not conn._parser.in_frame

    asyncio.run(main())


def test_timeout_then_lost_connection_fail_pending_requests() -> None:
    async def silent(seen: list[object], w: asyncio.StreamWriter) -> None:
        if len(seen) == 3:
            w.close()  # drop the connection with requests pending

    async def main() -> None:
        server, port = await _serve(silent)
        async with server:
            conn = await BrokerConnection.open("127.0.0.1", port)
            with pytest.raises(RequestTimeout):
                await conn.request(VersionCommand(0), timeout_s=0.05)
            pending = [conn.send_request(VersionCommand(0), timeout_s=30) for _ in range(2)]
            for fut in pending:
                with pytest.raises(ConnectionLost) as e:
                    await fut
                assert e.value.retriable
            assert conn.closed
            with pytest.raises(ConnectionLost):
                await conn.request(VersionCommand(0))

    asyncio.run(main())


def test_each_request_times_out_at_its_own_deadline_and_answered_ones_never_do() -> None:
    """One timer serves every pending request (``_sweep``): requests with different timeouts,
    sent in any order, fail with RequestTimeout each at its own deadline (never before, and
    not much after); answered requests are never failed; a request a timeout's hook sends
    is timed too; the bookkeeping of answered requests does not pile up."""
    answered = {1, 3, 6}  # the server answers these requests (1-based), the rest stay silent

    async def handler(seen: list[object], w: asyncio.StreamWriter) -> None:
        if len(seen) in answered:
            w.write(encode(ResultReply(200, b"ok", seen[-1].opaque)))  # type: ignore[attr-defined]
            await w.drain()

    async def main() -> None:
        server, port = await _serve(handler)
        async with server:
            conn = await BrokerConnection.open("127.0.0.1", port)
            loop = asyncio.get_running_loop()
            start = loop.time()
            timeouts = [0.6, 0.6, 0.6, 0.2, 0.4, 0.2]  # request k+1 gets timeouts[k]
            settled: dict[int, tuple[str, float]] = {}
            resent: list[asyncio.Future[Any]] = []

            def hook(k: int, fut: asyncio.Future[Any]) -> None:
                exc = fut.exception()
                settled[k] = (type(exc).__name__ if exc else "ok", loop.time() - start)
                if k == 4:  # the first to time out sends another request from its hook
                    resent.append(conn.send_request(VersionCommand(0), timeout_s=0.1))

            futs = []
            for k, t in enumerate(timeouts, 1):
                futs.append(
                    conn.send_request(VersionCommand(0), timeout_s=t, on_done=partial(hook, k))
                )
                await asyncio.sleep(0.01)
            await asyncio.gather(*futs, return_exceptions=True)
            with pytest.raises(RequestTimeout):
                await resent[0]
            after = loop.time() - start
            assert {k: v[0] for k, v in settled.items()} == {
                1: "ok", 2: "RequestTimeout", 3: "ok", 4: "RequestTimeout",
                5: "RequestTimeout", 6: "ok",
            }  # fmt: skip
            for k in (2, 4, 5):
                sent_at = (k - 1) * 0.01
                assert timeouts[k - 1] + sent_at <= settled[k][1] + 0.005, (k, settled[k])
                assert settled[k][1] < timeouts[k - 1] + sent_at + 0.25, (k, settled[k])
            assert settled[4][1] + 0.1 <= after + 0.005
            assert not conn._deadlines and not conn._by_timeout and conn._sweep_timer is None

            # many answered requests: what is kept for their deadlines stays short
            answered.update(range(8, 2008))
            for _ in range(2000):
                await conn.request(VersionCommand(0), timeout_s=5)
            assert sum(len(q) for q in conn._by_timeout.values()) <= 1
            assert not conn._deadlines
            conn.close()
            assert conn._sweep_timer is None and not conn._by_timeout

    asyncio.run(main())


def test_on_done_runs_once_per_request_on_reply_timeout_and_loss() -> None:
    """``send_request(on_done=...)``: the hook gets the settled future exactly once, for a
    reply (in the reply handler, before any done-callback), a timeout and a lost connection."""

    async def handler(seen: list[object], w: asyncio.StreamWriter) -> None:
        ev = seen[-1]
        if len(seen) == 1:  # answer the first request only
            assert isinstance(ev, StatsCommand)
            w.write(encode(ResultReply(200, b"ok", ev.opaque)))
            await w.drain()
        elif len(seen) == 4:
            w.close()  # drop the connection with the last two pending

    async def main() -> list[tuple[str, str]]:
        calls: list[tuple[str, str]] = []

        def hook(name: str, fut: asyncio.Future[Any]) -> None:
            assert fut.done()
            exc = fut.exception()
            calls.append((name, type(exc).__name__ if exc else "ok"))

        server, port = await _serve(handler)
        async with server:
            conn = await BrokerConnection.open("127.0.0.1", port)
            first = conn.send_request(StatsCommand("a", 0), on_done=lambda f: hook("reply", f))
            first.add_done_callback(lambda f: calls.append(("done-callback", "ok")))
            await first
            await asyncio.sleep(0)
            slow = conn.send_request(VersionCommand(0), 0.05, on_done=lambda f: hook("timeout", f))
            with pytest.raises(RequestTimeout):
                await slow
            lost = [
                conn.send_request(VersionCommand(0), 30, on_done=lambda f: hook("lost", f))
                for _ in range(2)
            ]
            for fut in lost:
                with pytest.raises(ConnectionLost):
                    await fut
            await asyncio.sleep(0)
            after = conn.send_request(VersionCommand(0), 30, on_done=lambda f: hook("closed", f))
            with pytest.raises(ConnectionLost):
                await after
            await asyncio.sleep(0)
            return calls

    assert asyncio.run(main()) == [
        ("reply", "ok"),
        ("done-callback", "ok"),
        ("timeout", "RequestTimeout"),
        ("lost", "ConnectionLost"),
        ("lost", "ConnectionLost"),
        ("closed", "ConnectionLost"),
    ]


def test_connect_failure_is_no_broker_available() -> None:
    async def main() -> None:
        with pytest.raises(NoBrokerAvailable):
            await BrokerConnection.open("127.0.0.1", 1, connect_timeout_s=1)

    asyncio.run(main())


def test_raise_for_reply_maps_codes() -> None:
    with pytest.raises(OffsetOutOfRange) as e:
        raise_for_reply(ResultReply(301, b"77", 1))
    assert e.value.new_offset == 77
    ok = ResultReply(200, b"x", 1)
    assert raise_for_reply(ok) is ok


def test_loop_thread_runs_and_closes() -> None:
    lt = LoopThread()

    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    assert lt.run(add(1, 2), 5) == 3
    assert lt.submit(add(2, 2)).result(5) == 4
    with pytest.raises(RequestTimeout):
        lt.run(asyncio.sleep(10), 0.05)
    lt.close()
    with pytest.raises(ClientClosed):
        lt.submit(add(1, 1))


def _acc(**kw: object) -> tuple[Accumulator, list[int]]:
    wakes: list[int] = []
    args: dict[str, object] = dict(
        batch_messages=3, batch_bytes=1 << 20, linger_s=10.0, buffer_bytes=1 << 30,
        future_factory=concurrent.futures.Future, wake=lambda: wakes.append(1),
    )  # fmt: skip
    args.update(kw)
    return Accumulator(**args), wakes  # type: ignore[arg-type]


def test_accumulator_batches_per_partition_and_closes_full_batches() -> None:
    acc, wakes = _acc()
    p0, p1 = TopicPartition("t", 0, 0), TopicPartition("t", 0, 1)
    hs = [acc.append(p0 if i % 2 == 0 else p1, f"v{i}".encode(), None) for i in range(8)]
    assert len(wakes) == 1  # coalesced until the sender runs
    # the full batches are due; the open ones wait for their linger time (10 s)
    due, next_due = acc.drain_due(time.monotonic(), max_in_flight=5, part_limit=5)
    assert [(b.tp, b.count, b.open) for b in due] == [(p0, 3, False), (p1, 3, False)]
    assert next_due is not None and next_due > time.monotonic() + 5
    # a flush makes the open batches due too
    waiting = acc.begin_flush()
    assert len(waiting) == 4
    rest, _ = acc.drain_due(time.monotonic(), max_in_flight=5, part_limit=5)
    acc.end_flush()
    assert [(b.tp, b.count) for b in rest] == [(p0, 1), (p1, 1)]
    q0 = [due[0], rest[0]]
    body = b"".join(q0[0].parts)
    msgs, _ = decode_messages(body, "t", 0, 0)
    assert [m.value for m in msgs] == [b"v0", b"v2", b"v4"]
    # a handle knows its position inside the batch
    b = q0[0]
    b.first_id, b.offset = 100, 4000
    b.fut.set_result(None)
    r = hs[2].result(0)  # third message of partition 0 = index 1 in its batch
    assert (r.success, r.msg_id, r.offset) == (True, 101, 4000 + 22)


def test_with_no_linger_a_lane_absorbed_by_the_drain_goes_out_in_that_drain() -> None:
    """linger 0: the batch a drain builds from a lane is due in that drain, though it was
    created after the drain's ``now`` (before: it waited for a 0 s timer, one loop
    iteration, on every round of the per-message path)."""
    acc, _ = _acc(linger_s=0.0)
    tp = TopicPartition("t", 0, 0)
    now = time.monotonic()
    handles = [acc.lane_append(tp, b"v0", None)]
    lane = acc.lane_of[tp]
    lane.values.append(b"v1")  # as the owner's lock-free send does
    handles.append(LaneHandle((lane, 1)))
    due, next_due = acc.drain_due(now - 1.0, max_in_flight=5, part_limit=5)
    assert [(b.tp, b.count) for b in due] == [(tp, 2)] and next_due is None
    assert [h._where()[1] for h in handles] == [0, 1]
    # with a linger, the same batch waits for it
    acc, _ = _acc(linger_s=10.0)
    acc.lane_append(tp, b"v0", None)
    due, next_due = acc.drain_due(time.monotonic(), max_in_flight=5, part_limit=5)
    assert due == [] and next_due is not None


def test_accumulator_buffer_limit_blocks_then_times_out() -> None:
    acc, _ = _acc(buffer_bytes=100)
    tp = TopicPartition("t", 0, 0)
    acc.append(tp, b"x" * 60, None)
    with pytest.raises(RequestTimeout):
        acc.append(tp, b"y" * 60, None, block_s=0.05)


def test_accumulator_in_flight_slots_and_reenqueue() -> None:
    acc, _ = _acc(batch_messages=1)
    tp = TopicPartition("t", 0, 0)
    for i in range(3):
        acc.append(tp, b"%d" % i, None)
    first, _ = acc.drain_due(time.monotonic(), max_in_flight=5, part_limit=1)
    assert len(first) == 1  # one slot per partition
    assert acc.drain_due(time.monotonic(), max_in_flight=5, part_limit=1)[0] == []
    acc.reenqueue(first[0])  # a retry goes back to the head and frees the slot
    again, _ = acc.drain_due(time.monotonic(), max_in_flight=5, part_limit=1)
    assert again == first
    acc.finished(again[0])
    second, _ = acc.drain_due(time.monotonic(), max_in_flight=5, part_limit=1)
    assert [b.parts[1] for b in second] == [b"1"]


def test_partitioner_helpers() -> None:
    parts = [TopicPartition("t", 0, 0), TopicPartition("t", 0, 1), TopicPartition("t", 1, 0)]
    rr = RoundRobin()
    assert [rr(3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert key_hash_index(b"abc", 3) == zlib.crc32(b"abc") % 3
    assert resolve_explicit("t", parts, "1-0") == 2
    assert resolve_explicit("t", parts, TopicPartition("t", 0, 1)) == 1
    assert resolve_explicit("t", parts, 0) == 0
    for bad in (3, "2-0", -1):
        with pytest.raises(UnknownTopicOrPartition):
            resolve_explicit("t", parts, bad)
    msg = OutgoingMessage("t", b"v", None, None)
    assert resolve_custom(lambda t, ps, m: ps[-1], "t", parts, msg) == 2
    with pytest.raises(UnknownTopicOrPartition):
        resolve_custom(lambda t, ps, m: 9, "t", parts, msg)
