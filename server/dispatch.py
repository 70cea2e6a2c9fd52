"""Command handlers: one method per verb, chosen through a table keyed by command type.

Replies and codes are MetaQ 1.4's (``BrokerCommandProcessor``):

| verb         | success                                  | errors                                   |
|--------------|------------------------------------------|------------------------------------------|
| put          | 200 ``"<msgId> <partition> <offset>"``   | 403 acceptPublish=false; 500 unknown     |
|              |                                          | topic, bad partition, checksum mismatch, |
|              |                                          | write failure; 400 + close: data over    |
|              |                                          | maxTransferSize - 20 (codec limit); with |
|              |                                          | a tx key: :mod:`.transaction.handler`    |
| bput         | 200 ``"<firstId> <partition> <offset>    | as put; 400 malformed records (framing,  |
|              | <count>"`` (count = records stored)      | a record CRC, a record's data over       |
|              |                                          | maxTransferSize - 20: nothing stored) or |
|              |                                          | a count that cannot fit the body         |
| get          | ``value <len> <opaque>`` + log slice     | 400 maxSize <= 0; 403 acceptSubscribe=   |
|              |                                          | false; 404 no such store / no data;      |
|              |                                          | 301 ``<offset>`` out of range (see below)|
| offset       | 200 ``<nearest segment start>``          | 404 no such store                        |
| stats        | 200 ``STATS\\r\\n...END\\r\\n``          |                                          |
| version      | 200 version string (also the heartbeat)  |                                          |
| transaction  | :mod:`pymetaq.server.transaction.handler` (also ``txadmin``, ``stats transactions``) |
| sync         | -                                        | 500 not a slave                          |

The ``bput`` count token is checked only against the body length: the records themselves are
walked once, by storage's validate-and-stamp loop (no second per-record pass in the broker), and
the reply carries the count storage wrote.  Single puts are coalesced per partition by
:mod:`pymetaq.server.puts`.

Get out of range (MetaQ): offset below the first segment → 301 with the first offset; above
the durable end → 301 with the end only if ``updateConsumerOffsets=true`` (or offset is
Long.MAX_VALUE), else 404.  ``offset`` answers MetaQ's getNearestOffset: the start of the
segment holding the offset.

Thread-safety: everything runs on the event-loop thread (storage callbacks are marshalled onto it
by :mod:`pymetaq.server.puts` and :mod:`pymetaq.server.longpoll`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pymetaq.client.protocol import (
    BatchPutCommand,
    GetCommand,
    Limits,
    OffsetCommand,
    ProtocolError,
    PutCommand,
    StatsCommand,
    SyncCommand,
    TransactionCommand,
    TxAdminCommand,
    VersionCommand,
)
from pymetaq.server.connection import Connection
from pymetaq.server.longpoll import LongPoll
from pymetaq.server.puts import Appender
from pymetaq.server.stats import VERSION, PartitionInfo, Stats
from pymetaq.storage import PartitionOutOfRange, ReadStatus, UnknownTopic
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import HEADER_SIZE

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker

log = logging.getLogger("pymetaq.server")

LONG_MAX = (1 << 63) - 1
SYNC_DISABLED = b"sync is only accepted by a slave broker; this broker is not a slave"


class Dispatcher:
    """Routes parsed commands to handlers; owns the connections, the stats and the waiters."""

    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        system = broker.config.system
        self.limits = Limits(
            max_line=system.max_line_length,
            max_body=system.max_put_size,
            max_batch_body=system.max_batch_size,
        )
        self.stats = Stats()
        self.connections: set[Connection] = set()
        self.accepting = True
        self.appender = Appender(loop, self.stats, system.max_put_size)
        self._logs: dict[tuple[str, int], Any] = {}
        self.longpoll = LongPoll(self)
        self.tx = broker.transactions.attach(loop, self.stats, system.max_put_size)
        self._table: dict[type, Callable[[Connection, Any], None]] = {
            PutCommand: self.on_put,
            BatchPutCommand: self.on_bput,
            GetCommand: self.on_get,
            OffsetCommand: self.on_offset,
            StatsCommand: self.on_stats,
            VersionCommand: self.on_version,
            TransactionCommand: self.tx.on_transaction,
            TxAdminCommand: self.tx.on_admin,
            SyncCommand: self.on_sync,
        }

    # -- connections --------------------------------------------------------------------------
    def connection_opened(self, conn: Connection) -> bool:
        if not self.accepting or len(self.connections) >= self.broker.config.system.max_connections:
            return False
        self.connections.add(conn)
        self.stats.curr_connections = len(self.connections)
        return True

    def connection_closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self.stats.curr_connections = len(self.connections)
        self.longpoll.drop_connection(conn)
        self.tx.connection_closed(conn)

    def protocol_error(self, conn: Connection, exc: ProtocolError) -> None:
        log.info("bad request from %s: %s%s", conn.peer, exc.reason, " (closing)" * exc.fatal)

    def handle(self, conn: Connection, cmd: Any) -> None:
        """Run the handler of ``cmd``; any exception becomes a 500 and is logged."""
        try:
            self._table[type(cmd)](conn, cmd)
        except Exception as exc:
            log.exception("error handling %s from %s", type(cmd).__name__, conn.peer)
            opaque = getattr(cmd, "opaque", 0)
            conn.result(500, f"internal error: {exc!r}".encode(), opaque)

    def invalidate_logs(self) -> None:
        """Forget cached log lookups (after a config reload)."""
        self._logs.clear()

    # -- storage lookups ----------------------------------------------------------------------
    def _log_for_write(self, topic: str, partition: int) -> Any:
        key = (topic, partition)
        plog = self._logs.get(key)
        if plog is None:
            plog = self.broker.store.get_log(topic, partition, create=True)
            self._logs[key] = plog
        return plog

    def _log_for_read(self, topic: str, partition: int) -> Any:
        plog = self._logs.get((topic, partition))
        if plog is not None:
            return plog
        try:
            plog = self.broker.store.get_log(topic, partition, create=False)
        except (UnknownTopic, PartitionOutOfRange):
            return None
        if plog is not None:
            self._logs[(topic, partition)] = plog
        return plog

    # -- put ------------------------------------------------------------------------------------
    def _put_target(self, conn: Connection, topic: str, partition: int, opaque: int) -> Any:
        """Resolve (topic, partition) for a put, answering the error itself; None on error."""
        tc = self.broker.config.topic_config(topic)
        if tc is None:
            self._put_failed(
                conn, opaque, f"The topic `{topic}` is not in topics list of the broker"
            )
            return None
        if not tc.accept_publish:
            self.stats.counters["put_failed"] += 1
            conn.result(
                403, f"The topic `{topic}` in broker does not accept publish".encode(), opaque
            )
            return None
        if partition == -1:
            partition = random.randrange(tc.num_partitions)
        if not 0 <= partition < tc.num_partitions:
            self._put_failed(
                conn,
                opaque,
                f"Wrong partition {partition} for topic `{topic}`: "
                f"it has {tc.num_partitions} partition(s)",
            )
            return None
        try:
            return self._log_for_write(topic, partition), tc
        except (UnknownTopic, PartitionOutOfRange) as exc:
            self._put_failed(conn, opaque, str(exc))
            return None

    def _put_failed(self, conn: Connection, opaque: int, reason: str, code: int = 500) -> None:
        self.stats.counters["put_failed"] += 1
        conn.result(code, reason.encode("utf-8", "replace"), opaque)

    def on_put(self, conn: Connection, cmd: PutCommand) -> None:
        self.stats.counters["cmd_put"] += 1
        if cmd.tx_key is not None and cmd.tx_key != "null":
            self.tx.on_put(conn, cmd, self._put_target)
            return
        crc = checksum(cmd.data)
        if cmd.checksum is not None and cmd.checksum != crc:
            self._put_failed(
                conn, cmd.opaque, f"Checksum failed: expected {cmd.checksum}, computed {crc}"
            )
            return
        target = self._put_target(conn, cmd.topic, cmd.partition, cmd.opaque)
        if target is None:
            return
        plog, tc = target
        self.appender.put(conn, plog, tc.stat, cmd.data, cmd.flag, crc, cmd.opaque)

    def on_bput(self, conn: Connection, cmd: BatchPutCommand) -> None:
        self.stats.counters["cmd_put"] += 1
        body = cmd.body if isinstance(cmd.body, bytearray) else bytearray(cmd.body)
        if cmd.checksum is not None and cmd.checksum != checksum(body):
            self._put_failed(conn, cmd.opaque, "Checksum failed: batch body checksum mismatch")
            return
        if not 0 < cmd.count <= len(body) // HEADER_SIZE:
            reason = f"invalid batch: {cmd.count} records cannot fill a {len(body)}-byte body"
            self._put_failed(conn, cmd.opaque, reason, code=400)
            return
        target = self._put_target(conn, cmd.topic, cmd.partition, cmd.opaque)
        if target is None:
            return
        plog, tc = target
        self.appender.batch(conn, plog, tc.stat, body, cmd.opaque)

    # -- get / offset ---------------------------------------------------------------------------
    def on_get(self, conn: Connection, cmd: GetCommand) -> None:
        self.stats.counters["cmd_get"] += 1
        if cmd.max_size <= 0:
            conn.result(400, f"Bad request,invalid max size:{cmd.max_size}".encode(), cmd.opaque)
            return
        tc = self.broker.config.topic_config(cmd.topic)
        if tc is not None and not tc.accept_subscribe:
            conn.result(
                403,
                f"The topic `{cmd.topic}` in broker does not accept subscribe".encode(),
                cmd.opaque,
            )
            return
        long_poll = (cmd.max_wait_ms or 0) > 0
        plog = self._log_for_read(cmd.topic, cmd.partition)
        if plog is None and long_poll and tc is not None and 0 <= cmd.partition < tc.num_partitions:
            plog = self._log_for_write(cmd.topic, cmd.partition)  # wait on a store to come
        if plog is None:
            self._get_miss(conn, cmd.topic, tc is not None and tc.stat)
            conn.result(
                404,
                f"The topic `{cmd.topic}` in partition `{cmd.partition}` is not exists".encode(),
                cmd.opaque,
            )
            return
        if not self.answer_get(conn, cmd, plog, final=not long_poll):
            self.longpoll.wait(conn, cmd, plog)

    def answer_get(self, conn: Connection, cmd: GetCommand, plog: Any, *, final: bool) -> bool:
        """Answer a get from the log; False (nothing sent) when there is no data and not final."""
        stat = self._stat_topic(cmd.topic)
        max_size = min(cmd.max_size, self.broker.config.system.max_transfer_size)
        res = plog.read(cmd.offset, max_size)
        if res.status is ReadStatus.OK:
            region = res.region
            if stat:
                self.stats.realtime("get", cmd.topic, region.length)
            conn.reply_region(b"value %d %d\r\n" % (region.length, cmd.opaque), region)
            return True
        if res.status is ReadStatus.OUT_OF_RANGE:
            below = cmd.offset < plog.min_offset
            if below or cmd.offset == LONG_MAX or self.broker.config.system.update_consumer_offsets:
                self._get_miss(conn, cmd.topic, stat)
                conn.result(301, str(res.offset).encode(), cmd.opaque)
                return True
        if not final:
            return False
        self._get_miss(conn, cmd.topic, stat)
        conn.result(404, f"Could not find message at position {cmd.offset}".encode(), cmd.opaque)
        return True

    def _stat_topic(self, topic: str) -> bool:
        tc = self.broker.config.topic_config(topic)
        return tc is not None and tc.stat

    def _get_miss(self, conn: Connection, topic: str, stat: bool) -> None:
        self.stats.counters["get_miss"] += 1
        if stat:
            self.stats.realtime("get_miss", topic)

    def on_offset(self, conn: Connection, cmd: OffsetCommand) -> None:
        self.stats.counters["cmd_offset"] += 1
        plog = self._log_for_read(cmd.topic, cmd.partition)
        if plog is None:
            conn.result(
                404,
                f"The topic `{cmd.topic}` in partition `{cmd.partition}` is not exists".encode(),
                cmd.opaque,
            )
            return
        if self._stat_topic(cmd.topic):
            self.stats.realtime("offset", cmd.topic)
        conn.result(200, str(plog.nearest_offset(cmd.offset)).encode(), cmd.opaque)

    # -- the rest -------------------------------------------------------------------------------
    def on_stats(self, conn: Connection, cmd: StatsCommand) -> None:
        if cmd.item.strip() == "transactions":
            lines = "".join(line + "\r\n" for line in self.tx.stats_lines())
            conn.result(200, f"STATS\r\n{lines}END\r\n".encode(), cmd.opaque)
            return
        infos = [
            PartitionInfo(
                p.topic, p.partition, p.min_offset, p.max_offset, p.message_count, p.message_bytes
            )
            for p in self.broker.store.logs()
        ]
        body = self.stats.render(cmd.item, self.broker.config, self.broker.port, infos)
        conn.result(200, body, cmd.opaque)

    def on_version(self, conn: Connection, cmd: VersionCommand) -> None:
        conn.result(200, VERSION.encode(), cmd.opaque)

    def on_sync(self, conn: Connection, cmd: SyncCommand) -> None:
        conn.result(500, SYNC_DISABLED, cmd.opaque)
