"""The client's C accelerator (client/_speedups.c) against the Python closure it replaces.

Whichever runs, a user gets the same partitions, the same handles and the same calls into the
accumulator: the C lane path and the closure run the same scripts of sends (hypothesis and a
seeded random burst) and must leave the same trace; the lane tests against a real broker run
once more with ``PYMETAQ_NO_EXTENSIONS=1`` (pure Python). The record format's accelerator is
tested in tests/storage/test_speedups.py.
"""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import random
import struct
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from pymetaq.client import speedups as speedups_mod
from pymetaq.client.consumer import batch as batch_mod
from pymetaq.client.consumer import scan as scan_mod
from pymetaq.client.consumer.batch import MessageBatch, RecordBatch
from pymetaq.client.errors import UndecodableRecord
from pymetaq.client.producer import lanes
from pymetaq.client.producer.lanes import Lane, LaneHandle
from pymetaq.client.transport.records import build_record
from pymetaq.client.types import Message, TopicPartition
from pymetaq.storage.speedups import speedups as S
from tests._helpers import pytest_in_pure_python
from tests.client import test_consumer_scan as scan_tests

C = speedups_mod.speedups
SCAN_TP = TopicPartition("t", 3, 1)


def test_the_extension_is_built_and_chosen() -> None:
    """`pip install -e .` with gcc and the Python headers builds it (CI has both); a missing
    extension would silently make every per-message send twice as slow."""
    assert C is not None, (
        "pymetaq.client._speedups is not built: install gcc and python3-dev, then "
        "pip install -e . again"
    )
    assert speedups_mod.SPEEDUPS_IMPL == "c"


@pytest.mark.parametrize("value", ["1", "yes"])
def test_pymetaq_no_extensions_selects_pure_python(value: str) -> None:
    code = (
        "from pymetaq.client.speedups import SPEEDUPS_IMPL as c; "
        "from pymetaq.storage.speedups import SPEEDUPS_IMPL as s; print(c, s)"
    )
    env = {**os.environ, "PYMETAQ_NO_EXTENSIONS": value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "python python", out.stderr


# -- LaneSender: the C fast path of send_async and the Python closure, on the same script ----


class _World:
    """What lane_sender reads from an engine and its accumulator, recording every call."""

    def __init__(self, parts: dict[str, list[TopicPartition]], cap: int, owner: bool) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.lane_of: dict[TopicPartition, Lane] = {}
        self.partition_cache = parts
        self.counter = itertools.count()
        strategy = SimpleNamespace(next=self.counter.__next__)
        acc = SimpleNamespace(
            lane_of=self.lane_of,
            owner=threading.get_ident() if owner else None,
            lane_append=self.lane_append,
            attend=self.attend,
        )
        self.acc = acc
        self.engine = SimpleNamespace(
            acc=acc,
            brokers=SimpleNamespace(partition_cache=parts),
            _rr_next=strategy.next,
            cfg=SimpleNamespace(max_message_bytes=64, batch_messages=cap, batch_bytes=300),
            block_s=1.5,
            _divert=False,
        )

    def lane_append(self, tp: TopicPartition, value: bytes, block_s: float, pinned: bool) -> Any:
        self.calls.append(("lane_append", tp, value, block_s, pinned))
        lane = self.lane_of[tp] = Lane(self.acc, tp)  # type: ignore[arg-type]
        lane.pinned = pinned
        lane.values.append(value)
        lane.nbytes = len(value)
        return LaneHandle((lane, 0))

    def attend(self, lane: Lane) -> None:
        self.calls.append(("attend", lane.tp, len(lane.values)))

    def slow(self, *args: Any) -> Any:
        self.calls.append(("slow", *args))
        return "slow"


def _sender(world: _World, use_c: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(lanes, "speedups", C if use_c else None)
    send = lanes.lane_sender(world.engine, world.slow)  # type: ignore[arg-type]
    assert (type(send).__name__ == "LaneSender") == use_c
    return send


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.sampled_from(["a", "b", "none"]), st.integers(0, 80)),
        st.tuples(st.just("kw"), st.sampled_from(["key", "partition", "attribute", "force"])),
        st.tuples(
            st.just("part"),
            st.sampled_from(["a", "b", "none"]),
            st.sampled_from([0, 1, 2, 3, -1, True, "0-1", 2**70, None]),
        ),
        st.tuples(st.just("str"), st.just("a"), st.just(0)),
        st.tuples(st.just("divert"), st.booleans(), st.just(0)),
        st.tuples(st.just("close"), st.sampled_from(["a", "b"]), st.just(0)),
        st.tuples(st.just("absorb"), st.sampled_from(["a", "b"]), st.just(0)),
    ),
    max_size=60,
)


