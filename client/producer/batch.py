"""The producer's batch and the handles that stand for its messages' results.

A :class:`Batch` is the records for one partition that go out as one ``bput``. It has ONE
completion future (``concurrent.futures.Future`` for the thread face, ``asyncio.Future`` for
the asyncio face), completed exactly once with ``None``; the outcome (first id, offset, or an
error) lives on the batch, so no "exception never retrieved" warning is possible.

Handles are cheap views of a batch: a :class:`SendHandle` (one message: the batch, its index,
the bytes before it) and a :class:`BatchHandle` (a ``send_many``: a list of slices, each a
run of consecutive messages in one batch). A result is computed on demand:
``msg_id = first_id + index``, ``offset = batch_offset + bytes before it``; in an lz4 batch
every message shares the outer record's offset and id.

Completion callbacks (``add_done_callback`` of either handle) are kept on the batch, not on
its future, and the list is dropped once they ran: a callback refers to its handle, the handle
to the batch, so callbacks stored on a ``concurrent.futures.Future`` (which never clears them)
made every batch a reference cycle only the cyclic GC could free. At 100k msgs/s those cycles
filled the old generation and full collections stalled the producer for 20-30 ms each. The
list is flat, ``fn, arg, fn, arg, ...`` (``fn(arg)``; ``fn()`` for :data:`NO_ARG`): a
per-message ``add_done_callback`` adds no object of its own (no ``partial``, no pair) that
lives until the ack, so a backlog of unacknowledged messages gives the cyclic GC half as many
objects to walk (``bench.timeline`` showed client collections of up to 180 ms inside a gap).

Thread-safety: the appendable fields of a batch are written under the accumulator's lock; the
outcome fields by the sender (loop thread) before the future completes, so readers that wait
on the future see them; the callback list is guarded by one module lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

from pymetaq.client.errors import MetaClientError
from pymetaq.client.speedups import speedups
from pymetaq.client.types import SendResult, TopicPartition
from pymetaq.storage.record import HEADER_SIZE

AnyFuture = concurrent.futures.Future[None] | asyncio.Future[None]

log = logging.getLogger(__name__)
_CALLBACKS_LOCK = threading.Lock()
#: the ``arg`` of a callback that takes none (``Batch.add_callback(fn)``)
NO_ARG: Any = object()


def _call(fn: Callable[..., object], arg: Any) -> None:
    fn() if arg is NO_ARG else fn(arg)


def _report(fn: Callable[..., object], exc: BaseException) -> None:
    """A send callback raised (the C loop's report): logged, as the Python loop does."""
    log.error("send callback %r raised", fn, exc_info=exc)


_run_callbacks: Callable[[list[Any], Any, Callable[..., None]], None] | None = (
    speedups.run_callbacks if speedups is not None else None
)


class Batch:
    """Records for one partition sent as one ``bput``."""

    __slots__ = (
        "attempts",
        "body",
        "callbacks",
        "compressed",
        "count",
        "created",
        "due",
        "error",
        "first_id",
        "fut",
        "nbytes",
        "offset",
        "open",
        "parts",
        "pid",
        "pinned",
        "sent_at",
        "seq",
        "seq_order",
        "tp",
        "written",
    )

    def __init__(self, tp: TopicPartition, fut: AnyFuture, now: float) -> None:
        self.tp = tp
        self.fut = fut
        self.parts: list[bytes] = []
        self.nbytes = 0
        self.count = 0
        self.created = now
        self.due = False
        self.open = True
        self.attempts = 0
        self.body: bytes | None = None
        self.compressed = False
        self.first_id = -1
        self.offset = -1
        self.sent_at = 0.0
        self.error: MetaClientError | None = None
        #: an attempt's request was written and then got no answer: it may have been stored
        self.written = False
        #: holds a message whose partition was chosen by key, explicitly or by a custom
        #: partitioner: it is never moved to another partition
        self.pinned = False
        #: idempotence: the producer id and sequence given at the first write (kept by every
        #: retry), and the order in which its partition's sequences were given (retries go out
        #: in that order)
        self.pid: str | None = None
        self.seq: int | None = None
        self.seq_order = 0
        #: ``fn, arg, fn, arg, ...`` (flat: see the module docstring); None once completed
        self.callbacks: list[Any] | None = []

    def add_callback(self, fn: Callable[..., object], arg: Any = NO_ARG) -> None:
        """``fn(arg)`` (``fn()`` without ``arg``) once the batch completed (now, on this
        thread, if it already has)."""
        with _CALLBACKS_LOCK:
            callbacks = self.callbacks
            if callbacks is not None:
                callbacks += (fn, arg)
                return
        _call(fn, arg)

    def complete(self) -> None:
        """Complete the future (if not yet done) and run the callbacks, once (loop thread)."""
        if not self.fut.done():
            self.fut.set_result(None)
        with _CALLBACKS_LOCK:
            callbacks, self.callbacks = self.callbacks, None
        if not callbacks:
            return
        if _run_callbacks is not None:  # the same loop in C (client/_speedups.c)
            _run_callbacks(callbacks, NO_ARG, _report)
            return
        pairs = iter(callbacks)
        for fn, arg in zip(pairs, pairs):
            try:
                fn() if arg is NO_ARG else fn(arg)
            except Exception:
                log.exception("send callback %r raised", fn)

    def __repr__(self) -> str:
        return f"Batch({self.tp}, count={self.count}, bytes={self.nbytes})"

    def result_for(self, index: int, rel: int) -> SendResult:
        tp = self.tp
        if self.error is not None:
            return _result(False, tp.partition, -1, -1, self.error, tp.broker_id, tp.topic)
        if self.compressed:
            return _result(
                True, tp.partition, self.offset, self.first_id, None, tp.broker_id, tp.topic
            )
        return _result(
            True,
            tp.partition,
            self.offset + rel,
            self.first_id + index,
            None,
            tp.broker_id,
            tp.topic,
        )


def _result_factory() -> Callable[..., SendResult]:
    """``SendResult(...)`` without the frozen dataclass's ``__init__`` (one ``object.__setattr__``
    call per field: 2.5x slower): the object, then each slot's descriptor. A send_many of 1000
    messages builds 1000 results when its handle is awaited."""
    names = [f.name for f in dataclasses.fields(SendResult)]
    assert names == [
        "success", "partition", "offset", "msg_id", "error", "broker_id", "topic", "spooled"
    ], names  # fmt: skip
    s0, s1, s2, s3, s4, s5, s6, s7 = (getattr(SendResult, n).__set__ for n in names)
    new = object.__new__

    def send_result(
        success: bool,
        partition: int,
        offset: int,
        msg_id: int,
        error: MetaClientError | None,
        broker_id: int,
        topic: str,
    ) -> SendResult:
        r: SendResult = new(SendResult)
        s0(r, success)
        s1(r, partition)
        s2(r, offset)
        s3(r, msg_id)
        s4(r, error)
        s5(r, broker_id)
        s6(r, topic)
        s7(r, False)
        return r

    return send_result


_result = _result_factory()


def _wait(fut: AnyFuture, timeout: float | None, what: str) -> None:
    if isinstance(fut, concurrent.futures.Future):
        try:
            fut.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"{what} not acknowledged within {timeout}s (still pending)"
            ) from None
    elif not fut.done():
        raise asyncio.InvalidStateError(f"{what} still pending: await the handle")


