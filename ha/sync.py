"""MetaQ's synchronous pair: the samsa master's link to its gregor slave, and the sync record.

Wire (MetaQ 1.4, master to slave): one ``sync <topic> <partition> <len> <flag> <msgId>
<checksum> <opaque>\\r\\n<data>`` per message, the master's id and flag; the slave appends the
record ``>iiqi`` (len, CRC32(data) & 0x7FFFFFFF, msgId, flag) + data and answers
``result 200 "<msgId> <partition> <offset>"`` once it is durable under its own flush policy.

pymetaq's batched form (an extension, docs/protocol.md): ``bsync <topic> <partition> <len>
<count> <checksum> <opaque>\\r\\n<body>``, the stored batch as it is (records with the
master's ids and flags, ``checksum`` = CRC32(body) & 0x7FFFFFFF); a pymetaq slave appends it
with one append and answers once, ``result 200 "<firstMsgId> <partition> <offset> <count>"``
when it is durable.
A batch the master took as an idempotent ``bput`` carries its ``<producerId> <sequence>``
before the opaque (the 9-token form; 10 with the aligned offset): the slave records the batch
in the partition's ``producers.idem`` as the master did, so once promoted it answers the
producer's retry with the original result (:mod:`pymetaq.server.idempotence`).  MetaQ's
gregor never sees it: it is sent ``sync`` only.

:class:`SyncLink` (samsa side) asks a newly connected slave its ``version``: a pymetaq slave
gets each stored batch as one ``bsync`` (a batch over :data:`BSYNC_MAX` as ``sync``\\ s), any
other slave (MetaQ's gregor) as the batch's ``sync`` commands in one write; until the answer
is in, ``sync`` is used.  Either way: one timer and one future per batch, the future completed
when every reply is 200 (a ``bsync`` reply must name the batch's first id and count): one round
trip per batch, pipelined with the next batches (the producer's ack waits for it, not the
master's event loop).
While the link is down, :meth:`SyncLink.check` says so and the put is answered
``500 Slave is disconnected`` before anything is written (MetaQ's behaviour).  A failed batch
counts towards ``slaveContinuousFailureThreshold`` (any success resets it); reaching it calls
``on_unhealthy`` (the broker unregisters from ZooKeeper); the link reconnects every
``checkSlaveIntervalInMills`` and the first success after that calls ``on_healthy``
(re-register).

An ``aligned`` link (a promoted master's link to the replaced master that rejoined it,
:mod:`pymetaq.ha.rejoin`) sends the 8-token ``bsync`` with each batch's offset on the master:
the slave stores it only if its log ends exactly there, and the reply must name that offset.

Thread-safety: one event loop (the broker's); :meth:`replicate` and :meth:`check` on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable
from typing import Any

from pymetaq.client.protocol import (
    NEED_DATA,
    Limits,
    Parser,
    ProtocolError,
    ResultReply,
    Role,
    SyncCommand,
    VersionCommand,
    encode,
)
from pymetaq.ha.config import SamsaConfig
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import HEADER, HEADER_SIZE

log = logging.getLogger("pymetaq.ha")

SLAVE_DISCONNECTED = "Slave is disconnected "
_HEAD = struct.Struct(">iiqi")
#: opaques are signed 32-bit and MetaQ reserves 2**31 - 1: wrap before it
OPAQUE_LIMIT = (1 << 31) - 2
#: the largest batch sent as one ``bsync`` (a slave's default ``bput``/``bsync`` body limit)
BSYNC_MAX = Limits().max_batch_body
#: what a pymetaq broker's ``version`` reply starts with (server/stats.py's VERSION)
PYMETAQ_VERSION = b"pymetaq-"


class SyncFailed(Exception):
    """The slave did not confirm a batch (the message says why)."""


def sync_commands(topic: str, partition: int, records: bytes | bytearray) -> list[SyncCommand]:
    """One ``sync`` per record of a stored (stamped) batch."""
    out: list[SyncCommand] = []
    view = memoryview(records)
    pos, n = 0, len(records)
    while pos + HEADER_SIZE <= n:
        length, crc, msg_id, flag = _HEAD.unpack_from(records, pos)
        end = pos + HEADER_SIZE + length
        out.append(
            SyncCommand(topic, partition, bytes(view[pos + HEADER_SIZE : end]), flag, msg_id, crc)
        )
        pos = end
    return out


def encode_syncs(
    topic: str, partition: int, records: bytes | bytearray, first_op: int
) -> tuple[bytearray, int]:
    """The ``sync`` commands of a stored batch, encoded (opaques from ``first_op``), and their
    count: the bytes ``encode`` writes for :func:`sync_commands`, without the objects."""
    out = bytearray()
    head = b"sync %s %d " % (topic.encode(), partition)
    pos, n, op = 0, len(records), first_op
    while pos + HEADER_SIZE <= n:
        length, crc, msg_id, flag = _HEAD.unpack_from(records, pos)
        start = pos + HEADER_SIZE
        out += head
        out += b"%d %d %d %d %d\r\n" % (length, flag, msg_id, crc, op)
        out += records[start : start + length]
        pos = start + length
        op += 1
    return out, op - first_op


def bsync_head(topic: str, partition: int, records: bytes | bytearray) -> tuple[bytes, int, int]:
    """The ``bsync`` line of a stored batch up to its opaque (the body is ``records`` itself),
    the batch's first msgId and its record count (counted from the headers)."""
    count, pos, n = 0, 0, len(records)
    while pos + HEADER_SIZE <= n:
        count += 1
        pos += HEADER_SIZE + _HEAD.unpack_from(records, pos)[0]
    first = _HEAD.unpack_from(records, 0)[2] if n >= HEADER_SIZE else 0
    head = b"bsync %s %d %d %d %d " % (topic.encode(), partition, n, count, checksum(records))
    return head, first, count