def _run(world: _World, send: Any, ops: list[tuple[Any, ...]]) -> list[Any]:
    out: list[Any] = []
    for op in ops:
        kind = op[0]
        if kind == "send":
            h = send(op[1], bytes(op[2]))
            out.append(h if h == "slow" else (type(h).__name__, h[0].tp, h[1]))
        elif kind == "kw":  # partition=1 takes the closure's lane path, the others slow()
            h = send("a", b"v", **{op[1]: 1})
            out.append(h if h == "slow" else (type(h).__name__, h[0].tp, h[1]))
        elif kind == "part":  # an explicit partition: an int index in range takes the lane
            h = send(op[1], b"p", partition=op[2])
            out.append(h if h == "slow" else (type(h).__name__, h[0].tp, h[1]))
        elif kind == "str":
            out.append(send("a", "text"))
        elif kind == "divert":
            world.engine._divert = op[1]
        elif kind in ("close", "absorb"):
            tp = world.partition_cache[op[1]][0]
            lane = world.lane_of.get(tp)
            if lane is not None:
                lane.closed = True  # the accumulator's absorb: closed, then dropped
                if kind == "absorb":
                    del world.lane_of[tp]
    lanes_now = {
        tp: (list(lane.values), lane.nbytes, lane.pinned) for tp, lane in world.lane_of.items()
    }
    return [out, world.calls, lanes_now, next(world.counter)]


def _parts() -> dict[str, list[TopicPartition]]:
    return {
        "a": [TopicPartition("a", 0, p) for p in range(3)],
        "b": [TopicPartition("b", 1, 0)],
    }


@seed(20261125)
@settings(max_examples=150, deadline=None)
@given(_OPS, st.integers(1, 5), st.booleans())
def test_lane_sender_in_c_does_what_the_closure_does(
    ops: list[tuple[Any, ...]], cap: int, owner: bool
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        results = []
        for use_c in (False, True):
            world = _World(_parts(), cap, owner)
            results.append(_run(world, _sender(world, use_c, mp), ops))
    assert results[0] == results[1]


def test_lane_sender_forwards_every_other_signature_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = _World(_parts(), 10, True)
    send = _sender(world, True, monkeypatch)
    assert send("a", b"x", b"k") == "slow"  # a key, positionally
    assert send("a", b"x", None, 2, "at", True) == "slow"
    assert send("a", b"x" * 65) == "slow"  # over max_message_bytes
    assert send("nope", b"x") == "slow"  # a topic never fetched
    assert world.calls == [
        ("slow", "a", b"x", b"k", None, None, False),
        ("slow", "a", b"x", None, 2, "at", True),
        ("slow", "a", b"x" * 65, None, None, None, False),
        ("slow", "nope", b"x", None, None, None, False),
    ]
    assert next(world.counter) == 0  # none of them took a round robin step
    # keywords go to the closure, which takes the lane path itself
    h = send(topic="a", value=b"x")
    assert isinstance(h, LaneHandle) and h[1] == 0
    assert world.calls[-1] == ("lane_append", TopicPartition("a", 0, 1), b"x", 1.5, False)
    with pytest.raises(TypeError):
        send()


def test_lane_sender_from_another_thread_takes_the_locked_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = _World(_parts(), 10, True)
    send = _sender(world, True, monkeypatch)
    assert send("b", b"1")[1] == 0  # opens the lane (lane_append)
    assert send("b", b"2")[1] == 1  # the lane, in C
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(send("b", b"3")))
    t.start()
    t.join()
    assert [c[0] for c in world.calls] == ["lane_append", "lane_append"]
    assert got[0][1] == 0  # the fake's lane_append opened a new lane for it


