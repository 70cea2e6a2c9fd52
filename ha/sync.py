"""MetaQ's synchronous pair: the samsa master's link to its gregor slave, and the sync record.

Wire (MetaQ 1.4, master to slave): one ``sync <topic> <partition> <len> <flag> <msgId>
<checksum> <opaque>\\r\\n<data>`` per message, the master's id and flag; the slave appends the
record ``>iiqi`` (len, CRC32(data) & 0x7FFFFFFF, msgId, flag) + data and answers
``result 200 "<msgId> <partition> <offset>"`` once it is durable under its own flush policy.

:class:`SyncLink` (samsa side) sends a stored batch as its ``sync`` commands in one write and
completes the batch's future when every reply is 200: one round trip per batch, pipelined
with the next batches (the producer's ack waits for it, not the master's event loop).
While the link is down, :meth:`SyncLink.check` says so and the put is answered
``500 Slave is disconnected`` before anything is written (MetaQ's behaviour).  A failed batch
counts towards ``slaveContinuousFailureThreshold`` (any success resets it); reaching it calls
``on_unhealthy`` (the broker unregisters from ZooKeeper); the link reconnects every
``checkSlaveIntervalInMills`` and the first success after that calls ``on_healthy``
(re-register).

Thread-safety: one event loop (the broker's); :meth:`replicate` and :meth:`check` on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable
from typing import Any

from pymetaq.client.errors import MetaClientError
from pymetaq.client.protocol import ResultReply, SyncCommand, VersionCommand
from pymetaq.client.transport.connection import BrokerConnection
from pymetaq.ha.config import SamsaConfig
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import HEADER, HEADER_SIZE

log = logging.getLogger("pymetaq.ha")

SLAVE_DISCONNECTED = "Slave is disconnected "
_HEAD = struct.Struct(">iiqi")


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


def sync_record(cmd: SyncCommand) -> bytes:
    """The record a gregor slave stores for ``cmd``; ValueError if its checksum is wrong."""
    crc = checksum(cmd.data)
    if cmd.checksum is not None and cmd.checksum != crc:
        raise ValueError(f"checksum mismatch: the master sent {cmd.checksum}, data has {crc}")
    if cmd.msg_id == 0:
        raise ValueError("msgId 0 is not a message id")
    return HEADER.pack(len(cmd.data), crc, cmd.msg_id, cmd.flag) + cmd.data


class SyncLink:
    """The samsa master's connection to its gregor slave (see the module doc)."""

    def __init__(
        self,
        config: SamsaConfig,
        *,
        on_unhealthy: Callable[[], None] = lambda: None,
        on_healthy: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.url = f"{config.slave_host}:{config.slave_port}"
        self.on_unhealthy = on_unhealthy
        self.on_healthy = on_healthy
        self.conn: BrokerConnection | None = None
        self.failures = 0  # consecutive
        self.unhealthy = False
        self.batches = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._keep_connected())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.conn is not None:
            self.conn.close()

    async def _keep_connected(self) -> None:
        interval = self.config.check_interval_ms / 1000
        logged = False
        while True:
            if not self.connected:
                try:
                    self.conn = await BrokerConnection.open(
                        self.config.slave_host, self.config.slave_port, connect_timeout_s=2.0
                    )
                    log.info("samsa: connected to the slave %s", self.url)
                    logged = False
                except MetaClientError as e:
                    if not logged:
                        log.warning("samsa: the slave %s is unreachable: %s", self.url, e)
                        logged = True
            elif self.unhealthy:  # MetaQ's heal thread: probe until the slave answers
                await self._probe()
            await asyncio.sleep(interval)

    async def _probe(self) -> None:
        conn = self.conn
        if conn is None:
            return
        try:
            reply = await conn.request(VersionCommand(), self.config.send_timeout_ms / 1000)
        except MetaClientError:
            return
        if isinstance(reply, ResultReply) and reply.code == 200 and self.unhealthy:
            self.failures = 0
            self.unhealthy = False
            log.info("samsa: the slave %s answers again", self.url)
            self.on_healthy()

    def check(self) -> str | None:
        """None if a put may go ahead, else MetaQ's refusal text."""
        return None if self.connected else SLAVE_DISCONNECTED

    def replicate(
        self, topic: str, partition: int, records: bytes | bytearray
    ) -> asyncio.Future[None]:
        """Send the stored batch; the future completes when the slave holds all of it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        conn = self.conn
        if conn is None or conn.closed:
            self._failed()
            done.set_exception(SyncFailed(SLAVE_DISCONNECTED.strip()))
            return done
        timeout = self.config.send_timeout_ms / 1000
        futures = [conn.send_request(c, timeout) for c in sync_commands(topic, partition, records)]
        self.batches += 1
        gathered = asyncio.gather(*futures, return_exceptions=True)
        gathered.add_done_callback(lambda g: self._settle(g, done, topic, partition))
        return done

    def _settle(
        self, gathered: asyncio.Future[list[Any]], done: asyncio.Future[None], topic: str, p: int
    ) -> None:
        why = None
        for reply in gathered.result():
            if isinstance(reply, BaseException):
                why = str(reply) or type(reply).__name__
                break
            if not isinstance(reply, ResultReply) or reply.code != 200:
                body = getattr(reply, "body", b"").decode("utf-8", "replace")
                why = f"{getattr(reply, 'code', '?')} {body}"
                break
        if why is None:
            self.failures = 0
            if self.unhealthy:
                self.unhealthy = False
                log.info("samsa: the slave %s answers again", self.url)
                self.on_healthy()
            done.set_result(None)
            return
        self._failed()
        done.set_exception(
            SyncFailed(
                f"Put message to [slave '{self.url}'] [partition '{topic}-{p}'] failed: {why}"
            )
        )

    def _failed(self) -> None:
        self.failures += 1
        if self.failures >= self.config.failure_threshold and not self.unhealthy:
            self.unhealthy = True
            log.error(
                "samsa: %d consecutive failures to the slave %s (slaveContinuousFailureThreshold)",
                self.failures,
                self.url,
            )
            self.on_unhealthy()