def bsync_reply_error(body: bytes, first: int, count: int, offset: int | None = None) -> str | None:
    """None if a ``bsync`` reply body names ``first`` and ``count`` (and, given, the offset
    the batch has on the master), else what is wrong."""
    fields = body.split()
    if len(fields) == 4 and fields[0] == b"%d" % first and fields[3] == b"%d" % count:
        if offset is None or fields[2] == b"%d" % offset:
            return None
        got = fields[2].decode("ascii", "replace")
        return f"the slave stored the batch at offset {got}, not at the master's {offset}"
    return f"the slave confirmed {body.decode('utf-8', 'replace')!r}, not {count} from {first}"


def sync_record(cmd: SyncCommand) -> bytes:
    """The record a gregor slave stores for ``cmd``; ValueError if its checksum is wrong."""
    crc = checksum(cmd.data)
    if cmd.checksum is not None and cmd.checksum != crc:
        raise ValueError(f"checksum mismatch: the master sent {cmd.checksum}, data has {crc}")
    if cmd.msg_id == 0:
        raise ValueError("msgId 0 is not a message id")
    return HEADER.pack(len(cmd.data), crc, cmd.msg_id, cmd.flag) + cmd.data


class _Batch:
    """The replies one stored batch is waiting for."""

    __slots__ = ("check", "future", "left", "ops", "timer", "where", "why")

    def __init__(
        self,
        future: asyncio.Future[None],
        ops: range,
        where: tuple[str, int] | None,
        check: Callable[[ResultReply], str | None] | None = None,
    ) -> None:
        self.future = future
        self.ops = ops
        self.where = where
        self.check = check  # a 200 reply's body checked: None = fine, else why not
        self.left = len(ops)
        self.why: str | None = None
        self.timer: asyncio.TimerHandle | None = None