def test_lane_and_scan_tests_pass_in_pure_python_too() -> None:
    """The real-broker lane tests, the consumer's scan tests and the connection's (long
    replies received into a bytearray), once more without the extension."""
    pytest_in_pure_python(
        "tests/client/test_producer_lanes.py",
        "tests/client/test_consumer_scan.py",
        "tests/client/test_core_connection.py",
    )


def test_random_bursts_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long bursts with lanes filling and closing, seeded: the same trace both ways."""
    rng_seed = 20261125
    print(f"seed {rng_seed}")
    rng = random.Random(rng_seed)
    ops: list[tuple[Any, ...]] = []
    for _ in range(3000):
        r = rng.random()
        if r < 0.9:
            ops.append(("send", rng.choice("ab"), rng.randrange(0, 70)))
        elif r < 0.95:
            ops.append(("absorb", rng.choice("ab"), 0))
        else:
            ops.append(("close", rng.choice("ab"), 0))
    results = []
    for use_c in (False, True):
        world = _World(_parts(), 7, True)
        results.append(_run(world, _sender(world, use_c, monkeypatch), ops))
    assert results[0] == results[1]


# -- completion callbacks: add_done_callback, attach, run_callbacks, exception --------------


def _use_c_callbacks(use_c: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways in one process: the C methods and loops, or the Python reference."""
    from pymetaq.client.producer import accumulator as acc_mod
    from pymetaq.client.producer import batch as pbatch
    from pymetaq.client.producer.batch import SendHandle

    assert C is not None
    if use_c:
        monkeypatch.setattr(LaneHandle, "add_done_callback", C.lane_callback_method(LaneHandle))
        exc = C.lane_exception_method(LaneHandle, SendHandle.exception)
        monkeypatch.setattr(LaneHandle, "exception", exc)
    else:
        monkeypatch.setattr(LaneHandle, "add_done_callback", LaneHandle.py_add_done_callback)
        monkeypatch.setattr(LaneHandle, "exception", LaneHandle.py_exception)
    monkeypatch.setattr(acc_mod, "speedups", C if use_c else None)
    monkeypatch.setattr(pbatch, "_run_callbacks", C.run_callbacks if use_c else None)


