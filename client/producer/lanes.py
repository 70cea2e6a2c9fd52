"""The lock-free lane of the per-message send path, and the handle of a message in a lane.

``send_async(topic, value)`` with no key, no explicit partition, no attribute and no custom
partitioner (the loop a Kafka or Redis user writes first) is the hot path. It takes no lock,
creates no future and wakes the I/O thread at most once per burst: the value is appended to
its partition's :class:`Lane` (a plain list; ``list.append`` is atomic under the GIL) and a
:class:`LaneHandle` ``(lane, index)`` (a tuple) comes back. Only the lane's **owner thread** (the first
thread that sent this way; for ``AsyncProducer`` the loop's thread) appends, so ``index`` is
the value's position: other threads take the accumulator's locked path.

The accumulator *absorbs* a lane under its lock (when the sender runs, on a flush, on a locked
append to the same partition, or when a handle's result is wanted before that): it takes the
prefix ``[absorbed, len(values))`` (the writer only appends past it), builds the records in
bulk and files them into batches as ``send_many`` does, and records each run as a
:class:`~pymetaq.client.producer.batch.BatchSlice`. A handle then resolves its index to
``(batch, index in batch, bytes before it)`` by bisecting the lane's slice starts.

Absorbing *closes* the lane (``closed`` is set before ``len(values)`` is read) and drops it
from the accumulator; the owner's next send opens a new one (:meth:`Accumulator.lane_append`,
under the lock: one locked call per sender run, and where ``buffer_bytes`` blocks). An owner
that appended to a lane closed meanwhile sees ``closed`` after its append and has the tail
absorbed before it returns (``attend``), so nothing is lost and order holds. A lane holds at
most ``batch_messages`` values or ``batch_bytes`` bytes (then the owner absorbs it itself),
which bounds what is not yet counted in the buffer. The producer keeps no lane once it is
absorbed: only handles refer to it, and an absorbed lane keeps no payload (its values are
replaced by ``b""``; a handle finds its offset from the sizes kept per slice).

Thread-safety: ``values`` and ``nbytes`` are written by the owner thread only; ``closed``,
``absorbed``, ``starts``, ``slices`` and ``callbacks`` change under the accumulator's lock
(``slices`` is appended before ``absorbed`` moves past it, so a lock-free reader that sees
``index < absorbed`` finds its slice).
"""

from __future__ import annotations

from _thread import get_ident
from bisect import bisect_right
from collections.abc import Callable
from itertools import accumulate
from typing import TYPE_CHECKING, Any, cast

from pymetaq.client.errors import MetaClientError
from pymetaq.client.producer.batch import Batch, BatchSlice, SendHandle
from pymetaq.client.speedups import speedups
from pymetaq.client.types import TopicPartition
from pymetaq.storage.record import HEADER_SIZE

if TYPE_CHECKING:
    from pymetaq.client.producer.accumulator import Accumulator
    from pymetaq.client.producer.engine import ProducerEngine


class Lane:
    """Values appended lock-free by one thread for one partition (see the module docstring)."""

    __slots__ = (
        "absorbed",
        "acc",
        "callbacks",
        "closed",
        "nbytes",
        "pinned",
        "rels",
        "slices",
        "starts",
        "tp",
        "values",
    )

    def __init__(self, acc: Accumulator, tp: TopicPartition) -> None:
        self.acc = acc
        self.tp = tp
        self.values: list[bytes] = []
        self.nbytes = 0  # the values' bytes (the owner's count: it closes a lane at batch_bytes)
        #: set by the accumulator before it takes the values: an owner that appended and then
        #: sees it set calls ``Accumulator.attend`` (its value may have missed the snapshot)
        self.closed = False
        #: a value sent with an explicit partition is in it: the batches it fills are pinned
        #: (never re-routed). Set by the owner before it appends that value, read by the
        #: accumulator after it has read ``len(values)``.
        self.pinned = False
        self.absorbed = 0  # values[:absorbed] are in batches
        self.starts: list[int] = []  # lane index where each slice starts
        self.slices: list[BatchSlice] = []
        #: per slice: bytes before each of its values, ``(first, step)`` when uniform
        self.rels: list[tuple[int, int] | list[int]] = []
        #: ``index, fn, handle, ...`` of values not absorbed yet (flat, as ``Batch.callbacks``)
        self.callbacks: list[Any] = []

    def add_slice(self, start: int, sl: BatchSlice) -> int:
        """(lock held) Record that values ``start..`` went to ``sl``; returns how many. Keeps
        the bytes before each (``(first, size)`` when the records are all one size, else a
        list), not the values: a handle kept after its ack holds no payload."""
        items = sl.items
        self.starts.append(start)
        self.slices.append(sl)
        lens = list(map(len, items))
        size = HEADER_SIZE + sl.extra
        if lens and min(lens) == max(lens):
            self.rels.append((sl.first_rel, size + lens[0]))
        else:
            self.rels.append(list(accumulate((size + n for n in lens), initial=sl.first_rel)))
        sl.items = ()
        return len(lens)

    def locate(self, index: int) -> tuple[Batch, int, int]:
        """(batch, index in it, bytes before it) of an absorbed value."""
        k = bisect_right(self.starts, index) - 1
        s = self.slices[k]
        off = index - self.starts[k]
        rels = self.rels[k]
        rel = rels[0] + off * rels[1] if type(rels) is tuple else rels[off]
        return s.batch, s.first_index + off, rel