def _await(fut: AnyFuture) -> Generator[Any, None, None]:
    if isinstance(fut, concurrent.futures.Future):
        yield from asyncio.wrap_future(fut).__await__()
    else:
        yield from fut.__await__()


class SendHandle:
    """The future of one message's :class:`SendResult` (a lightweight view of its batch).

    ``done()``, ``result(timeout)`` (returns the SendResult, ``success=False`` on failure;
    raises ``TimeoutError`` if *waiting* timed out), ``exception()``, ``add_done_callback``,
    and ``await handle`` (asyncio). Not a ``concurrent.futures.Future``: use ``result()`` /
    callbacks rather than ``concurrent.futures.wait``.

    Two kinds: :class:`BatchSendHandle` (the message is in a batch) and
    :class:`~pymetaq.client.producer.lanes.LaneHandle` (the per-message path's lock-free
    lane: the batch is found when asked); both implement :meth:`_where`.
    """

    __slots__ = ()

    def _where(self) -> tuple[Batch, int, int]:
        """(the message's batch, its index in the batch, the bytes before it)."""
        raise NotImplementedError

    def done(self) -> bool:
        return self._where()[0].fut.done()

    def result(self, timeout: float | None = None) -> SendResult:
        b, index, rel = self._where()
        _wait(b.fut, timeout, "send")
        return b.result_for(index, rel)

    def exception(self, timeout: float | None = None) -> MetaClientError | None:
        b = self._where()[0]
        if b.fut.done():  # the common case in a callback: no SendResult needed
            return b.error
        return self.result(timeout).error

    def add_done_callback(self, fn: Callable[[SendHandle], object]) -> None:
        """``fn(handle)`` once acknowledged or failed (on the producer's I/O thread)."""
        self._where()[0].add_callback(fn, self)

    def __await__(self) -> Generator[Any, None, SendResult]:
        b, index, rel = self._where()
        yield from _await(b.fut)
        return b.result_for(index, rel)


