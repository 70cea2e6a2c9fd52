"""The pull consumer: ``Consumer`` (threads) and ``AsyncConsumer`` (asyncio), one engine.

```python
with Consumer("meta://localhost:8123", "billing", FileOffsetStore("offsets.json")) as c:
    c.subscribe("orders", handle)      # listener mode: handle(message) per message
    c.start()                          # ... runs until close()

with Consumer("meta://localhost:8123", "billing", store) as c:
    c.subscribe("orders")              # poll mode
    while running:
        for m in c.poll(1.0):
            process(m)                 # consumed (committable) at the next poll()/commit()
```

MetaQ semantics: each owned partition is one sequential stream (listener calls for a
partition never overlap and follow log order); delivery is at-least-once (offsets are
committed every ``commit_interval_s`` seconds, before a partition is released and on close, and
only past processed messages). A listener exception is retried (``delay = max_delay/10 x
attempt``); after ``1 + max_fetch_retries`` attempts the message goes to the reject policy
(default: the local recover spool, redelivered every ``recover_interval_s``) and the partition
moves on. With ``meta://`` servers a consumer owns every partition of its topics (``assign()``
picks others); with ``zk://`` servers and a group it gets its share through ZooKeeper, and a
listener is never called for a partition it no longer owns (see
:mod:`pymetaq.client.consumer.membership`).

Throughput: a fetch buffers one reply (up to ``fetch_max_size``, 1 MiB = MetaQ's
``maxTransferSize``) and sends the next ``get`` at once (read-ahead), so the network and the
broker work while the application processes the buffer. Memory per owned partition: the
buffer, one raw reply read ahead and (poll mode) the batch the caller still holds, each from
one reply of at most ``fetch_max_size_cap`` bytes (a decoded buffer keeps a ``bytes`` payload
and an id per record: about 1.5x the reply's size for 100-byte messages). Listener mode
calls the listener in chunks of 256 with nothing else per message; positions are updated per
chunk (and at a failure), and a ``close()`` or ``seek()`` is noticed between chunks.

Thread-safety: ``Consumer`` methods may be called from any thread; listener calls come from
the consumer's worker threads (``fetch_runner_count`` of them), one partition at a time.
``AsyncConsumer`` belongs to the loop it is used on.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self

from pymetaq.client.consumer.batch import Messages
from pymetaq.client.consumer.config import UNGROUPED_GROUP
from pymetaq.client.consumer.face import ConsumerFace
from pymetaq.client.consumer.iterate import MessageIterator
from pymetaq.client.consumer.recover import Listener
from pymetaq.client.consumer.state import PartitionState
from pymetaq.client.errors import ClientClosed, ConsumerError
from pymetaq.client.transport.loop import LoopThread
from pymetaq.client.types import Message, TopicPartition

log = logging.getLogger("pymetaq.client.consumer")

#: listener mode: messages delivered between two checks for close()/seek() and two updates of
#: the partition's position (a commit never covers a message whose listener call has not
#: returned; a seek or close is noticed within this many calls).
_CHUNK = 256


class _Schedule:
    """MetaQ's delay-ordered fetch-request queue: take the earliest due partition."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, PartitionState]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self.stopped = False

    def put(self, st: PartitionState, delay_s: float = 0.0) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay_s, next(self._seq), st))
            self._cond.notify()

    def take(self) -> PartitionState | None:
        with self._cond:
            while not self.stopped:
                if self._heap:
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        return heapq.heappop(self._heap)[2]
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            return None

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()