def _callback_script(rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.45:
            ops.append(("send", rng.randrange(2)))
        elif r < 0.75:
            ops.append(("cb", rng.randrange(1 << 30), rng.random() < 0.05))
        elif r < 0.82:
            ops.append(("drain",))
        elif r < 0.92:
            ops.append(("complete", rng.randrange(1 << 30), rng.random() < 0.3))
        else:
            ops.append(("exc", rng.randrange(1 << 30)))
    return ops


def _run_callbacks_script(ops: list[tuple[Any, ...]], cap: int) -> list[Any]:
    """A real accumulator, one thread: values sent as the lane closure sends them, callbacks
    added to old and new handles, lanes absorbed into batches, batches completed (stored or
    failed) in any order; the trace of every callback run and every exception() asked."""
    from concurrent.futures import Future

    from pymetaq.client.errors import BrokerError
    from pymetaq.client.producer.accumulator import Accumulator

    acc = Accumulator(
        batch_messages=cap,
        batch_bytes=1 << 20,
        linger_s=0.0,
        buffer_bytes=1 << 30,
        future_factory=Future,
        wake=lambda: None,
    )
    tps = [TopicPartition("t", 0, 0), TopicPartition("t", 0, 1)]
    handles: list[Any] = []
    flight: list[Any] = []
    trace: list[Any] = []

    def recorder(k: int, boom: bool) -> Any:
        def fn(h: Any) -> None:
            err = h.exception()
            trace.append(("ran", k, None if err is None else str(err)))
            if boom:
                raise ValueError(f"callback {k}")

        return fn

    for op in ops:
        kind = op[0]
        if kind == "send":
            tp = tps[op[1]]
            lane = acc.lane_of.get(tp)
            if lane is not None and not lane.closed and len(lane.values) < cap:
                lane.values.append(b"v%d" % len(handles))
                handles.append(LaneHandle((lane, len(lane.values) - 1)))
            else:
                handles.append(acc.lane_append(tp, b"v%d" % len(handles), None))
        elif kind == "cb" and handles:
            k = op[1] % len(handles)
            try:  # a completed message's callback runs at once, raising to the caller
                handles[k].add_done_callback(recorder(k, op[2]))
            except ValueError as e:
                trace.append(("raised", str(e)))
        elif kind == "drain":
            batches, _ = acc.drain_due(0.0, 1 << 20, 1 << 20)
            flight += batches
            trace.append(("drained", [b.count for b in batches]))
        elif kind == "complete" and flight:
            b = flight.pop(op[1] % len(flight))
            b.error = BrokerError(500, "refused") if op[2] else None
            b.first_id, b.offset = 1, 0
            acc.finished(b)
            b.complete()
        elif kind == "exc" and handles:
            k = op[1] % len(handles)
            try:  # pending (not sent, or in flight): the reference waits, then times out
                err = handles[k].exception(timeout=0)
                trace.append(("exc", k, None if err is None else str(err)))
            except TimeoutError:
                trace.append(("exc", k, "pending"))
    return trace


@pytest.mark.parametrize("cap", [1, 3, 50])
def test_callbacks_in_c_run_as_the_python_reference_runs_them(
    cap: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every callback runs once, in the same order, seeing the same exception(), and a
    callback that raises is logged and does not stop the others - with the C methods and
    loops as with the Python reference."""
    rng_seed = 20261129 + cap
    print(f"seed {rng_seed}")
    ops = _callback_script(random.Random(rng_seed), 4000)
    traces = []
    logged = []
    for use_c in (False, True):
        caplog.clear()
        _use_c_callbacks(use_c, monkeypatch)
        traces.append(_run_callbacks_script(ops, cap))
        logged.append([r.getMessage() for r in caplog.records if "raised" in r.getMessage()])
    assert traces[0] == traces[1]
    ran = [t for t in traces[1] if t[0] == "ran"]
    assert len(ran) > 200 and any(t[2] for t in ran) and any(t[2] is None for t in ran)
    assert any(t[0] == "exc" and t[2] == "pending" for t in traces[1])
    assert len(logged[1]) == len(logged[0]) > 0


def test_attach_keeps_the_callbacks_of_values_appended_after_the_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value the owner appended after the absorber read ``len(values)`` keeps its callback
    on the lane (index >= n), in order; the others go to their slices' batches."""
    from pymetaq.client.producer import accumulator as acc_mod

    def lane() -> Any:
        b0, b1 = SimpleNamespace(callbacks=["x"]), SimpleNamespace(callbacks=[])
        slices = [SimpleNamespace(batch=b0), SimpleNamespace(batch=b1)]
        cbs = [7, "f7", "h7", 0, "f0", "h0", 4, "f4", "h4", 5, "f5", "h5", 2, "f2", "h2"]
        return SimpleNamespace(callbacks=cbs, starts=[0, 3], slices=slices), b0, b1

    out = []
    for use_c in (False, True):
        monkeypatch.setattr(acc_mod, "speedups", C if use_c else None)
        ln, b0, b1 = lane()
        acc_mod.Accumulator._attach(ln, 5)
        out.append((ln.callbacks, b0.callbacks, b1.callbacks))
    assert (
        out[0]
        == out[1]
        == (
            [7, "f7", "h7", 5, "f5", "h5"],
            ["x", "f0", "h0", "f2", "h2"],
            ["f4", "h4"],
        )
    )


def test_run_callbacks_lets_what_is_not_an_exception_through() -> None:
    """KeyboardInterrupt from a callback stops the loop (as ``except Exception`` lets it)."""
    assert C is not None
    seen: list[int] = []
    no_arg = object()

    def stop() -> None:
        raise KeyboardInterrupt

    cbs = [seen.append, 1, stop, no_arg, seen.append, 2]
    with pytest.raises(KeyboardInterrupt):
        C.run_callbacks(cbs, no_arg, lambda fn, exc: None)
    assert seen == [1]
    reported: list[Any] = []
    C.run_callbacks(
        [seen.append, 3, int, "x", seen.append, 4],
        no_arg,
        lambda fn, exc: reported.append((fn, type(exc))),
    )
    assert seen == [1, 3, 4] and reported == [(int, ValueError)]


def test_callback_functions_refuse_bad_arguments() -> None:
    assert C is not None
    with pytest.raises(TypeError):
        C.attach((), 0, [], [])
    with pytest.raises(ValueError):
        C.attach([0, print], 0, [], [])  # not triples
    with pytest.raises(ValueError):
        C.attach([0, print, None], 1, [], [])  # index 0 absorbed, but no slice holds it
    with pytest.raises(TypeError):
        C.run_callbacks((), None, None)
    with pytest.raises(TypeError):
        C.lane_callback_method(int)
    with pytest.raises(TypeError):
        C.lane_exception_method(LaneHandle, 3)
    method = C.lane_callback_method(LaneHandle)
    with pytest.raises(TypeError):
        method(LaneHandle((1, 2, 3)), print)  # not (lane, index)


# -- messages: a batch's Message objects --------------------------------------------------


def _python_messages(batch: MessageBatch) -> list[Message]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batch_mod, "_messages", None)
        return list(batch)


@seed(20261125)
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=30), max_size=30),
    st.integers(0, 40),
    st.integers(0, 40),
    st.booleans(),
    st.integers(0, 2**40),
)
def test_messages_in_c_are_the_messages_of_the_python_iteration(
    values: list[bytes], lo: int, hi: int, uniform: bool, base: int
) -> None:
    n = len(values)
    if uniform:
        bounds: Any = range(base, base + 120 * (n + 1), 120)
        ids: Any = tuple(range(7, 7 + n))
    else:
        bounds = [base + 3 * k * k for k in range(n + 1)]
        ids = [2**62 + k for k in range(n)]
    whole = MessageBatch(bounds, ids, values, "t", 3, 9)
    for batch in (whole, whole[min(lo, hi) : max(lo, hi)]):
        got = list(batch)
        assert got == _python_messages(batch)
        assert all(type(m) is Message for m in got)
    assert batch_mod._messages is not None


