"""Command handlers: one method per verb, chosen through a table keyed by command type.

Replies and codes are MetaQ 1.4's (``BrokerCommandProcessor``):

| verb         | success                                  | errors                                   |
|--------------|------------------------------------------|------------------------------------------|
| put          | 200 ``"<msgId> <partition> <offset>"``   | 403 acceptPublish=false or the partition |
|              |                                          | closed (``admin close``); 500 unknown    |
|              |                                          | topic, bad partition, checksum mismatch, |
|              |                                          | write failure, a pattern topic over      |
|              |                                          | maxAutoCreatedPartitions, out of file    |
|              |                                          | descriptors; 400: data over              |
|              |                                          | maxTransferSize - 20 (codec limit, body  |
|              |                                          | discarded), a flag the data does not     |
|              |                                          | honour (``storage/flags.py``); with a tx |
|              |                                          | key: :mod:`.transaction.handler`         |
| bput         | 200 ``"<firstId> <partition> <offset>    | as put; 400 malformed records (framing,  |
|              | <count>"`` (count = records stored)      | a record CRC or flag, a record's data    |
|              |                                          | over maxTransferSize - 20: nothing       |
|              |                                          | stored) or a count that cannot fit the   |
|              |                                          | body; 9 tokens (idempotent): a duplicate |
|              |                                          | gets the original 200, 409 out of order  |
|              |                                          | (``server/idempotence.py``); 8 tokens    |
|              |                                          | (tx key): :mod:`.transaction.handler`    |
| get          | ``value <len> <opaque>`` + log slice     | 400 maxSize <= 0; 403 acceptSubscribe=   |
|              |                                          | false; 404 no such store / no data;      |
|              |                                          | 301 ``<offset>`` out of range (see       |
|              |                                          | below); 500 read failure (out of file    |
|              |                                          | descriptors: retry later)                |
| offset       | 200 ``<nearest segment start>``          | 404 no such store                        |
| stats        | 200 ``STATS\\r\\n...END\\r\\n``          |                                          |
| version      | 200 version string (also the heartbeat)  |                                          |
| transaction  | :mod:`pymetaq.server.transaction.handler` (also ``txadmin``, ``stats transactions``) |
| sync, bsync  | -                                        | 500 not a slave                          |
| producers    | 200 ``producers.idem`` entries (binary)  | 404 no such store; 500 file unreadable   |
| admin        | 200 text (:mod:`pymetaq.server.monitor.ops`) | 403 not from a loopback address      |
|              |                                          | (security off) or no admin right;        |
|              |                                          | 400/404/500 per action                   |

With ``[security] enable=true`` every command is first checked against the connection's
identity (:mod:`pymetaq.server.security.guard`): a denial is ``result 403`` with the exact text
of :mod:`pymetaq.server.security.acl`; ``auth`` is routed to the guard.

The ``bput`` count token is checked only against the body length: the records themselves are
walked once, by storage's validate-and-stamp loop (no second per-record pass in the broker), and
the reply carries the count storage wrote.  Single puts are coalesced per partition by
:mod:`pymetaq.server.puts`.

Get out of range (MetaQ): offset below the first segment → 301 with the first offset; above
the durable end → 301 with the end only if ``updateConsumerOffsets=true`` (or offset is
Long.MAX_VALUE), else 404.  ``offset`` answers MetaQ's getNearestOffset: the start of the
segment holding the offset.  A get never creates a store: a long-poll get on a configured
partition without one waits for the first put to create it.

What clients can make the broker hold is bounded here (see :mod:`pymetaq.server.limits`):
partitions created for pattern topics, connections per IP, body bytes being received, and
realtime stats keyed only by topics that exist (a miss on a name that has no store counts under
its ``[topic=...]`` section's name, so invented names never grow the map).  Running out of file
descriptors (EMFILE/ENFILE) is answered 500 per request and never stops the broker.

Monitoring (:mod:`pymetaq.server.monitor`): each get on an existing partition records the
group's position (``stats lag``), each data reply its bytes; the put path only checks for a
closed partition, and only while one is closed.

Thread-safety: everything runs on the event-loop thread (storage callbacks are marshalled onto it
by :mod:`pymetaq.server.puts` and :mod:`pymetaq.server.longpoll`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TypeVar, cast

from pymetaq.client.protocol import (
    AdminCommand,
    AuthCommand,
    BatchPutCommand,
    BatchSyncCommand,
    Event,
    GetCommand,
    Limits,
    OffsetCommand,
    ProducersCommand,
    ProtocolError,
    PutCommand,
    StatsCommand,
    SyncCommand,
    TransactionCommand,
    TxAdminCommand,
    VersionCommand,
)
from pymetaq.client.protocol.model import PRODUCERS_MAX_ENTRIES
from pymetaq.client.protocol.names import topic_name_error
from pymetaq.ha.sync import sync_record
from pymetaq.server.config import TopicConfig
from pymetaq.server.connection import Connection
from pymetaq.server.errors import describe_os_error
from pymetaq.server.filters import Filters
from pymetaq.server.limits import (
    BodyBudget,
    ConnectionCounts,
    MemoryReturn,
    Throttled,
    descriptor_shortfall,
)
from pymetaq.server.longpoll import LongPoll
from pymetaq.server.monitor.ops import Admin, is_loopback
from pymetaq.server.monitor.state import LAG_HELP, Monitor
from pymetaq.server.partitions import Partitions, TooManyPartitions
from pymetaq.server.puts import Appender
from pymetaq.server.replication import REPLICATION_HELP, put_refusal, replication_lines
from pymetaq.server.retention import STATS_HELP as RETENTION_HELP
from pymetaq.server.retention import stats_lines as retention_lines
from pymetaq.server.security.guard import Guard
from pymetaq.server.stats import VERSION, PartitionInfo, Stats
from pymetaq.storage import (
    PartitionLog,
    PartitionOutOfRange,
    ReadStatus,
    StorageError,
    UnknownTopic,
)
from pymetaq.storage.checksum import checksum
from pymetaq.storage.flags import flag_problem
from pymetaq.storage.record import HEADER_SIZE

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker

log = logging.getLogger("pymetaq.server")

LONG_MAX = (1 << 63) - 1
#: topic names whose put checks passed, remembered per config (a hostile client naming new
#: topics that match a ``*`` pattern cannot grow it past this: it starts over)
TOPIC_CACHE_MAX = 4096
SYNC_DISABLED = b"sync is only accepted by a slave broker; this broker is not a slave"
ADMIN_LOOPBACK_ONLY = b"admin commands are accepted only from this host (a loopback address)"


C = TypeVar("C")
Handler = Callable[["Connection", object], None]


def _route(kind: type[C], handler: Callable[[Connection, C], None]) -> tuple[type, Handler]:
    """A table entry: mypy checks that ``handler`` takes ``kind``."""
    return kind, cast(Handler, handler)


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
        self.stats.slave = broker.slave_config is not None
        self.monitor = Monitor(system)
        self.admin = Admin(broker, self.monitor.closed)
        self.stats.add_item("lag", LAG_HELP, lambda: self.monitor.lag_lines(broker.store.logs()))
        self.connections: set[Connection] = set()
        self.accepting = True
        self.appender = Appender(
            loop, self.stats, system.max_put_size, producers_sync=system.producers_sync
        )
        self.body_budget = BodyBudget(system.max_buffered_body_bytes)
        self.per_ip = ConnectionCounts(system.max_connections_per_ip)
        self.throttled = Throttled(log)
        self.longpoll = LongPoll(self)
        self.filters = Filters(lambda: broker.config)
        self.guard = Guard(broker.config.security, loop)
        self.partitions = Partitions(broker, self._store_created)
        #: a gregor slave's resolved sync targets (topic, partition) -> (log, topic config)
        self._sync_targets: dict[tuple[str, int], tuple[PartitionLog, TopicConfig]] = {}
        #: valid topic names and their config, for the config object they were looked up in
        self._topics: dict[str, TopicConfig] = {}
        self._topics_of: object = None
        #: the connections a master's syncs came on (a rejoined slave drops them when it asks
        #: its master to follow it again: server/rejoin.py)
        self.sync_peers: weakref.WeakSet[Connection] = weakref.WeakSet()
        self.tx = broker.transactions.attach(loop, self.stats, system.max_put_size)
        self.stats.add_item(
            "transactions", "Returns the open transactions (pymetaq).", self.tx.stats_lines
        )
        self.stats.add_item("replication", REPLICATION_HELP, lambda: replication_lines(broker))
        self.stats.add_item("retention", RETENTION_HELP, lambda: retention_lines(broker))
        self._table: dict[type, Handler] = dict(
            (
                _route(PutCommand, self.on_put),
                _route(BatchPutCommand, self.on_bput),
                _route(GetCommand, self.on_get),
                _route(OffsetCommand, self.on_offset),
                _route(StatsCommand, self.on_stats),
                _route(VersionCommand, self.on_version),
                _route(TransactionCommand, self.tx.on_transaction),
                _route(TxAdminCommand, self.tx.on_admin),
                _route(SyncCommand, self.on_sync),
                _route(BatchSyncCommand, self.on_bsync),
                _route(ProducersCommand, self.on_producers),
                _route(AdminCommand, self.on_admin),
                _route(AuthCommand, self.guard.on_auth),
            )
        )
        partitions = len(broker.store.logs()) + system.max_auto_created_partitions
        shortfall = descriptor_shortfall(system.max_connections, partitions)
        if shortfall is not None:
            log.warning("%s", shortfall)
        self.memory_return = MemoryReturn()
        self._sweep = loop.call_later(self._sweep_period(), self._check_deadlines)

    # -- connections --------------------------------------------------------------------------
    def connection_opened(self, conn: Connection) -> bool:
        system = self.broker.config.system
        if not self.accepting:
            return False
        if len(self.connections) >= system.max_connections:
            self.throttled.log(
                "maxConnections",
                logging.WARNING,
                "closing connection from %s: maxConnections reached (%d)",
                conn.peer,
                system.max_connections,
            )
            return False
        if not self.per_ip.admit(conn.peer_ip):
            self.throttled.log(
                f"perip:{conn.peer_ip}",
                logging.WARNING,
                "closing connection from %s: maxConnectionsPerIp reached (%d from %s)",
                conn.peer,
                system.max_connections_per_ip,
                conn.peer_ip,
            )
            return False
        self.connections.add(conn)
        self.stats.curr_connections = len(self.connections)
        conn.identity = self.guard.identify(conn)
        return True

    def connection_closed(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.per_ip.release(conn.peer_ip)
        self.stats.curr_connections = len(self.connections)
        self.body_budget.release(conn)
        self.longpoll.drop_connection(conn)
        self.tx.connection_closed(conn)

    def protocol_error(self, conn: Connection, exc: ProtocolError) -> None:
        self.monitor.protocol_errors += 1
        self.throttled.log(
            f"bad:{conn.peer_ip}",
            logging.INFO,
            "bad request from %s: %s%s",
            conn.peer,
            exc.reason,
            " (closing)" * exc.fatal,
        )

    def _sweep_period(self) -> float:
        timeout_ms = self.broker.config.system.request_timeout_ms
        return min(1.0, timeout_ms / 4000.0) if timeout_ms > 0 else 1.0

    def _check_deadlines(self) -> None:
        """Abort connections whose request, replies or close outlived requestTimeoutMs; hand
        memory of released bodies back to the OS."""
        timeout_s = self.broker.config.system.request_timeout_ms / 1000.0
        if timeout_s > 0:
            now = self.loop.time()
            for conn in list(self.connections):
                reason = conn.check_deadlines(now, timeout_s)
                if reason is not None:
                    self.throttled.log(
                        "deadline", logging.INFO, "closed connection from %s: %s", conn.peer, reason
                    )
        self.memory_return.maybe_trim(self.body_budget)
        self._sweep = self.loop.call_later(self._sweep_period(), self._check_deadlines)

    def handle(self, conn: Connection, cmd: Event) -> None:
        """Run the handler of ``cmd``; any exception becomes a 500 and is logged."""
        try:
            if self.guard.enabled:
                denial = self.guard.denied(conn, cmd)
                if denial is not None:
                    conn.result(403, denial, getattr(cmd, "opaque", 0))
                    return
            self._table[type(cmd)](conn, cmd)
        except Exception as exc:
            log.exception("error handling %s from %s", type(cmd).__name__, conn.peer)
            opaque = getattr(cmd, "opaque", 0)
            conn.result(500, f"internal error: {exc!r}".encode(), opaque)

    def _store_created(self, topic: str, partition: int, plog: PartitionLog) -> None:
        """A put created a partition's store: wake gets waiting for it, register the topic
        in ZooKeeper (a pattern topic's first put)."""
        self.longpoll.store_created(topic, partition, plog)
        self.broker.topic_stored(topic)

    def _topic_config(self, topic: str) -> TopicConfig | None:
        """The config of a valid ``topic`` (None: an invalid name, or no section matches it),
        remembered for the broker's current config (a lookup walks every section)."""
        config = self.broker.config
        if self._topics_of is not config:  # reloaded (or never looked up)
            self._topics.clear()
            self._topics_of = config
        tc = self._topics.get(topic)
        if tc is None:
            if topic_name_error(topic) is not None:
                return None
            tc = config.topic_config(topic)
            if tc is None:
                return None
            if len(self._topics) >= TOPIC_CACHE_MAX:
                self._topics.clear()
            self._topics[topic] = tc
        return tc

    def invalidate_logs(self) -> None:
        """Forget cached log lookups (after a config reload)."""
        self.partitions.invalidate()
        self._sync_targets.clear()

    def read_failure(self, plog: PartitionLog, exc: BaseException) -> bytes:
        """Log a failed read (throttled) and give the 500 reply's text."""
        reason = describe_os_error(exc)
        self.throttled.log(
            f"read:{plog.topic}", logging.WARNING, "read of %s failed: %s", plog.name, reason
        )
        return f"Could not read {plog.name}: {reason}".encode("utf-8", "replace")

    # -- put ------------------------------------------------------------------------------------
    def _put_target(
        self, conn: Connection, topic: str, partition: int, opaque: int, *, sync: bool = False
    ) -> tuple[PartitionLog, TopicConfig] | None:
        """Resolve (topic, partition) for a put, answering the error itself; None on error."""
        tc = self._topic_config(topic)
        if tc is None:
            bad = topic_name_error(topic)
            if bad is not None:  # before anything touches the disk
                self._put_failed(conn, opaque, bad, code=400)
                return None
            self._put_failed(
                conn, opaque, f"The topic `{topic}` is not in topics list of the broker"
            )
            return None
        refused = None if sync else put_refusal(self.broker)
        if refused is not None:  # a replica: only the master writes its offsets
            self._put_failed(conn, opaque, refused, code=403)
            return None
        if not tc.accept_publish:
            self.stats.counters["put_failed"] += 1
            conn.result(
                403, f"The topic `{topic}` in broker does not accept publish".encode(), opaque
            )
            return None
        if self.monitor.closed.active:  # only while some partition is closed (admin close)
            partition, why = self.monitor.closed.check_put(self.broker, tc, topic, partition)
            if why is not None:
                self._put_failed(conn, opaque, why, code=403)
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
            return self.partitions.for_write(topic, partition, tc), tc
        except (UnknownTopic, PartitionOutOfRange, TooManyPartitions) as exc:
            self._put_failed(conn, opaque, str(exc))
        except (StorageError, OSError) as exc:
            reason = describe_os_error(exc)
            self.throttled.log(
                f"create:{tc.name}",
                logging.WARNING,
                "opening %s-%d failed: %s",
                topic,
                partition,
                reason,
            )
            self._put_failed(conn, opaque, f"Put message failed: {reason}")
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
        if cmd.flag and (why := flag_problem(cmd.flag, cmd.data)) is not None:
            # refused here, not by storage: a coalesced append fails as a whole
            self._put_failed(conn, cmd.opaque, f"invalid records: {why}", code=400)
            return
        target = self._put_target(conn, cmd.topic, cmd.partition, cmd.opaque)
        if target is None:
            return
        plog, tc = target
        self.appender.put(conn, plog, tc.stat, cmd.data, cmd.flag, crc, cmd.opaque)

    def on_bput(self, conn: Connection, cmd: BatchPutCommand) -> None:
        self.stats.counters["cmd_put"] += 1
        body = self._batch_body(conn, cmd)
        if body is None:
            return
        if cmd.tx_key is not None:
            self.tx.on_bput(conn, cmd, body, self._put_target)
            return
        target = self._put_target(conn, cmd.topic, cmd.partition, cmd.opaque)
        if target is None:
            return
        plog, tc = target
        producer = None
        if cmd.producer_id is not None and cmd.sequence is not None:
            producer = (cmd.producer_id, cmd.sequence)
        self.appender.batch(conn, plog, tc.stat, body, cmd.opaque, producer)

    def _batch_body(
        self, conn: Connection, cmd: BatchPutCommand | BatchSyncCommand
    ) -> bytearray | None:
        """A ``bput``/``bsync`` body whose checksum and count are plausible, else None (answered)."""
        body = cmd.body if isinstance(cmd.body, bytearray) else bytearray(cmd.body)
        if cmd.checksum is not None and cmd.checksum != checksum(body):
            self._put_failed(conn, cmd.opaque, "Checksum failed: batch body checksum mismatch")
            return None
        if not 0 < cmd.count <= len(body) // HEADER_SIZE:
            reason = f"invalid batch: {cmd.count} records cannot fill a {len(body)}-byte body"
            self._put_failed(conn, cmd.opaque, reason, code=400)
            return None
        return body

    # -- get / offset ---------------------------------------------------------------------------
    def on_get(self, conn: Connection, cmd: GetCommand) -> None:
        self.stats.counters["cmd_get"] += 1
        if self._bad_topic(conn, cmd.topic, cmd.opaque):
            return
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
        plog = self._read_target(conn, cmd.topic, cmd.partition, cmd.opaque)
        if plog is False:
            return
        if plog is not None:
            self.monitor.lag.record(cmd.group, cmd.topic, cmd.partition, cmd.offset)
        else:
            if long_poll and tc is not None and 0 <= cmd.partition < tc.num_partitions:
                self.longpoll.wait(conn, cmd, None)  # until a put creates the store
                return
            self.answer_missing(conn, cmd, tc)
            return
        if not self.answer_get(conn, cmd, plog, final=not long_poll):
            self.longpoll.wait(conn, cmd, plog)

    def answer_missing(self, conn: Connection, cmd: GetCommand, tc: TopicConfig | None) -> None:
        """404 for a get on a partition that has no store."""
        if tc is not None:  # stats are keyed by the section, never by an invented name
            self._get_miss(tc.name, tc.stat)
        else:
            self.stats.counters["get_miss"] += 1
        conn.result(
            404,
            f"The topic `{cmd.topic}` in partition `{cmd.partition}` is not exists".encode(),
            cmd.opaque,
        )

    def answer_get(
        self, conn: Connection, cmd: GetCommand, plog: PartitionLog, *, final: bool
    ) -> bool:
        """Answer a get from the log; False (nothing sent) when there is no data and not final."""
        stat = self._stat_topic(cmd.topic)
        max_size = min(cmd.max_size, self.broker.config.system.max_transfer_size)
        try:
            res = plog.read(cmd.offset, max_size)
        except (StorageError, OSError) as exc:
            conn.result(500, self.read_failure(plog, exc), cmd.opaque)
            return True
        if res.status is ReadStatus.OK and res.region is not None:
            region = res.region
            if stat:
                self.stats.realtime("get", cmd.topic)
            self.monitor.record_sent(cmd.topic, cmd.partition, region.length)
            gf = self.filters.find(cmd.topic, cmd.group)
            if gf is not None:  # a filtered group: decode, filter, re-send (server/filters.py)
                try:
                    data = region.read_bytes()
                except OSError as exc:
                    conn.result(500, self.read_failure(plog, exc), cmd.opaque)
                    return True
                finally:
                    region.close()
                self.filters.answer(conn, cmd, data, gf)
                return True
            conn.reply_region(plog, cmd.offset, region, cmd.opaque)
            return True
        if res.status is ReadStatus.OUT_OF_RANGE:
            # the nearest data is ahead: before the first offset, or in a gap (offsets whose
            # data is gone, see storage.recovery): always 301 there, never a 404 to wait on
            ahead = res.offset > cmd.offset
            if ahead or cmd.offset == LONG_MAX or self.broker.config.system.update_consumer_offsets:
                self._get_miss(cmd.topic, stat)
                conn.result(301, str(res.offset).encode(), cmd.opaque)
                return True
        if not final:
            return False
        self._get_miss(cmd.topic, stat)
        conn.result(404, f"Could not find message at position {cmd.offset}".encode(), cmd.opaque)
        return True

    def _stat_topic(self, topic: str) -> bool:
        tc = self.broker.config.topic_config(topic)
        return tc is not None and tc.stat

    def _get_miss(self, key: str, stat: bool) -> None:
        self.stats.counters["get_miss"] += 1
        if stat:  # MetaQ counts every get, answered with data or not
            self.stats.realtime("get", key)
            self.stats.realtime("get_miss", key)

    def on_offset(self, conn: Connection, cmd: OffsetCommand) -> None:
        self.stats.counters["cmd_offset"] += 1
        plog = self._existing_log(conn, cmd.topic, cmd.partition, cmd.opaque)
        if plog is None:
            return
        if self._stat_topic(cmd.topic):
            self.stats.realtime("offset", cmd.topic)
        conn.result(200, str(plog.nearest_offset(cmd.offset)).encode(), cmd.opaque)

    def on_producers(self, conn: Connection, cmd: ProducersCommand) -> None:
        """pymetaq's ``producers``: an async slave asks for the idempotent producers' entries
        of the range of the log it copied (empty when the partition has none)."""
        plog = self._existing_log(conn, cmd.topic, cmd.partition, cmd.opaque)
        if plog is None:
            return
        try:
            producers = self.appender.idempotence.known(plog)
            found = (
                producers.between(cmd.after, cmd.upto, PRODUCERS_MAX_ENTRIES) if producers else []
            )
        except OSError as exc:
            conn.result(500, f"producers file: {describe_os_error(exc)}".encode(), cmd.opaque)
            return
        conn.result(200, b"".join(e.encode() for e in found), cmd.opaque)

    # -- names and damaged partitions (issue 8) -------------------------------------------------
    def _bad_topic(self, conn: Connection, topic: str, opaque: int) -> bool:
        """Answer 400 for a name that can never be a topic (before anything touches the disk)."""
        bad = topic_name_error(topic)
        if bad is not None:
            conn.result(400, bad.encode(), opaque)
        return bad is not None

    def _existing_log(
        self, conn: Connection, topic: str, partition: int, opaque: int
    ) -> PartitionLog | None:
        """The log of an ``offset``/``producers`` request, or None after answering 400 (a bad
        name), 404 (no store) or 500 (fenced as damaged)."""
        if self._bad_topic(conn, topic, opaque):
            return None
        plog = self._read_target(conn, topic, partition, opaque)
        if plog is None:
            text = f"The topic `{topic}` in partition `{partition}` is not exists"
            conn.result(404, text.encode(), opaque)
        return None if plog is False else plog

    def _read_target(
        self, conn: Connection, topic: str, partition: int, opaque: int
    ) -> PartitionLog | Literal[False] | None:
        """The log for a get/offset, None if there is none, or False after answering 500 for a
        partition that cannot be served (fenced as damaged)."""
        try:
            return self.partitions.for_read(topic, partition)
        except StorageError as exc:
            conn.result(500, str(exc).encode("utf-8", "replace"), opaque)
            return False

    # -- the rest -------------------------------------------------------------------------------
    def on_stats(self, conn: Connection, cmd: StatsCommand) -> None:
        conn.result(200, self.stats_body(cmd.item), cmd.opaque)

    def stats_body(self, item: str) -> bytes:
        """The body of ``stats <item>`` (also the dashboard's ``/stats/<item>``)."""
        infos = [
            PartitionInfo(
                p.topic, p.partition, p.min_offset, p.max_offset, p.message_count, p.message_bytes
            )
            for p in self.broker.store.logs()
        ]
        return self.stats.render(item, self.broker.config, self.broker.port, infos)

    def on_version(self, conn: Connection, cmd: VersionCommand) -> None:
        conn.result(200, VERSION.encode(), cmd.opaque)

    def on_sync(self, conn: Connection, cmd: SyncCommand) -> None:
        """A gregor slave stores its samsa master's message (its id and flag) and answers once
        it is durable; any other broker refuses."""
        if not self.broker.gregor:
            conn.result(500, SYNC_DISABLED, cmd.opaque)
            return
        self.stats.counters["cmd_put"] += 1
        self.sync_peers.add(conn)
        try:
            record = sync_record(cmd)
        except ValueError as e:
            self._put_failed(conn, cmd.opaque, f"Put message failed: {e}")
            return
        target = self._sync_target(conn, cmd.topic, cmd.partition, cmd.opaque)
        if target is not None:
            plog, tc = target
            self.appender.synced(conn, plog, tc.stat, record, cmd.msg_id, cmd.opaque)

    def on_bsync(self, conn: Connection, cmd: BatchSyncCommand) -> None:
        """pymetaq's batched ``sync``: a gregor slave appends the master's stored batch as it
        is (storage checks every record's CRC and that no id is 0) and answers once durable."""
        if not self.broker.gregor:
            conn.result(500, SYNC_DISABLED, cmd.opaque)
            return
        self.stats.counters["cmd_put"] += 1
        self.sync_peers.add(conn)
        body = self._batch_body(conn, cmd)
        if body is None:
            return
        target = self._sync_target(conn, cmd.topic, cmd.partition, cmd.opaque)
        if target is not None:
            plog, tc = target
            producer = None
            if cmd.producer_id is not None and cmd.sequence is not None:
                producer = (cmd.producer_id, cmd.sequence)
            self.appender.synced_batch(conn, plog, tc.stat, body, cmd.opaque, cmd.offset, producer)

    def _sync_target(
        self, conn: Connection, topic: str, partition: int, opaque: int
    ) -> tuple[PartitionLog, TopicConfig] | None:
        key = (topic, partition)
        target = self._sync_targets.get(key)
        if target is None or target[0].closed or self.monitor.closed.active:
            target = self._put_target(conn, topic, partition, opaque, sync=True)
            if target is None:
                return None
            self._sync_targets[key] = target  # a checked, existing partition: bounded
        return target

    def on_admin(self, conn: Connection, cmd: AdminCommand) -> None:
        """pymetaq's ``admin`` (server/monitor/ops.py): loopback peers only until clients are
        authenticated; with ``[security] enable=true`` the admin right instead (checked in
        :meth:`handle`)."""
        if not self.guard.enabled and not is_loopback(conn.peer_ip):
            conn.result(403, ADMIN_LOOPBACK_ONLY, cmd.opaque)
            return
        code, text = self.admin.run(cmd.action, cmd.args)
        conn.result(code, text.encode("utf-8", "replace"), cmd.opaque)