class Consumer(ConsumerFace):
    """The synchronous consumer (see the module docstring; constructor: :class:`ConsumerFace`)."""

    def _setup(self) -> None:
        self._listeners: dict[str, Listener] = {}
        self._lt = LoopThread("pymetaq-consumer")
        self._lock = threading.Lock()
        self._schedule = _Schedule()
        self._workers: list[threading.Thread] = []
        #: fetches submitted by workers, and the partition of each (a revoke cancels them)
        self._inflight: dict[concurrent.futures.Future[Any], TopicPartition] = {}
        #: states in the schedule or in a worker's hands (a state is scheduled once)
        self._scheduled: set[PartitionState] = set()
        #: partitions a worker is processing now, and the condition a revoke waits on
        self._busy: set[TopicPartition] = set()
        self._busy_cond = threading.Condition()
        self._stop = threading.Event()
        self._stopping = False  # mirrors _stop for the per-message check (no call)
        self._committer: threading.Thread | None = None
        self._started = False
        self.failures = 0  # listener exceptions seen

    # ---------------------------------------------------------------- setup

    def subscribe(self, topic: str, listener: Listener | None = None) -> Self:
        """Consume ``topic``; with ``listener`` each message is passed to it (``start()``)."""
        super().subscribe(topic)
        if listener is not None:
            fn = self._deserialize
            # a deserializer failure counts as a listener failure (retried, then rejected:
            # the reject policy gets the message as stored)
            self._listeners[topic] = listener if fn is None else lambda m: listener(fn(m))
        return self

    def _open(self) -> None:
        with self._lock:
            if self._closed:
                raise ClientClosed("consumer is closed")
            if self._engine.opened:
                return
            self._lt.run(self._engine.open())
            if not self._listeners:  # poll mode: the policy takes undecodable records only
                self._engine.reject_policy.bind(self.group or UNGROUPED_GROUP, {})
            if self.config.enable_auto_commit and self.group is not None:
                self._committer = threading.Thread(
                    target=self._commit_loop, daemon=True, name="pymetaq-consumer-commit"
                )
                self._committer.start()

    def start(self) -> None:
        """Listener mode: start the fetch workers (returns at once)."""
        if not self._listeners or set(self._listeners) != set(self._engine.topics):
            raise ConsumerError("start() needs a listener for every subscribed topic")
        self._open()
        with self._lock:
            if self._started:
                return
            self._started = True
            self._engine.reject_policy.bind(self.group or UNGROUPED_GROUP, self._listeners)
            for st in list(self._engine.states.values()):
                self._schedule_once(st)
            n = self.config.fetch_runner_count or min(
                len(self._engine.states), os.cpu_count() or 1, 8
            )
            for i in range(max(n, 1)):
                t = threading.Thread(target=self._work, name=f"pymetaq-fetch-{i}", daemon=True)
                t.start()
                self._workers.append(t)

    # ---------------------------------------------------------------- listener mode

    def _schedule_once(self, st: PartitionState) -> None:
        """Put ``st`` in the schedule unless it is there or being worked on."""
        with self._busy_cond:
            if st in self._scheduled:
                return
            self._scheduled.add(st)
        self._schedule.put(st)

    def _current(self, st: PartitionState) -> bool:
        """``st`` is still the state of its partition and may be delivered."""
        return self._engine.states.get(st.tp) is st and not st.fenced

    def _work(self) -> None:
        while True:
            st = self._schedule.take()
            if st is None:
                return
            with self._busy_cond:
                if not self._current(st):  # released (assign, revoke) or fenced
                    self._scheduled.discard(st)
                    continue
                self._busy.add(st.tp)
            delay = 0.0
            try:
                delay = self._process(st)
            except concurrent.futures.CancelledError:
                if self._stop.is_set():
                    return
            except Exception:
                log.exception("%s: fetch worker failed", st.tp)
                delay = self.config.max_delay_fetch_ms / 1000
            finally:
                with self._busy_cond:
                    self._busy.discard(st.tp)
                    self._busy_cond.notify_all()
            with self._busy_cond:
                if self._stop.is_set() or not self._current(st):
                    self._scheduled.discard(st)
                    continue
            self._schedule.put(st, delay)

    def _process(self, st: PartitionState) -> float:
        st.apply_pending_seek()
        if st.buffered == 0:
            # with read-ahead: the next get is sent before this returns, and its reply is
            # read while the listener runs (at most one reply ahead per partition)
            fut = self._lt.submit(self._engine.fetch_ahead(st))
            self._inflight[fut] = st.tp
            try:
                fut.result()
            finally:
                self._inflight.pop(fut, None)
            if st.buffered == 0:
                return float(st.delay_ms) / 1000
        return self._deliver(st)

    def _group_quiesce(self, parts: frozenset[TopicPartition]) -> None:
        """Cancel the workers' fetches of ``parts`` (fenced already) and wait until no worker
        is delivering them (a listener call in progress finishes first), up to
        ``max_poll_interval_ms``."""
        for fut, tp in list(self._inflight.items()):
            if tp in parts:
                fut.cancel()
        wait = self.config.max_poll_interval_ms / 1000.0
        with self._busy_cond:
            if not self._busy_cond.wait_for(lambda: not (self._busy & parts), wait):
                log.warning(
                    "a listener of %s did not return within max_poll_interval_ms=%s; "
                    "releasing the partitions anyway",
                    ", ".join(sorted(map(str, self._busy & parts))),
                    self.config.max_poll_interval_ms,
                )

    def _group_assigned(self, states: list[PartitionState]) -> None:
        with self._lock:
            if self._started:
                for st in states:
                    self._schedule_once(st)

    def _deliver(self, st: PartitionState) -> float:
        """Call the listener for each buffered message in order; the delay before the next
        visit (a retry backoff after a failure, else 0).

        Messages go out in chunks of ``_CHUNK`` with nothing per message but the call: the
        position, index and counters are updated once per chunk (and at a failure), and a
        close or seek is noticed between chunks.
        """
        listener = self._listeners[st.tp.topic]
        buf = st.buffer
        n = len(buf)
        fenced = self.membership is not None  # a group: check the fence before each message
        while st.index < n:
            if self._stopping or st.pending_seek is not None or st.fenced:
                return 0.0
            i = st.index
            j = min(i + _CHUNK, n)
            it = iter(buf[i:j])
            try:
                if fenced:
                    for m in it:
                        if st.fenced:  # revoked or session trouble: stop at once
                            k = j - 1 - sum(1 for _ in it)  # m's index (not delivered)
                            if k > i:
                                st.consumed_through(k - 1)
                            return 0.0
                        listener(m)
                else:
                    for m in it:
                        listener(m)
            except Exception as e:
                k = j - 1 - sum(1 for _ in it)  # the failed message's index
                if k > i:
                    st.consumed_through(k - 1)
                if self._failed(st, buf[k], e):
                    return float(self.config.max_delay_fetch_ms / 10 * st.attempts / 1000)
                st.consumed_through(k)
                continue
            st.consumed_through(j - 1)
        return 0.0

    def _failed(self, st: PartitionState, m: Message, e: Exception) -> bool:
        """A listener failure on ``m``: True to retry it later, False once it was rejected."""
        self.failures += 1
        st.attempts += 1
        if st.attempts <= self.config.max_fetch_retries:
            log.info(
                "%s: listener failed on offset %s (attempt %s): %r", st.tp, m.offset, st.attempts, e
            )
            return True
        self._engine.reject_policy.reject(m, e)
        return False

    # ---------------------------------------------------------------- poll mode

    def poll(self, timeout_s: float = 1.0, max_records: int = 0) -> Messages:
        """Fetched messages (possibly ``[]`` after ``timeout_s``); see the module docstring.

        At most ``max_records`` (else ``config.max_poll_records``; 0 = all buffered).
        """
        if self._listeners:
            raise ConsumerError("poll() is for consumers subscribed without a listener")
        self._open()
        partly = self._cursor.pending()  # an iteration stopped part-way: its rest comes again
        self._cursor.clear()
        if partly:
            self._lt.run(_call(self._engine.rewind_partly, partly))
        limit = max_records or self.config.max_poll_records
        fut = self._lt.submit(self._engine.poll(timeout_s, limit))
        try:
            msgs: Messages = self._deserialized(fut.result())
        except BaseException:
            # interrupted (Ctrl-C), or a deserializer failed: a result the caller never got
            # must not count as consumed; the rewind runs on the loop after the poll ends or
            # is cancelled (FIFO order)
            fut.cancel()
            self._lt.call_soon(self._engine.rewind_unclaimed)
            raise
        self._engine.claim()
        return msgs

    # ---------------------------------------------------------------- positions

    def assignment(self) -> list[TopicPartition]:
        """The owned partitions, sorted (connects and positions on first use)."""
        self._open()
        return list(self._engine.states)

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Own exactly ``partitions`` (no ZooKeeper group): commits released ones."""
        self._check_manual_assign()
        self._open()
        before = set(self._engine.states)
        self._lt.run(self._engine.assign(partitions))
        with self._lock:
            if self._started:
                for tp, st in self._engine.states.items():
                    if tp not in before:
                        self._schedule_once(st)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Continue ``tp`` at byte ``offset`` (a record start; out of range -> 301 -> moved)."""
        self._open()
        super().seek(tp, offset)

    def seek_to_beginning(self, tp: TopicPartition) -> None:
        self._open()
        self.seek(tp, self._lt.run(self._engine.bound(tp, end=False)))

    def seek_to_end(self, tp: TopicPartition) -> None:
        self._open()
        self.seek(tp, self._lt.run(self._engine.bound(tp, end=True)))

    def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's first available offset (after retention), asked of its broker
        (Kafka's ``beginning_offsets``); nothing is seeked."""
        self._open()
        return {tp: self._lt.run(self._engine.bound(tp, end=False)) for tp in partitions}

    def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's end offset (where the next message will be stored)."""
        self._open()
        return {tp: self._lt.run(self._engine.bound(tp, end=True)) for tp in partitions}

    def commit(self) -> None:
        """Write the consumed positions now (poll mode: including the last poll's messages;
        while iterating, the messages handed out so far)."""
        if not self._engine.opened:
            return
        if not self._listeners:
            self._lt.run(_call(self._mark_consumed, False))
        self._engine.commit_now()

    def _mark_consumed(self, final: bool) -> None:
        """(loop thread) Poll mode: the last poll's messages count as consumed — while an
        iteration is part-way through them, only those handed out. ``final`` (close): the rest
        never will; else they do once handed out (at the next poll)."""
        self._engine.mark_returned_consumed(self._cursor.pending(), final=final)
        if final:
            self._cursor.clear()

    def __iter__(self) -> Iterator[Message]:
        """``for message in consumer``: messages as they arrive (poll mode), blocking; stops
        when the consumer is closed. A message counts as consumed once handed out (see
        :mod:`pymetaq.client.consumer.iterate`)."""
        if self._listeners:
            raise ConsumerError("iteration is for consumers subscribed without a listener")
        return MessageIterator(self)

    def _commit_loop(self) -> None:
        while not self._stop.wait(self.config.commit_interval_s):
            try:
                self._engine.commit_now()
            except Exception:
                log.exception("periodic offset commit failed")

    @property
    def stats(self) -> dict[str, int]:
        """The engine's counters (see :attr:`ConsumerFace.stats`) and ``listener_failures``."""
        out = dict(self._engine.counters)
        out["listener_failures"] = self.failures
        return out

    # ---------------------------------------------------------------- close

    def close(self) -> None:
        """Stop workers, commit (unless auto commit is off), close connections."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stopping = True
        self._stop.set()
        self._schedule.stop()
        for fut in list(self._inflight):
            fut.cancel()
        for t in self._workers:
            t.join(timeout=30)
        if self._committer is not None:
            self._committer.join(timeout=30)
        try:
            self._leave_group()
            if self._engine.opened and self.config.enable_auto_commit:
                if not self._listeners:
                    self._lt.run(_call(self._mark_consumed, True))
                self._engine.commit_now()
        finally:
            self._engine.reject_policy.close()
            try:
                self._lt.run(self._engine.shutdown(), timeout_s=10)
            finally:
                self._lt.close()
                self._close_store()

    def _leave_group(self) -> None:
        """Leave the ZooKeeper group (revoke = commit everything, release the owner nodes);
        the last poll's messages count as consumed first (the application is done)."""
        if self.membership is None or not self._engine.opened:
            return
        if not self._listeners:
            self._lt.run(_call(self._mark_consumed, True), timeout_s=10)
        self.membership.leave()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


async def _call(fn: Callable[..., object], *args: object) -> None:
    """Run ``fn(*args)`` on the loop (``LoopThread.run(_call(...))``)."""
    fn(*args)