class BatchSendHandle(SendHandle):
    """A :class:`SendHandle` that knows its batch (every path but the lane's)."""

    __slots__ = ("_batch", "_index", "_rel")

    def __init__(self, batch: Batch, index: int, rel: int) -> None:
        self._batch = batch
        self._index = index
        self._rel = rel

    def _where(self) -> tuple[Batch, int, int]:
        return self._batch, self._index, self._rel

    def done(self) -> bool:
        return self._batch.fut.done()


class BatchSlice:
    """Consecutive messages of one ``send_many`` inside one batch.

    ``items`` are the values (or whole records); an item's record size is
    ``HEADER_SIZE + extra + len(item)`` (``extra``: the attribute bytes, or ``-HEADER_SIZE`` for whole records).
    """

    __slots__ = ("batch", "extra", "first_index", "first_rel", "items")

    def __init__(
        self, batch: Batch, first_index: int, first_rel: int, items: Sequence[bytes], extra: int
    ) -> None:
        self.batch = batch
        self.first_index = first_index
        self.first_rel = first_rel
        self.items = items
        self.extra = extra


class BatchHandle:
    """The future of a ``send_many``: ``result(timeout)`` -> one SendResult per message."""

    __slots__ = ("_slices",)

    def __init__(self, slices: list[BatchSlice]) -> None:
        self._slices = slices

    def _batches(self) -> list[Batch]:
        seen: dict[int, Batch] = {}
        for s in self._slices:
            seen.setdefault(id(s.batch), s.batch)
        return list(seen.values())

    def done(self) -> bool:
        return all(s.batch.fut.done() for s in self._slices)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every batch; True if all succeeded (raises TimeoutError if waiting ran out)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for b in self._batches():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            _wait(b.fut, left, "send_many")
        return all(b.error is None for b in self._batches())

    @property
    def errors(self) -> list[MetaClientError]:
        return [b.error for b in self._batches() if b.error is not None]

    def exception(self) -> MetaClientError | None:
        """The first batch error (call after completion), or None."""
        errs = self.errors
        return errs[0] if errs else None

    def add_done_callback(self, fn: Callable[[BatchHandle], object]) -> None:
        """Call ``fn(handle)`` once every batch has completed (on the completing thread)."""
        batches = self._batches()
        remaining = [len(batches)]
        lock = threading.Lock()

        def one() -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                fn(self)

        if not batches:
            fn(self)
        for b in batches:
            b.add_callback(one)

    def result(self, timeout: float | None = None) -> list[SendResult]:
        self.wait(timeout)
        out: list[SendResult] = []
        for s in self._slices:
            b, index, rel, add = s.batch, s.first_index, s.first_rel, HEADER_SIZE + s.extra
            for item in s.items:
                out.append(b.result_for(index, rel))
                index += 1
                rel += add + len(item)
        return out

    def __await__(self) -> Generator[Any, None, list[SendResult]]:
        for b in self._batches():
            yield from _await(b.fut)
        return self.result()