def test_messages_refuses_bad_arguments() -> None:
    assert C is not None
    cols = (range(0, 40, 10), (1, 2, 3), [b"a", b"b", b"c"])
    assert [m.offset for m in C.messages(Message, "t", 0, 0, *cols, 0, 3)] == [0, 10, 20]
    assert [m.value for m in C.messages(Message, "t", 0, 0, *cols, 1, 2)] == [b"b"]
    with pytest.raises(TypeError, match="subclass tuple"):
        C.messages(dict, "t", 0, 0, *cols, 0, 3)
    with pytest.raises(ValueError, match="lo <= hi"):
        C.messages(Message, "t", 0, 0, *cols, 2, 1)
    with pytest.raises(ValueError, match="lo <= hi"):
        C.messages(Message, "t", 0, 0, *cols, -1, 1)
    with pytest.raises(IndexError, match="shorter"):  # a column shorter than hi
        list(C.messages(Message, "t", 0, 0, range(0, 40, 10), [1], [b"a", b"b"], 0, 2))
    with pytest.raises(IndexError):  # bounds one short: no record end for the last one
        list(C.messages(Message, "t", 0, 0, range(0, 30, 10), (1, 2, 3), cols[2], 0, 3))
    with pytest.raises(TypeError):
        C.messages(Message, "t")
    it = C.messages(Message, "t", 0, 0, *cols, 0, 3)
    assert it.__length_hint__() == 3
    next(it)
    assert it.__length_hint__() == 2


