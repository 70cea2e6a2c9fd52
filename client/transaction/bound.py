"""What a producer's send path sees of a transaction: the context binding and the put pipe.

**Binding.** MetaQ binds a transaction to the thread (a ``ThreadLocal``). pymetaq's I/O runs on
one event-loop thread per producer, so a thread binding would say nothing about an asyncio
task; instead a transaction is bound to the **context** (:mod:`contextvars`): each thread has
its own context, and so does each asyncio task (a task created inside the block copies the
binding and its sends join the transaction; one created elsewhere does not).
:class:`TransactionBinding` holds one ``ContextVar`` per producer (read by the producer's send
path once the producer has used transactions) and counts the bound transactions.

**Put pipe.** :class:`PutPipe` writes a transaction's messages as transactional ``put``\\ s on
one connection, in the order the sends were made: the first send starts opening the
connection (and, for a local transaction, sends BEGIN); sends made meanwhile wait in a backlog
and are written in order once it is open; later ones are written at once (pipelined). Each
put's reply completes that message's ``done(msg_id, error)``; the first failure is kept:
a transaction with a failed, timed-out or unanswered put can only be rolled back.
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
from pymetaq.client.transaction.wire import put_msg_id, tx_put
from pymetaq.client.transport.connection import BrokerConnection, Reply
from pymetaq.client.types import TopicPartition

#: ``done(msg_id, error)``: a put's outcome (msg_id -1 on failure)
PutDone = Callable[[int, MetaClientError | None], object]


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

    def put(self, tp: TopicPartition, data: bytes, flag: int, done: PutDone) -> None:
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
        self._backlog: list[tuple[TopicPartition, bytes, int, PutDone]] = []
        self._pending: set[asyncio.Future[Reply]] = set()
        self._key = ""

    async def open_connection(self) -> BrokerConnection:
        """Open (or borrow) the connection; sends BEGIN first where one is needed."""
        raise NotImplementedError

    @property
    def started(self) -> bool:
        """Something was sent (or is being sent): there is a transaction on the broker side."""
        return self._opening is not None

    def write(self, key: str, tp: TopicPartition, data: bytes, flag: int, done: PutDone) -> None:
        """(loop thread) Put one message into the transaction, after every earlier one."""
        self._key = key
        if self.conn is not None:
            self._send(tp, data, flag, done)
            return
        if self._opening is not None and self._opening.done():  # opening failed
            done(-1, self.failure or ConnectionLost("the transaction's connection failed"))
            return
        self._backlog.append((tp, data, flag, done))
        if self._opening is None:
            self._opening = self.loop.create_task(self._open())

    async def _open(self) -> None:
        try:
            conn = await self.open_connection()
        except MetaClientError as e:
            self.fail(e)
            backlog, self._backlog = self._backlog, []
            for _, _, _, done in backlog:
                done(-1, e)
            return
        self.conn = conn
        backlog, self._backlog = self._backlog, []
        for tp, data, flag, done in backlog:
            self._send(tp, data, flag, done)

    def _send(self, tp: TopicPartition, data: bytes, flag: int, done: PutDone) -> None:
        assert self.conn is not None
        cmd = tx_put(tp.topic, tp.partition, data, flag, self._key)
        fut = self.conn.send_request(cmd, self.request_timeout_s, partial(self._on_put, done))
        self._pending.add(fut)

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

    def _on_put(self, done: PutDone, fut: asyncio.Future[Reply]) -> None:
        self._pending.discard(fut)
        try:
            reply = fut.result()
            if not isinstance(reply, ResultReply):
                raise ConnectionLost(f"unexpected reply to a transactional put: {reply!r}")
            msg_id = put_msg_id(reply)
        except MetaClientError as e:
            self.fail(e)
            done(-1, e)
            return
        self.messages += 1
        done(msg_id, None)

    def fail(self, error: MetaClientError) -> None:
        if self.failure is None:
            self.failure = error

    async def settle(self) -> MetaClientError | None:
        """Wait until the connection is open and every put is answered; the first failure."""
        if self._opening is not None:
            await asyncio.shield(self._opening)
        while self._pending:
            await asyncio.wait(list(self._pending))
            await asyncio.sleep(0)  # let done-callbacks (BEGIN's check) run
        return self.failure


def closed_error(tx: BoundTransaction) -> TransactionClosed:
    return TransactionClosed(f"{tx.kind} transaction {tx.key} is finished: no more messages")


def ignore(*_: Any) -> None:
    pass
