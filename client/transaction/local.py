"""Local transactions: ``with producer.transaction(timeout_s=30):`` and its asyncio twin.

MetaQ's local transaction (``TransactionContext.begin/commit/rollback`` with
``SimpleMessageProducer``'s broker pinning), on pymetaq's engine:

* **Lazy BEGIN, one broker.** Nothing is sent until the first message. Its partition is
  chosen as for any send; that partition's broker becomes the transaction's, a connection to it
  is taken from the producer's transaction pool, and ``transaction TX:<sid>:<n> <sid> BEGIN
  [<timeout>]`` is written followed by the put (pipelined). Later messages are placed on that
  broker's partitions of their topic (an explicit partition of another broker is refused with
  :class:`CrossBrokerTransaction`).
* **A dedicated connection.** The broker binds a local transaction to the connection that began
  it, and closing that connection rolls it back. Each open transaction therefore has a
  connection of its own (:class:`TxConnections`: a per-broker pool keeping up to 16 idle),
  separate from the producer's pipelined send connection, which transactions never touch or
  slow down.
* **Commit** waits for every put's answer; if every message was taken it sends
  ``COMMIT_ONE_PHASE`` and returns once the broker acknowledged it (durable). If any put
  failed or went unanswered, it rolls back and raises :class:`TransactionRolledBack`. No
  answer to COMMIT raises :class:`TransactionOutcomeUnknown` and closes the connection.
* **Rollback** sends ``ROLLBACK``; when that cannot be confirmed the connection is closed,
  which makes the broker roll the transaction back (pymetaq's broker does; MetaQ's forgot).
* A transaction with no message is never begun on the broker: commit and rollback do nothing.

Thread-safety: :class:`LocalTransaction` and :class:`TxConnections` run on the producer's
event loop (``put`` is called there by the producer); :class:`LocalScope` may be used from any
thread (it binds the transaction to the calling context), :class:`AsyncLocalScope` from a task
on the producer's loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from pymetaq.client.errors import ClientClosed, MetaClientError, NoBrokerAvailable, error_for_reply
from pymetaq.client.protocol import ResultReply, TransactionType
from pymetaq.client.transaction.bound import (
    BoundTransaction,
    Item,
    PutDone,
    PutPipe,
    TransactionBinding,
    closed_error,
)
from pymetaq.client.transaction.errors import (
    XAER_RMFAIL,
    TransactionClosed,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
    XAError,
    xa_error_from_body,
)
from pymetaq.client.transaction.wire import local_request, tx_command
from pymetaq.client.transport.connection import BrokerConnection, Reply
from pymetaq.client.transport.security import ClientSecurity
from pymetaq.client.types import TopicPartition

T = TypeVar("T")
log = logging.getLogger(__name__)


class TxConnections:
    """Per-broker pool of connections for local transactions (loop thread only)."""

    def __init__(
        self,
        address_of: Callable[[int], tuple[str, int]],
        connect_timeout_s: float,
        max_idle_per_broker: int = 16,
    ) -> None:
        self._address_of = address_of
        self._connect_timeout_s = connect_timeout_s
        self.security: ClientSecurity | None = None  # the producer's BrokerSet's
        self._max_idle = max_idle_per_broker
        self._idle: dict[int, list[BrokerConnection]] = {}
        self._owner: dict[BrokerConnection, int] = {}
        self.closed = False

    async def acquire(self, broker_id: int) -> BrokerConnection:
        if self.closed:
            raise ClientClosed("producer closed")
        idle = self._idle.get(broker_id, [])
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        host, port = self._address_of(broker_id)
        conn = await BrokerConnection.open(
            host, port, connect_timeout_s=self._connect_timeout_s, security=self.security
        )
        if self.closed:
            conn.close()
            raise ClientClosed("producer closed")
        self._owner[conn] = broker_id
        return conn

    def release(self, conn: BrokerConnection) -> None:
        """Give back a connection with no open transaction on it."""
        broker_id = self._owner.get(conn)
        idle = self._idle.setdefault(broker_id, []) if broker_id is not None else None
        if self.closed or conn.closed or idle is None or len(idle) >= self._max_idle:
            self.discard(conn)
            return
        idle.append(conn)

    def discard(self, conn: BrokerConnection) -> None:
        """Close a connection (the broker rolls back whatever local transaction it held)."""
        self._owner.pop(conn, None)
        conn.close()

    def close(self) -> None:
        self.closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        for conn in list(self._owner):
            self.discard(conn)


class _LocalPipe(PutPipe):
    def __init__(self, tx: LocalTransaction) -> None:
        super().__init__(tx.loop, tx.request_timeout_s)
        self.tx = tx

    async def open_connection(self) -> BrokerConnection:
        tx = self.tx
        assert tx.broker_id is not None
        conn = await tx.pool.acquire(tx.broker_id)
        begin = tx_command(tx.key, tx.session_id, TransactionType.BEGIN, timeout_s=tx.timeout_s)
        self.track(conn.send_request(begin, self.request_timeout_s), _check_begin)
        return conn


def _check_begin(reply: Reply) -> None:
    if isinstance(reply, ResultReply) and reply.code != 200:
        body = bytes(reply.body)
        if body.startswith(b"XAException:"):
            raise xa_error_from_body(body)
        raise error_for_reply(reply.code, body)


class LocalTransaction(BoundTransaction):
    """One local transaction (loop side): its key, broker, put pipe, commit and rollback."""

    kind = "local"

    def __init__(
        self,
        key: str,
        session_id: str,
        timeout_s: int | None,
        pool: TxConnections,
        loop: asyncio.AbstractEventLoop,
        request_timeout_s: float,
    ) -> None:
        super().__init__()
        self.key, self.session_id, self.timeout_s = key, session_id, timeout_s
        self.pool, self.loop, self.request_timeout_s = pool, loop, request_timeout_s
        self.pipe = _LocalPipe(self)
        self.outcome = "open"  # open | committed | rolled back | unknown

    def put(self, tp: TopicPartition, items: list[Item], done: PutDone) -> None:
        """(loop thread) Add one message (its partition is on the pinned broker)."""
        if self.finished:
            done(-1, closed_error(self))
            return
        self.pipe.write(self.key, tp, items, done)

    def _cmd(self, kind: TransactionType) -> Any:
        return tx_command(self.key, self.session_id, kind)

    async def commit(self) -> None:
        """Commit (see the module docstring); raises what the outcome calls for."""
        if self.finished:
            raise TransactionClosed(f"local transaction {self.key} is already {self.outcome}")
        self.finished = True
        pipe = self.pipe
        if not pipe.started:
            self.outcome = "committed"
            return
        failure = await pipe.settle()
        conn = pipe.conn
        if failure is not None or conn is None:
            await self._abort(conn)
            raise TransactionRolledBack(
                f"local transaction {self.key} rolled back: a message was not taken", failure
            )
        try:
            reply = await local_request(
                conn, self._cmd(TransactionType.COMMIT_ONE_PHASE), self.request_timeout_s
            )
        except MetaClientError as e:
            self.pool.discard(conn)
            self.outcome = "unknown"
            raise TransactionOutcomeUnknown(
                f"COMMIT of local transaction {self.key} was sent to {self.broker_url} and not "
                f"answered: it may or may not be committed",
                e,
            ) from e
        if reply.code == 200:
            self.outcome = "committed"
            self.pool.release(conn)
            return
        await self._refused(conn, reply)

    async def _refused(self, conn: BrokerConnection, reply: ResultReply) -> None:
        """The broker refused COMMIT: roll back what may be left, and say what happened."""
        body = bytes(reply.body)
        reason = body.decode("utf-8", "replace")
        ambiguous = (
            body.startswith(b"XAException:") and xa_error_from_body(body).code == XAER_RMFAIL
        )
        rolled_back = await self._abort(conn)
        if ambiguous and not rolled_back:  # decided in the broker's journal, not yet applied?
            self.outcome = "unknown"
            raise TransactionOutcomeUnknown(
                f"broker {self.broker_url} failed COMMIT of {self.key} and refused to roll it "
                f"back: {reason}"
            )
        raise TransactionRolledBack(
            f"broker {self.broker_url} refused COMMIT of {self.key}: {reason}"
        )

    async def rollback(self) -> None:
        """Roll back (idempotent; never leaves the transaction open on the broker)."""
        if self.finished:
            return
        self.finished = True
        if not self.pipe.started:
            self.outcome = "rolled back"
            return
        await self.pipe.settle()
        await self._abort(self.pipe.conn)

    async def _abort(self, conn: BrokerConnection | None) -> bool:
        """ROLLBACK on ``conn``; True if the broker confirmed it. Unconfirmed: the connection
        is closed, so the broker rolls back whatever is still open."""
        self.outcome = "rolled back"
        if conn is None:
            return True
        try:
            reply = await local_request(
                conn, self._cmd(TransactionType.ROLLBACK), self.request_timeout_s
            )
        except MetaClientError:
            self.pool.discard(conn)
            return False
        if reply.code == 200:
            self.pool.release(conn)
            return True
        self.pool.discard(conn)
        return False


class _ScopeBase:
    def __init__(self, binding: TransactionBinding, tx: LocalTransaction) -> None:
        self._binding = binding
        self._tx = tx
        self._token: Any = None

    @property
    def key(self) -> str:
        """``TX:<sessionId>:<n>``."""
        return self._tx.key

    @property
    def broker_id(self) -> int | None:
        """The transaction's broker (None until the first message)."""
        return self._tx.broker_id

    @property
    def messages(self) -> int:
        """Messages the broker took into the transaction so far."""
        return self._tx.pipe.messages

    @property
    def outcome(self) -> str:
        """``open``, ``committed``, ``rolled back`` or ``unknown``."""
        return self._tx.outcome