class _Protocol(asyncio.Protocol):
    def __init__(self, link: SyncLink) -> None:
        self.link = link
        self.parser = Parser(Role.CLIENT)

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        while True:
            try:
                event = self.parser.next_event()
            except ProtocolError as e:
                self.link._lost(f"bad reply from the slave: {e.reason}")
                return
            if event is NEED_DATA:
                return
            self.link._on_reply(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._lost(f"connection to the slave lost{f': {exc}' if exc else ''}")


class SyncLink:
    """The samsa master's connection to its gregor slave (see the module doc)."""

    def __init__(
        self,
        config: SamsaConfig,
        *,
        on_unhealthy: Callable[[], None] = lambda: None,
        on_healthy: Callable[[], None] = lambda: None,
        aligned: bool = False,
    ) -> None:
        self.config = config
        #: the slave's log is the master's, offset for offset (a rejoined replica,
        #: pymetaq.ha.rejoin): each ``bsync`` reply must name the batch's offset here
        self.aligned = aligned
        self.url = f"{config.slave_host}:{config.slave_port}"
        self.on_unhealthy = on_unhealthy
        self.on_healthy = on_healthy
        self.failures = 0  # consecutive
        self.unhealthy = False
        self.batches = 0
        #: the slave takes ``bsync`` (it said it is pymetaq); False: MetaQ's ``sync`` only
        self.batched = False
        #: set once a connection's ``version`` answer is in (tests and operators wait on it)
        self.detected = asyncio.Event()
        self._transport: asyncio.Transport | None = None
        self._waiting: dict[int, _Batch] = {}
        self._opaque = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._keep_connected())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._transport is not None:
            self._transport.close()

    async def _keep_connected(self) -> None:
        interval = self.config.check_interval_ms / 1000
        loop = asyncio.get_running_loop()
        logged = False
        while True:
            if not self.connected:
                try:
                    async with asyncio.timeout(2.0):
                        transport, _ = await loop.create_connection(
                            lambda: _Protocol(self), self.config.slave_host, self.config.slave_port
                        )
                    assert isinstance(transport, asyncio.Transport)
                    self._transport = transport
                    self.batched = False
                    self.detected.clear()
                    log.info("samsa: connected to the slave %s", self.url)
                    logged = False
                    await self._detect()
                except (OSError, TimeoutError) as e:
                    if not logged:
                        log.warning("samsa: the slave %s is unreachable: %s", self.url, e)
                        logged = True
            if self.unhealthy and self.connected:  # MetaQ's heal thread: probe until it answers
                await self._probe()
            await asyncio.sleep(interval)

    async def _detect(self) -> None:
        """Ask the slave's ``version``: a pymetaq slave is sent ``bsync``."""
        seen: list[bytes] = []

        def note(reply: ResultReply) -> None:
            seen.append(reply.body)
            return None

        try:
            await self._send(lambda op: (encode(VersionCommand(opaque=op)), 1), 1, None, note)
        except SyncFailed:
            return  # the link is down again: the next connection asks again
        self.batched = bool(seen) and seen[0].startswith(PYMETAQ_VERSION)
        self.detected.set()
        log.info("samsa: the slave %s takes %s", self.url, "bsync" if self.batched else "sync only")

    async def _probe(self) -> None:
        try:
            await self._send(lambda op: (encode(VersionCommand(opaque=op)), 1), 1, None)
        except SyncFailed:
            return
        if self.unhealthy:
            self.failures = 0
            self.unhealthy = False
            log.info("samsa: the slave %s answers again", self.url)
            self.on_healthy()

    def check(self) -> str | None:
        """None if a put may go ahead, else MetaQ's refusal text (a failure, counted)."""
        if self.connected:
            return None
        self._failure()
        return SLAVE_DISCONNECTED

    def replicate(
        self,
        topic: str,
        partition: int,
        records: bytes | bytearray,
        offset: int | None = None,
        producer: tuple[str, int] | None = None,
    ) -> asyncio.Future[None]:
        """Send the stored batch (at ``offset`` on this broker; ``producer`` = (id, sequence)
        of an idempotent ``bput``); the future completes when the slave holds all of it."""
        self.batches += 1
        where = (topic, partition)
        if self.batched and len(records) <= BSYNC_MAX:
            head, first, count = bsync_head(topic, partition, records)
            at = offset if self.aligned else None
            if at is not None:  # the 8-token form: the slave stores it only at that offset
                head += b"%d " % at
            if producer is not None:  # the slave records it in producers.idem too
                head += b"%s %d " % (producer[0].encode("ascii"), producer[1])
            fut = self._send(
                lambda op: ([head + b"%d\r\n" % op, records], 1),
                1,
                where,
                lambda reply: bsync_reply_error(reply.body, first, count, at),
            )
        else:
            fut = self._send(
                lambda op: encode_syncs(topic, partition, records, op), len(records), where
            )
        fut.add_done_callback(self._count)
        return fut

    def _send(
        self,
        build: Callable[[int], tuple[bytes | bytearray | list[bytes | bytearray], int]],
        most: int,
        where: tuple[str, int] | None,
        check: Callable[[ResultReply], str | None] | None = None,
    ) -> asyncio.Future[None]:
        """Write ``build(first_opaque)`` -> (bytes or buffers, commands); ``most`` bounds the
        count; ``check`` looks at each 200 reply (None: fine, else why the batch failed)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        transport = self._transport
        if transport is None or transport.is_closing():
            done.set_exception(SyncFailed(SLAVE_DISCONNECTED.strip()))
            return done
        first = self._opaque + 1
        if first + most >= OPAQUE_LIMIT:
            first = 1
        buf, count = build(first)
        ops = range(first, first + count)
        self._opaque = first + count - 1
        batch = _Batch(done, ops, where, check)
        waiting = self._waiting
        for op in ops:
            waiting[op] = batch
        batch.timer = loop.call_later(self.config.send_timeout_ms / 1000, self._expire, batch)
        if isinstance(buf, list):
            transport.writelines(buf)
        else:
            transport.write(buf)
        if not count:
            self._finish(batch)
        return done

    def _on_reply(self, reply: Any) -> None:
        batch = self._waiting.pop(getattr(reply, "opaque", -1), None)
        if batch is None:
            return  # late (its batch timed out) or not ours
        if batch.why is None:
            if not isinstance(reply, ResultReply) or reply.code != 200:
                body = getattr(reply, "body", b"").decode("utf-8", "replace")
                batch.why = f"{getattr(reply, 'code', '?')} {body}"
            elif batch.check is not None:
                batch.why = batch.check(reply)
        batch.left -= 1
        if batch.left == 0:
            self._finish(batch)

    def _expire(self, batch: _Batch) -> None:
        if batch.future.done():
            return
        for op in batch.ops:
            self._waiting.pop(op, None)
        batch.why = batch.why or f"no answer within {self.config.send_timeout_ms} ms"
        self._finish(batch)

    def _lost(self, why: str) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._transport = None
        batches = {id(b): b for b in self._waiting.values()}
        self._waiting.clear()
        for batch in batches.values():
            batch.why = batch.why or why
            self._finish(batch)

    def _finish(self, batch: _Batch) -> None:
        if batch.timer is not None:
            batch.timer.cancel()
        if batch.future.done():
            return
        if batch.why is None:
            batch.future.set_result(None)
        else:
            part = ""
            if batch.where is not None:
                part = f" [partition '{batch.where[0]}-{batch.where[1]}']"
            batch.future.set_exception(
                SyncFailed(f"Put message to [slave '{self.url}']{part} failed: {batch.why}")
            )

    def _count(self, fut: asyncio.Future[None]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.failures = 0
            return
        self._failure()

    def _failure(self) -> None:
        self.failures += 1
        if self.failures >= self.config.failure_threshold and not self.unhealthy:
            self.unhealthy = True
            log.error(
                "samsa: %d consecutive failures to the slave %s (slaveContinuousFailureThreshold)",
                self.failures,
                self.url,
            )
            self.on_unhealthy()