# -- a reply kept whole: storage's index_records, RecordBatch, record_messages -------------


def _scan_both(data: bytes, base: int, max_record: int, verify: bool) -> tuple[Any, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scan_mod, "_index", None)
        python = scan_mod.scan(data, SCAN_TP, base, verify=verify, max_record=max_record)
    return python, scan_mod.scan(data, SCAN_TP, base, verify=verify, max_record=max_record)


def _same(x: Any) -> Any:
    """``x``, or for an ``UndecodableRecord`` (an exception: equal only to itself) what it
    says."""
    if isinstance(x, UndecodableRecord):
        return (type(x), str(x), x.record, x.flag, x.msg_id, x.next_offset)
    return x


def test_the_c_walk_finds_what_the_python_scan_finds(seed: int) -> None:
    """Random replies (fixed sizes, runs, every record its own size; corrupted, cut short):
    the C index and its RecordBatch give the pure-Python scan's messages, stops and reasons,
    and every accessor, of the whole batch and of slices, agrees. (A corrupted length can make
    the next header read one with a flag: both then decode the reply eagerly.)"""
    assert scan_mod._index is not None
    rnd = random.Random(seed)
    for _ in range(300):
        buf = bytearray()
        starts: list[int] = []
        for n in scan_tests.lengths(rnd):
            starts.append(len(buf))
            buf += scan_tests.record(rnd.randbytes(n), rnd.randrange(-(1 << 63), 1 << 63))
        if rnd.random() < 0.4:
            scan_tests.corrupt(buf, starts, rnd)
        if rnd.random() < 0.4:
            del buf[rnd.randrange(len(buf) + 1) :]
        data, base = bytes(buf), rnd.randrange(1 << 40)
        max_record = rnd.choice([1 << 30, 500, 0, -1])
        verify = rnd.random() < 0.8
        python, c = _scan_both(data, base, max_record, verify)
        eager = type(python.messages) is list  # a corrupt length made a flag: decoded eagerly
        assert (type(python.messages), type(c.messages)) == (
            (list, list) if eager else (MessageBatch, RecordBatch)
        )
        fields = ("next_offset", "need", "corrupt_at", "reason", "undecodable")
        assert [_same(getattr(c, f)) for f in fields] == [_same(getattr(python, f)) for f in fields]
        want = list(python.messages)
        if eager:  # may hold UndecodableRecords: exceptions, equal only to themselves
            assert [_same(m) for m in c.messages] == [_same(m) for m in want]
            continue
        assert list(c.messages) == want and all(type(m) is Message for m in c.messages)
        n = len(want)
        lo, hi = sorted((rnd.randint(0, n), rnd.randint(0, n)))
        for batch, part in ((c.messages, want), (c.messages[lo:hi], want[lo:hi])):
            assert len(batch) == len(part) and list(batch) == part
            assert list(pickle.loads(pickle.dumps(batch))) == part
            assert batch.values() == [m.value for m in part]
            k = len(part)
            assert [batch[i] for i in range(-k, k)] == part + part  # RecordBatch._make
            got = [(batch.offset_at(i), batch.next_offset_at(i), batch.id_at(i)) for i in range(k)]
            assert got == [(m.offset, m.next_offset, m.id) for m in part]