class LocalScope(_ScopeBase):
    """``with producer.transaction(timeout_s=...) as tx:`` (thread face). Commits on normal
    exit, rolls back on an exception (and re-raises it); ``tx.commit()`` / ``tx.rollback()``
    finish it early."""

    def __init__(
        self,
        binding: TransactionBinding,
        tx: LocalTransaction,
        run: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        super().__init__(binding, tx)
        self._run = run

    def __enter__(self) -> LocalScope:
        self._token = self._binding.bind(self._tx)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._tx.finished:
                pass
            elif et is None:
                self.commit()
            else:
                self.rollback()
        finally:
            self._binding.unbind(self._token)

    def commit(self) -> None:
        self._run(self._tx.commit())

    def rollback(self) -> None:
        self._run(self._tx.rollback())


class AsyncLocalScope(_ScopeBase):
    """``async with producer.transaction(timeout_s=...) as tx:`` (asyncio face)."""

    async def __aenter__(self) -> AsyncLocalScope:
        self._token = self._binding.bind(self._tx)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._tx.finished:
                pass
            elif et is None:
                await self.commit()
            else:
                await self.rollback()
        finally:
            self._binding.unbind(self._token)

    async def commit(self) -> None:
        await self._tx.commit()

    async def rollback(self) -> None:
        await asyncio.shield(self._tx.rollback())


class LocalIds:
    """A producer's session id and its local transaction numbers (``TX:<sid>:<n>``, n from 1)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._n = itertools.count(1)

    def next_key(self) -> str:
        return f"TX:{self.session_id}:{next(self._n)}"


def address_of(brokers: Callable[[], dict[int, str]]) -> Callable[[int], tuple[str, int]]:
    """``broker_id -> (host, port)`` from a ``{id: "meta://host:port"}`` view."""
    from pymetaq.client.transport.servers import parse_servers

    def lookup(broker_id: int) -> tuple[str, int]:
        url = brokers().get(broker_id)
        if url is None:
            raise NoBrokerAvailable(f"broker {broker_id} is not known to this producer")
        return parse_servers(url)[0]

    return lookup


__all__ = [
    "AsyncLocalScope",
    "LocalIds",
    "LocalScope",
    "LocalTransaction",
    "TxConnections",
    "XAError",
    "address_of",
]
