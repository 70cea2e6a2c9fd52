"""What a producer's send path sees of a transaction: the context binding and the put pipe.

**Binding.** MetaQ binds a transaction to the thread (a ``ThreadLocal``). pymetaq's I/O runs on
one event-loop thread per producer, so a thread binding would say nothing about an asyncio
task; instead a transaction is bound to the **context** (:mod:`contextvars`): each thread has
its own context, and so does each asyncio task (a task created inside the block copies the
binding and its sends join the transaction; one created elsewhere does not).
:class:`TransactionBinding` holds one ``ContextVar`` per producer (read by the producer's send
path once the producer has used transactions) and counts the bound transactions.

**Put pipe.** :class:`PutPipe` writes a transaction's messages on one connection, in the
order the sends were made per partition, as pymetaq's transactional ``bput`` (8 tokens,
``docs/protocol.md``): the first send starts opening the connection (and, for a local
transaction, sends BEGIN); sends made meanwhile wait in a backlog and are written once it is
open; later ones are queued and written at the end of the loop iteration, so the sends of
one burst share requests (each partition's messages as ``bput``\\ s of up to 4096 records /
~1 MiB), pipelined. Each reply completes its messages' ``done(msg_id, error)`` (consecutive
ids); the first failure is kept: a transaction with a failed, timed-out or unanswered put can
only be rolled back.
:meth:`PutPipe.settle` waits until every put is answered.

Thread-safety: :class:`TransactionBinding` is thread-safe; :meth:`BoundTransaction.pin` may be
called from any thread; everything else of a pipe runs on its producer's event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from pymetaq.client.errors import ConnectionLost, MetaClientError
from pymetaq.client.protocol import ResultReply
from pymetaq.client.transaction.errors import (
    CrossBrokerTransaction,
    TransactionClosed,
    TransactionInProgress,
)
from pymetaq.client.transaction.wire import bput_first_id, tx_bput
from pymetaq.client.transport.connection import BrokerConnection, Reply
from pymetaq.client.types import TopicPartition
from pymetaq.storage.record import HEADER_SIZE

#: ``done(msg_id, error)``: a put's outcome (msg_id -1 on failure)
PutDone = Callable[[int, MetaClientError | None], object]
Item = tuple[bytes, int]  # a message's data and flag
_Put = tuple["TopicPartition", list[Item], PutDone]  # partition, messages, done

#: one transactional ``bput`` carries at most this many records (the broker gives a batch
#: consecutive ids within one millisecond: ``pymetaq.storage.batch.MAX_BATCH_RECORDS``)
MAX_BATCH_RECORDS = 4096
#: and about this many bytes (one record alone may be larger)
MAX_BATCH_BYTES = 1 << 20


class BoundTransaction:
    """A transaction that takes messages: a local transaction or an associated XA branch."""

    key: str
    kind: str  # "local" | "XA"

    def __init__(self) -> None:
        self.broker_id: int | None = None
        self.broker_url = ""
        self.finished = False
        self._pin_lock = threading.Lock()
        #: topic -> (the topic's partition list, its partitions on this broker), for sends
        self.placed: dict[str, tuple[list[TopicPartition], list[TopicPartition]]] = {}

    def pin(self, broker_id: int, url: str) -> None:
        """Make ``broker_id`` the transaction's broker (first message), or check it is."""
        with self._pin_lock:
            if self.broker_id is None:
                self.broker_id, self.broker_url = broker_id, url
                return
        if broker_id != self.broker_id:
            raise CrossBrokerTransaction(
                f"{self.kind} transaction {self.key} belongs to broker {self.broker_id} "
                f"({self.broker_url}): partition of broker {broker_id} refused (all messages "
                f"of a transaction go to partitions of one broker)"
            )

    def put(self, tp: TopicPartition, items: list[Item], done: PutDone) -> None:
        """Put messages ``items`` (``(data, flag)``, in order) into the transaction;
        ``done(first_msg_id, error)`` once the broker answered (ids are consecutive)."""
        raise NotImplementedError


class TransactionBinding:
    """One producer's ContextVar of bound transactions, and how many are open."""

    def __init__(self) -> None:
        self.var: contextvars.ContextVar[BoundTransaction | None] = contextvars.ContextVar(
            "pymetaq.transaction", default=None
        )
        self._open = 0
        self._lock = threading.Lock()

    @property
    def open_count(self) -> int:
        """Transactions bound (to some context) and not yet unbound."""
        return self._open

    def current(self) -> BoundTransaction | None:
        return self.var.get()

    def bind(self, tx: BoundTransaction) -> contextvars.Token[BoundTransaction | None]:
        """Bind ``tx`` to the calling context; TransactionInProgress if one is bound."""
        bound = self.var.get()
        if bound is not None and not bound.finished:
            raise TransactionInProgress(
                f"a {bound.kind} transaction ({bound.key}) is already bound to this "
                f"{'task' if _in_task() else 'thread'} on this producer"
            )
        token = self.var.set(tx)
        self._count(+1)
        return token

    def unbind(self, token: contextvars.Token[BoundTransaction | None] | None = None) -> None:
        """Undo :meth:`bind` (with its token when the context is the same, else set None)."""
        try:
            if token is None:
                raise ValueError
            self.var.reset(token)
        except ValueError:  # another context, or already reset: clear this context's binding
            self.var.set(None)
        self._count(-1)

    def _count(self, delta: int) -> None:
        with self._lock:
            self._open = max(0, self._open + delta)