class LaneHandle(tuple, SendHandle):  # type: ignore[type-arg]
    """A :class:`SendHandle` of a message sent through a lane: ``(lane, index)``, a tuple
    (built in C: the cheapest object Python makes), the batch looked up when it is needed
    (absorbing the lane first if the sender has not yet)."""

    __slots__ = ()

    def _where(self) -> tuple[Batch, int, int]:
        lane: Lane = self[0]
        index: int = self[1]
        if index >= lane.absorbed:
            lane.acc.absorb_lane(lane)
        return lane.locate(index)

    def done(self) -> bool:
        lane: Lane = self[0]
        index: int = self[1]
        if index >= lane.absorbed:
            return False
        return lane.locate(index)[0].fut.done()

    def add_done_callback(self, fn: Callable[[SendHandle], object]) -> None:
        """``fn(handle)`` once acknowledged or failed (on the producer's I/O thread).

        The reference: with the C accelerator this method is its ``lane_callback_method``
        (same steps; this one stays as ``py_add_done_callback``)."""
        lane: Lane = self[0]
        index: int = self[1]
        if index >= lane.absorbed and lane.acc.lane_callback(lane, index, fn, self):
            return
        lane.locate(index)[0].add_callback(fn, self)

    py_add_done_callback = add_done_callback

    def exception(self, timeout: float | None = None) -> MetaClientError | None:
        """As :meth:`SendHandle.exception`; a completed batch's outcome is read at once (its
        callback list is gone only after its future completed, so ``error`` is final)."""
        lane: Lane = self[0]
        index: int = self[1]
        if index < lane.absorbed:
            b = lane.locate(index)[0]
            if b.callbacks is None:
                return b.error
        return SendHandle.exception(self, timeout)

    py_exception = exception

    def __repr__(self) -> str:
        return f"<SendHandle {self[0].tp} #{self[1]}>"

    # a handle is not a value: identity, as for any other handle
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__


if speedups is not None:  # the same steps in C (client/_speedups.c: lane_callback_method)
    LaneHandle.add_done_callback = speedups.lane_callback_method(LaneHandle)  # type: ignore[method-assign]
    LaneHandle.exception = speedups.lane_exception_method(  # type: ignore[method-assign]
        LaneHandle, SendHandle.exception
    )


def lane_sender(
    engine: ProducerEngine, slow: Callable[..., SendHandle]
) -> Callable[..., SendHandle]:
    """The engine's ``send_async`` with the lane path in front (round robin producers).

    A closure: its constants are cell variables, not attribute lookups. A message without
    key, attribute or ``force``, of a known topic, from the owner thread, goes to its
    partition's open lane: the round robin's, or the one its ``partition`` index names (the
    lane is then pinned); the first of a burst opens the lane (``lane_append``, locked);
    anything else is ``slow``, the engine's checked path.
    """
    acc = engine.acc
    lane_of = acc.lane_of
    cached = engine.brokers.partition_cache.get
    rr = engine._rr_next
    assert rr is not None
    max_bytes, cap, bcap = (
        engine.cfg.max_message_bytes,
        engine.cfg.batch_messages,
        engine.cfg.batch_bytes,
    )
    lane_append = acc.lane_append
    block_s = engine.block_s

    def send_async(
        topic: str,
        value: Any,
        key: Any = None,
        partition: Any = None,
        attribute: str | None = None,
        force: bool = False,
    ) -> SendHandle:
        if (
            type(value) is bytes
            and key is None
            and attribute is None
            and not force
            and not engine._divert
        ):
            parts = cached(topic)
            n = len(value)
            if parts is not None and n <= max_bytes:
                if partition is None:
                    tp = parts[rr() % len(parts)]
                    pin = False
                elif type(partition) is int and 0 <= partition < len(parts):
                    tp = parts[partition]  # an explicit index: pinned to it
                    pin = True
                else:  # a key string, a TopicPartition, or out of range: checked below
                    return slow(topic, value, key, partition, attribute, force)
                lane = lane_of.get(tp)
                if lane is not None and get_ident() == acc.owner:
                    values = lane.values
                    i = len(values)
                    if i < cap and lane.nbytes < bcap:
                        if pin and not lane.pinned:
                            lane.pinned = True  # before the value (see Lane.pinned)
                        values.append(value)
                        lane.nbytes += n
                        if lane.closed:  # absorbed meanwhile: file this one too
                            acc.attend(lane)
                        return LaneHandle((lane, i))
                return lane_append(tp, value, block_s, pin)
        return slow(topic, value, key, partition, attribute, force)

    if speedups is None:
        return send_async
    # the same fast path in C for send_async(topic, value); every other call is the closure's
    fast: Callable[..., SendHandle] = speedups.LaneSender(
        send_async,
        engine,
        engine.brokers.partition_cache,
        cast(Any, rr).__self__,  # the itertools.count: C takes its next value directly
        lane_of,
        acc,
        max_bytes,
        cap,
        bcap,
        lane_append,
        block_s,
        LaneHandle,
        Lane,
    )
    return fast