def test_a_flagged_record_sends_the_c_walk_to_the_eager_decode() -> None:
    plain = [scan_tests.record(b"p%03d" % i, i + 1) for i in range(20)]
    attr = build_record(b"with-attr", "k=v")
    buf = b"".join(plain[:5]) + attr + b"".join(plain[5:])
    python, c = _scan_both(buf, 100, 1 << 30, True)
    assert type(c.messages) is list and c.messages == python.messages
    assert [m.value for m in c.messages][4:7] == [b"p004", b"with-attr", b"p005"]


def test_record_functions_refuse_what_is_not_a_record_of_the_reply() -> None:
    assert C is not None and S is not None
    buf = b"".join(scan_tests.record(b"v%d" % i, 10 + i) for i in range(3))  # 22 bytes each
    positions, status = S.index_records(buf, 1 << 30, True)
    assert status == 0 and struct.unpack("4q", positions) == (0, 22, 44, 66)
    ms = list(C.record_messages(Message, "t", 1, 2, buf, positions, 7, 0, 3))
    assert [(m.offset, m.id, m.value, m.next_offset) for m in ms] == [
        (7, 10, b"v0", 29),
        (29, 11, b"v1", 51),
        (51, 12, b"v2", 73),
    ]
    assert C.record_values(buf, positions, 1, 3) == [b"v1", b"v2"]
    args = (Message, "t", 1, 2)
    with pytest.raises(ValueError, match="lo <= hi < len"):  # no end for record 3
        C.record_messages(*args, buf, positions, 0, 0, 4)
    with pytest.raises(ValueError, match="lo <= hi"):
        C.record_values(buf, positions, 2, 1)
    with pytest.raises(ValueError, match="base"):
        C.record_messages(*args, buf, positions, -1, 0, 3)
    with pytest.raises(TypeError, match="bytes"):
        C.record_values(bytearray(buf), positions, 0, 3)
    with pytest.raises(TypeError, match="subclass tuple"):
        C.record_messages(dict, "t", 1, 2, buf, positions, 0, 0, 3)
    for bad in ((0, 22, 44, 67), (0, 10, 44, 66), (-1, 22, 44, 66)):  # past the end, short, <0
        it = C.record_messages(*args, buf, struct.pack("4q", *bad), 0, 0, 3)
        with pytest.raises(ValueError, match="not a record"):
            list(it)
        with pytest.raises(ValueError, match="not a record"):
            C.record_values(buf, struct.pack("4q", *bad), 0, 3)
    it = C.record_messages(*args, buf, positions, 0, 1, 3)
    assert it.__length_hint__() == 2
    next(it)
    assert it.__length_hint__() == 1


def test_index_records_stops_where_the_walk_stops() -> None:
    assert S is not None
    good = scan_tests.record(b"abc", 1)
    flagged = bytearray(good)
    flagged[19] = 1
    bad_crc = bytearray(good)
    bad_crc[22] ^= 1
    cases = [
        (b"", 1 << 30, True, (0,), 0),
        (good + good[:10], 1 << 30, True, (0, 23), 0),  # a partial header
        (good + good[:22], 1 << 30, True, (0, 23), 0),  # a partial payload
        (good + bytes(flagged) + good, 1 << 30, True, (0, 23), 1),
        (good + good, 2, True, (0,), 2),  # longer than max_record
        (good + b"\xff" * 4 + bytes(16), 1 << 30, True, (0, 23), 2),  # a negative length
        (good + b"\xff" * 20, 1 << 30, True, (0, 23), 1),  # the flag is checked first
        (good + bytes(bad_crc), 1 << 30, True, (0, 23), 3),
        (good + bytes(bad_crc), 1 << 30, False, (0, 23, 46), 0),
    ]
    for buf, max_record, verify, want, status in cases:
        positions, got = S.index_records(buf, max_record, verify)
        assert (struct.unpack(f"{len(positions) // 8}q", positions), got) == (want, status)
    with pytest.raises(TypeError):
        S.index_records(good, 1 << 30)


