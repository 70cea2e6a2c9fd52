"""The wire face of transactions: ``transaction``, transactional ``put``, ``txadmin`` and
``stats transactions`` (MetaQ's ``TransactionProcessor`` + the put path of
``TransactionalCommandProcessor``).

| request                                   | reply                                              |
|-------------------------------------------|----------------------------------------------------|
| ``transaction <key> <sid> BEGIN ...``     | 200, empty body                                    |
| ``put ... <key> <opaque>`` (tx key)       | 200 ``<msgId> <partition> -1``; ``msgId`` is the   |
|                                           | id the message carries in the log once committed   |
| ``bput ... <key> <opaque>`` (8 tokens)    | 200 ``<firstMsgId> <partition> -1 <count>``        |
| ``... PREPARE``                           | 200 ``0`` (XA_OK) or ``3`` (XA_RDONLY: no work)    |
| ``... COMMIT_ONE_PHASE/COMMIT_TWO_PHASE`` | 200, empty, once every message is durable in its   |
|                                           | partition (the topic's policy) and the decision in |
|                                           | the journal (``flushTxLogAtCommit``)               |
| ``... ROLLBACK``, ``... FORGET``          | 200, empty                                         |
| ``... RECOVER [<qualifier>]``             | 200, prepared/heuristic XA keys joined by ``\\r\\n`` |
| ``... END``                               | no reply at all                                    |
| ``txadmin commit|rollback|forget <xid>``  | 200 empty; 403 unless the peer is a loopback address |
| ``stats transactions``                    | ``STATS`` + one line per transaction + ``END``     |

Errors: 500 ``XAException:code=<n>,msg=<text>`` (codes in :mod:`.xa`), or 500 with MetaQ's
plain text where MetaQ sends plain text (a put into a transaction that was not begun, a commit
of an unknown local transaction).  A transactional put to partition ``-1`` is refused with
MetaQ's ``Invalid partition for transaction command:-1``.

Thread-safety: the broker's event-loop thread only.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pymetaq.client.protocol import (
    BatchPutCommand,
    PutCommand,
    TransactionCommand,
    TransactionType,
    TxAdminCommand,
    TxAdminOp,
)
from pymetaq.server.transaction.manager import Counters, TransactionManager, Tx, canonical_key
from pymetaq.server.transaction.xa import TxError
from pymetaq.storage import InvalidRecords
from pymetaq.storage.checksum import checksum
from pymetaq.storage.flags import flag_problem
from pymetaq.storage.txjournal import Outcome

if TYPE_CHECKING:
    from pymetaq.server.connection import Connection

#: resolves (conn, topic, partition, opaque) to (log, topic config), answering errors itself
PutTarget = Callable[["Connection", str, int, int], Any]

ADMIN_ONLY_LOOPBACK = b"txadmin is accepted only from a loopback address (see docs/transactions.md)"


class TxHandler:
    """Routes transaction requests to the :class:`TransactionManager` and answers them."""

    def __init__(self, manager: TransactionManager, stats: Counters, max_record: int) -> None:
        self.manager = manager
        self.stats = stats
        self.max_record = max_record

    # -- transaction ---------------------------------------------------------------------------
    def on_transaction(self, conn: Connection, cmd: TransactionCommand) -> None:
        t = cmd.type
        if t is TransactionType.END:
            return  # MetaQ never answers END
        m, op = self.manager, cmd.opaque
        if t is TransactionType.RECOVER:
            conn.result(200, "\r\n".join(m.recover(cmd.unique_qualifier)).encode(), op)
            return
        if t is TransactionType.BEGIN:
            try:
                m.begin(conn, cmd.tx_key, cmd.timeout_s)
            except TxError as exc:
                conn.result(500, exc.body(), op)
                return
            conn.result(200, b"", op)
            return
        reply = self._reply(conn, op)
        conn.request_started()
        try:
            if t is TransactionType.PREPARE:
                m.prepare(conn, cmd.tx_key, reply)
            elif t is TransactionType.COMMIT_ONE_PHASE or t is TransactionType.COMMIT_TWO_PHASE:
                m.commit(conn, cmd.tx_key, t is TransactionType.COMMIT_ONE_PHASE, reply)
            elif t is TransactionType.ROLLBACK:
                m.rollback(conn, cmd.tx_key, reply)
            else:
                m.forget(cmd.tx_key, reply)
        except TxError as exc:
            reply(500, exc.body())

    @staticmethod
    def _reply(conn: Connection, opaque: int) -> Callable[[int, bytes], None]:
        def reply(code: int, body: bytes) -> None:
            conn.request_done()
            conn.result(code, body, opaque, caller_flushes=True)
            conn.flush_replies()

        return reply

    # -- transactional put -----------------------------------------------------------------------
    def _tx_of(self, conn: Connection, cmd: PutCommand | BatchPutCommand) -> Tx | None:
        """The transaction a put or bput adds to, or None (answered: not begun, finishing,
        partition -1)."""
        assert cmd.tx_key is not None
        try:
            tx = self.manager.for_put(conn, cmd.tx_key)
        except TxError as exc:
            self._put_failed(conn, cmd.opaque, str(exc))
            return None
        if cmd.partition == -1:
            self._put_failed(conn, cmd.opaque, "Invalid partition for transaction command:-1")
            return None
        return tx

    def on_put(self, conn: Connection, cmd: PutCommand, target: PutTarget) -> None:
        tx = self._tx_of(conn, cmd)
        if tx is None:
            return
        crc = checksum(cmd.data)
        if cmd.checksum is not None and cmd.checksum != crc:
            self._put_failed(
                conn, cmd.opaque, f"Checksum failed: expected {cmd.checksum}, computed {crc}"
            )
            return
        if len(cmd.data) > self.max_record:
            reason = f"invalid records: record data of {len(cmd.data)} bytes exceeds the limit of {self.max_record}"
            self._put_failed(conn, cmd.opaque, reason, 400)
            return
        if cmd.flag and (why := flag_problem(cmd.flag, cmd.data)) is not None:
            # refused now: storage would refuse the commit's append, after the decision
            self._put_failed(conn, cmd.opaque, f"invalid records: {why}", 400)
            return
        if target(conn, cmd.topic, cmd.partition, cmd.opaque) is None:
            return  # unknown topic, closed for publish, partition out of range: answered
        self._add(conn, cmd, tx, crc)

    def on_bput(
        self, conn: Connection, cmd: BatchPutCommand, body: bytearray, target: PutTarget
    ) -> None:
        """A transactional ``bput`` (pymetaq): its records join the transaction as that many
        transactional puts would, with one journal write; the reply is
        ``200 "<firstMsgId> <partition> -1 <count>"`` (ids ``firstMsgId ..`` in record order)."""
        tx = self._tx_of(conn, cmd)
        if tx is None:
            return
        if target(conn, cmd.topic, cmd.partition, cmd.opaque) is None:
            return  # unknown topic, closed for publish, partition out of range: answered
        try:
            first, count = self.manager.add_batch(
                tx, cmd.topic, cmd.partition, body, self.max_record
            )
        except InvalidRecords as exc:
            self._put_failed(conn, cmd.opaque, f"invalid records: {exc.reason}", 400)
            return
        except TxError as exc:
            self._put_failed(conn, cmd.opaque, str(exc))
            return
        conn.result(200, b"%d %d -1 %d" % (first, cmd.partition, count), cmd.opaque)

    def _add(self, conn: Connection, cmd: PutCommand, tx: Tx, crc: int) -> None:
        try:
            msg_id = self.manager.add(tx, cmd.topic, cmd.partition, cmd.data, cmd.flag, crc)
        except TxError as exc:
            self._put_failed(conn, cmd.opaque, str(exc))
            return
        conn.result(200, b"%d %d -1" % (msg_id, cmd.partition), cmd.opaque)

    def _put_failed(self, conn: Connection, opaque: int, reason: str, code: int = 500) -> None:
        self.stats.counters["put_failed"] += 1
        conn.result(code, reason.encode("utf-8", "replace"), opaque)

    # -- operators -----------------------------------------------------------------------------
    def on_admin(self, conn: Connection, cmd: TxAdminCommand) -> None:
        # with [security] enable=true the dispatcher has checked the admin right instead
        if not conn.dispatcher.guard.enabled and not _loopback(conn):
            conn.result(403, ADMIN_ONLY_LOOPBACK, cmd.opaque)
            return
        reply = self._reply(conn, cmd.opaque)
        conn.request_started()
        try:
            if cmd.op is TxAdminOp.FORGET:
                self.manager.forget(cmd.tx_key, reply)
            else:
                outcome = Outcome.COMMIT if cmd.op is TxAdminOp.COMMIT else Outcome.ROLLBACK
                self.manager.heuristic(cmd.tx_key, outcome, reply)
        except TxError as exc:
            reply(500, exc.body())

    def stats_lines(self) -> list[str]:
        """``stats transactions``: one line per open transaction and heuristic decision."""
        now = time.monotonic()
        lines = []
        for tx in self.manager.transactions():
            parts = ",".join(f"{t}-{p}" for t, p in tx.held.parts) or "-"
            state = {
                "commit": "COMMITTING",
                "prepare": "PREPARING",
                "rollback": "ROLLING_BACK",
            }.get(tx.busy or "", tx.state.name)
            lines.append(
                f"{tx.key} state {state} xa {str(tx.xa).lower()} messages {tx.held.count} "
                f"bytes {tx.held.nbytes} age_ms {int((now - tx.created) * 1000)} "
                f"timeout_s {tx.timeout_s if tx.timer is not None else 0} partitions {parts}"
            )
        wall_ms = int(time.time() * 1000)
        for key, h in self.manager.store.heuristics.items():
            state = "HEURISTIC_COMMIT" if h.outcome is Outcome.COMMIT else "HEURISTIC_ROLLBACK"
            lines.append(
                f"{key} state {state} xa true messages 0 bytes 0 "
                f"age_ms {max(0, wall_ms - h.time_ms)} timeout_s 0 partitions -"
            )
        return lines

    def connection_closed(self, conn: Connection) -> None:
        self.manager.connection_closed(conn)


def _loopback(conn: Connection) -> bool:
    transport = conn.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if not isinstance(peer, tuple) or not peer:
        return False
    try:
        return ipaddress.ip_address(peer[0]).is_loopback
    except ValueError:
        return False


__all__ = ["TxHandler", "canonical_key"]