def _in_task() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:
        return False


class PutPipe:
    """Ordered, pipelined transactional puts on one connection (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request_timeout_s: float) -> None:
        self.loop = loop
        self.request_timeout_s = request_timeout_s
        self.conn: BrokerConnection | None = None
        self.failure: MetaClientError | None = None
        self.messages = 0
        self._opening: asyncio.Task[None] | None = None
        self._backlog: list[_Put] = []  # while the connection opens
        self._queued: list[_Put] = []  # until the next flush (this loop iteration)
        self._flush_scheduled = False
        self._pending: set[asyncio.Future[Reply]] = set()
        self._key = ""

    async def open_connection(self) -> BrokerConnection:
        """Open (or borrow) the connection; sends BEGIN first where one is needed."""
        raise NotImplementedError

    @property
    def started(self) -> bool:
        """Something was sent (or is being sent): there is a transaction on the broker side."""
        return self._opening is not None

    def write(self, key: str, tp: TopicPartition, items: list[Item], done: PutDone) -> None:
        """(loop thread) Put messages into the transaction, after every earlier one."""
        self._key = key
        if self.conn is not None:
            self._queued.append((tp, items, done))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self._flush)
            return
        if self._opening is not None and self._opening.done():  # opening failed
            done(-1, self.failure or ConnectionLost("the transaction's connection failed"))
            return
        self._backlog.append((tp, items, done))
        if self._opening is None:
            self._opening = self.loop.create_task(self._open())

    async def _open(self) -> None:
        try:
            conn = await self.open_connection()
        except MetaClientError as e:
            self.fail(e)
            backlog, self._backlog = self._backlog, []
            for _, _, done in backlog:
                done(-1, e)
            return
        self.conn = conn
        backlog, self._backlog = self._backlog, []
        self._send_all(backlog)

    def _flush(self) -> None:
        self._flush_scheduled = False
        queued, self._queued = self._queued, []
        self._send_all(queued)

    def _send_all(self, puts: list[_Put]) -> None:
        """Write ``puts``, in order per partition: each partition's puts go out together as
        transactional ``bput``\\ s of at most :data:`MAX_BATCH_RECORDS` records and about
        :data:`MAX_BATCH_BYTES` (one put is never split).  Messages of different partitions
        have no order among them (each partition's messages are appended at commit)."""
        by_tp: dict[TopicPartition, list[_Put]] = {}
        for put in puts:
            by_tp.setdefault(put[0], []).append(put)
        for tp, group in by_tp.items():
            run: list[_Put] = []
            count = size = 0
            for put in group:
                items = put[1]
                more = sum([len(data) for data, _ in items]) + HEADER_SIZE * len(items)
                if run and (
                    count + len(items) > MAX_BATCH_RECORDS or size + more > MAX_BATCH_BYTES
                ):
                    self._send(tp, run, count)
                    run, count, size = [], 0, 0
                run.append(put)
                count += len(items)
                size += more
            self._send(tp, run, count)

    def _send(self, tp: TopicPartition, run: list[_Put], count: int) -> None:
        assert self.conn is not None
        records = run[0][1] if len(run) == 1 else [item for _, items, _ in run for item in items]
        cmd = tx_bput(tp.topic, tp.partition, records, self._key)
        dones = [(done, len(items)) for _, items, done in run]
        on_done = partial(self._on_put, dones, count)
        self._pending.add(self.conn.send_request(cmd, self.request_timeout_s, on_done))

    def track(self, fut: asyncio.Future[Reply], check: Callable[[Reply], object]) -> None:
        """Count ``fut`` (e.g. a pipelined BEGIN) among the requests :meth:`settle` waits for;
        ``check(reply)`` raises if the reply is a failure."""

        def settled(f: asyncio.Future[Reply]) -> None:
            self._pending.discard(f)
            try:
                check(f.result())
            except MetaClientError as e:
                self.fail(e)

        self._pending.add(fut)
        fut.add_done_callback(settled)

    def _on_put(
        self, dones: list[tuple[PutDone, int]], count: int, fut: asyncio.Future[Reply]
    ) -> None:
        self._pending.discard(fut)
        try:
            reply = fut.result()
            if not isinstance(reply, ResultReply):
                raise ConnectionLost(f"unexpected reply to a transactional bput: {reply!r}")
            first = bput_first_id(reply, count)
        except MetaClientError as e:
            self.fail(e)
            for done, _ in dones:
                done(-1, e)
            return
        self.messages += count
        for done, n in dones:
            done(first, None)
            first += n

    def fail(self, error: MetaClientError) -> None:
        if self.failure is None:
            self.failure = error

    async def settle(self) -> MetaClientError | None:
        """Wait until the connection is open and every put is answered; the first failure."""
        if self._opening is not None:
            await asyncio.shield(self._opening)
        if self._queued:
            self._flush()
        while self._pending:
            await asyncio.wait(list(self._pending))
            await asyncio.sleep(0)  # let done-callbacks (BEGIN's check) run
        return self.failure


def closed_error(tx: BoundTransaction) -> TransactionClosed:
    return TransactionClosed(f"{tx.kind} transaction {tx.key} is finished: no more messages")


def ignore(*_: Any) -> None:
    pass