def test_a_record_batch_reads_the_same_without_the_extension() -> None:
    """A RecordBatch unpickled where the extension is off iterates and gives its values in
    Python (``_make``), with the messages and payloads the C functions give."""
    buf = b"".join(scan_tests.record(b"v%03d" % i, 100 + i) for i in range(50))
    c = scan_mod.scan(buf, SCAN_TP, 4096).messages
    assert type(c) is RecordBatch
    part = pickle.loads(pickle.dumps(c))[10:40]
    want, values = list(c)[10:40], [m.value for m in list(c)[10:40]]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batch_mod, "_record_messages", None)
        mp.setattr(batch_mod, "_record_values", None)
        assert list(part) == want and part.values() == values


def test_a_body_buffer_is_filled_through_views_and_taken_once() -> None:
    """``BodyBuffer``: the bytes a long reply body is received into (client/_speedups.c)."""
    assert C is not None
    buf = C.BodyBuffer(10)
    view = memoryview(buf)
    assert not view.readonly and view.nbytes == 10
    view[:4] = b"abcd"
    rest = view[4:]
    rest[:] = b"efghij"
    with pytest.raises(BufferError, match="still open"):  # a view could change the bytes
        buf.take()
    rest.release()
    view.release()
    body = buf.take()
    assert type(body) is bytes and body == b"abcdefghij"
    with pytest.raises(BufferError, match="already taken"):
        buf.take()
    with pytest.raises(BufferError, match="taken"):
        memoryview(buf)
    assert body == b"abcdefghij"  # and nothing writes into it any more
    for bad in (0, 1, -5):  # bytes of 0 or 1 byte may be shared singletons
        with pytest.raises(ValueError):
            C.BodyBuffer(bad)
    with pytest.raises(TypeError):
        C.BodyBuffer("10")
    dropped = C.BodyBuffer(1 << 20)  # never taken: freed with its view
    memoryview(dropped)[:3] = b"xyz"
    del dropped


def test_messages_are_built_untracked_and_other_tuple_subclasses_as_before() -> None:
    """A ``Message`` (a NamedTuple: tuple's layout) is built without zeroing or GC tracking;
    it can be in no cycle. A tuple subclass with a ``__dict__`` goes through ``tp_alloc``."""
    assert C is not None and S is not None
    buf = b"".join(scan_tests.record(b"v%d" % i, 10 + i) for i in range(3))
    positions, _ = S.index_records(buf, 1 << 30, True)
    gc.collect()  # what earlier tests left for the collector holds references to Message
    before = sys.getrefcount(Message)
    for _ in range(2000):  # the type's reference is taken and given back per message
        ms = list(C.record_messages(Message, "t", 1, 2, buf, positions, 7, 0, 3))
    del ms
    assert sys.getrefcount(Message) < before + 100  # a leak would be 6,000
    ms = list(C.record_messages(Message, "t", 1, 2, buf, positions, 7, 0, 3))
    assert not any(gc.is_tracked(m) for m in ms)
    assert ms[1] == Message("t", 1, 29, 11, b"v1", None, 51, 2, None) and hash(ms[1])

    class WithDict(tuple):  # type: ignore[type-arg]
        pass

    built = list(C.record_messages(WithDict, "t", 1, 2, buf, positions, 7, 0, 3))
    assert all(type(m) is WithDict and gc.is_tracked(m) for m in built)
    built[0].note = "a dict of its own"  # type: ignore[attr-defined]
    assert tuple(built[2]) == ("t", 1, 51, 12, b"v2", None, 73, 2, None)
