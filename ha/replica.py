"""One partition of an asynchronous slave: pull from the master, append at the master's offsets.

A :class:`PartitionReplica` keeps the slave's log of one ``<topic>-<partition>`` equal to a
prefix of the master's, byte for byte and file for file:

1. ``get <topic> <slaveGroup> <p> <X> <maxSize> <maxWaitMs>`` from the master at ``X``, the
   slave's own log end (the long-poll form: an idle master answers after
   ``slaveMaxDelayInMills``).  A reply never crosses one of the master's segments.
2. The reply's complete records are appended **as they are** - header, the master's msgId and
   flag - with ``stamp_ids=False``, so they land at the master's offsets (storage validates
   framing and every CRC first: a damaged reply is refused, nothing is written).
3. Before appending, ``offset <topic> <slaveGroup> <p> <X>`` (MetaQ's getNearestOffset) tells
   whether ``X`` starts a segment on the master; if it does, the slave starts one there too
   (``append(new_segment=True)``).  So the segment files have the same names and contents.
   The next ``get`` is pipelined with that ``offset``: one round trip per fetch.

4. From a pymetaq master (:attr:`PartitionReplica.producers` set), ``producers <topic>
   <slaveGroup> <p> <X> <X+n>`` (pipelined too) fetches the master's idempotent producers'
   entries of the batches that end in the copied range; they are recorded (the broker's
   ``producers.idem`` and memory, :meth:`ProducerSink.adopt`) in the append's ``before_write``,
   before the bytes, and that file is synced once the records are durable - as the master
   did - so a slave switched to master answers a producer's retry as the master would have.

An empty partition starts at the master's first offset (the log is created there); after a
restart the replica resumes from its own log end (recovery has cut any torn tail).  A slave
whose end is below the master's first offset (the master's retention deleted what the slave
lacks) cannot continue contiguously: the partition stops with that error in its status.

Lag (``stats replication`` on the slave): ``lag_bytes`` = the master's durable end (as last
seen: every reply and the ``stats offsets`` poll every 250 ms) minus the slave's end;
``lag_seconds`` = 0 when caught up, else the age of the newest record the slave holds (now
minus the time in its msgId - MySQL's Seconds_Behind_Master), unknown before the first append.

Thread-safety: everything runs on the broker's event loop (storage's ``append`` is the
broker's put path too).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pymetaq.client.protocol import (
    GetCommand,
    OffsetCommand,
    ProducersCommand,
    ResultReply,
    ValueReply,
)
from pymetaq.client.protocol.model import PRODUCERS_MAX_ENTRIES
from pymetaq.storage import AppendResult, MessageStoreManager, PartitionLog, StorageError
from pymetaq.storage.ids import id_time_ms
from pymetaq.storage.producers import ProducerEntry, decode_entries
from pymetaq.storage.record import HEADER_SIZE

log = logging.getLogger("pymetaq.ha")

_LEN = struct.Struct(">i")
_ID = struct.Struct(">q")
#: largest fetch a replica grows to for one oversize record (doubling from maxTransferSize)
MAX_FETCH = 256 << 20


class ProducerSink(Protocol):
    """Where an async slave records the master's idempotent producers' entries (the
    broker's :class:`pymetaq.server.idempotence.Idempotence`)."""

    def adopt(self, plog: PartitionLog, entries: list[ProducerEntry]) -> Callable[[], None]:
        """Record ``entries`` (called in the log's ``before_write``); returns what makes them
        durable (called from the flusher thread)."""
        ...


class ReplicaError(Exception):
    """The partition cannot be replicated (the reason is in the message)."""


def complete_prefix(data: bytes | memoryview) -> tuple[int, int]:
    """(bytes, msgId of the last record) of the complete records at the start of ``data``.

    A negative length is not a record: :class:`ReplicaError`.  (0, 0) when not even one
    record is complete."""
    n, pos, last = len(data), 0, 0
    while pos + HEADER_SIZE <= n:
        (length,) = _LEN.unpack_from(data, pos)
        if length < 0:
            raise ReplicaError(f"a record at +{pos} has a negative length {length}")
        end = pos + HEADER_SIZE + length
        if end > n:
            break
        (last,) = _ID.unpack_from(data, pos + 8)
        pos = end
    return pos, last


@dataclass(frozen=True)
class ReplicaStatus:
    """One partition's replication as it stands (``stats replication`` on the slave)."""

    topic: str
    partition: int
    offset: int  # the slave's log end
    master_max_offset: int
    lag_bytes: int
    lag_seconds: float | None
    state: str  # following | waiting | error: <why>

    def line(self) -> str:
        lag_s = "unknown" if self.lag_seconds is None else f"{self.lag_seconds:.3f}"
        return (
            f"{self.topic} part {self.partition} offset {self.offset} master_max_offset "
            f"{self.master_max_offset} lag_bytes {self.lag_bytes} lag_seconds {lag_s} "
            f"state {self.state}"
        )


class PartitionReplica:
    """Pulls one partition (see the module doc); :meth:`run` until cancelled or failed."""

    def __init__(
        self,
        store: MessageStoreManager,
        topic: str,
        partition: int,
        group: str,
        *,
        fetch_size: int,
        max_wait_ms: int,
        master_min: int,
        master_max: int,
    ) -> None:
        self.store, self.topic, self.partition, self.group = store, topic, partition, group
        self.fetch_size = fetch_size
        self.max_wait_ms = max_wait_ms
        self.master_min = master_min
        self.master_max = master_max
        self.plog: PartitionLog | None = None
        self.error: str | None = None
        self.last_id_ms: int | None = None  # time in the newest appended record's id
        self.appended = 0  # bytes appended by this run
        #: records the master's producer entries (None: a MetaQ master, which has none)
        self.producers: ProducerSink | None = None

    # -- status ----------------------------------------------------------------------------
    def status(self, now_ms: float | None = None) -> ReplicaStatus:
        plog = self.plog
        end = plog.write_offset if plog is not None else self.master_min
        lag = max(0, self.master_max - end)
        lag_s: float | None = 0.0
        if lag:
            now = time.time() * 1000 if now_ms is None else now_ms
            lag_s = None if self.last_id_ms is None else max(0.0, (now - self.last_id_ms) / 1000)
        state = f"error: {self.error}" if self.error else "following" if plog else "waiting"
        return ReplicaStatus(self.topic, self.partition, end, self.master_max, lag, lag_s, state)

    # -- the loop --------------------------------------------------------------------------
    def open_log(self) -> PartitionLog:
        """The slave's log (created at the master's first offset on an empty disk)."""
        plog = self.store.get_log(self.topic, self.partition, start_offset=self.master_min)
        assert plog is not None
        if plog.write_offset < self.master_min:
            raise ReplicaError(
                f"the slave ends at {plog.write_offset} but the master's log starts at "
                f"{self.master_min} (its retention deleted what this slave lacks): "
                f"remove {plog.directory} to copy the partition afresh"
            )
        self.plog = plog
        return plog

    async def run(self, conn: Any) -> None:
        """Replicate over ``conn`` (a pipelined ``BrokerConnection``) until it fails."""
        plog = self.plog or self.open_log()
        pending: asyncio.Future[Any] | None = None
        while True:
            x = plog.write_offset
            reply = await (pending or self._get(conn, x))
            pending = None
            if not isinstance(reply, ValueReply):
                self._not_data(reply, x)
                continue
            n, last_id = complete_prefix(reply.data)
            if n == 0:  # one record larger than the fetch: ask for more next time
                if self.fetch_size >= MAX_FETCH:
                    raise ReplicaError(f"a record at {x} is larger than {MAX_FETCH} bytes")
                self.fetch_size = min(MAX_FETCH, self.fetch_size * 2)
                continue
            req = OffsetCommand(self.topic, self.group, self.partition, x)
            nearest = conn.send_request(req, 30.0)
            asked = self._ask_entries(conn, x, x + n) if self.producers is not None else None
            pending = self._get(conn, x + n)  # pipelined with the offset request
            answer = await nearest
            if not isinstance(answer, ResultReply) or answer.code != 200:
                raise ReplicaError(f"offset {x} on the master failed: {_describe(answer)}")
            entries = await self._entries(conn, asked, x, x + n) if asked is not None else []
            self._append(plog, x, reply.data, n, last_id, int(answer.body) == x, entries)

    def _ask_entries(self, conn: Any, after: int, upto: int) -> asyncio.Future[Any]:
        cmd = ProducersCommand(self.topic, self.group, self.partition, after, upto)
        fut: asyncio.Future[Any] = conn.send_request(cmd, 30.0)
        return fut

    async def _entries(
        self, conn: Any, asked: asyncio.Future[Any], after: int, upto: int
    ) -> list[ProducerEntry]:
        """The master's entries of the batches ending in ``(after, upto]`` (asked again past
        a full reply)."""
        out: list[ProducerEntry] = []
        while True:
            reply = await asked
            if not isinstance(reply, ResultReply) or reply.code != 200:
                raise ReplicaError(f"producers {after} on the master failed: {_describe(reply)}")
            got, good = decode_entries(reply.body)
            if good != len(reply.body) or len(got) > PRODUCERS_MAX_ENTRIES:
                raise ReplicaError(f"producers {after} on the master: a damaged reply")
            for e in got:
                end = e.offset + e.length
                if not after < end <= upto or e.count <= 0 or e.length < HEADER_SIZE * e.count:
                    raise ReplicaError(f"producers {after} on the master: {e} is out of range")
            out += got
            if len(got) < PRODUCERS_MAX_ENTRIES:
                return out
            after = got[-1].offset + got[-1].length
            asked = self._ask_entries(conn, after, upto)

    def _get(self, conn: Any, offset: int) -> asyncio.Future[Any]:
        cmd = GetCommand(
            self.topic, self.group, self.partition, offset, self.fetch_size, 0, self.max_wait_ms
        )
        fut: asyncio.Future[Any] = conn.send_request(cmd, self.max_wait_ms / 1000 + 30.0)
        return fut

    def _append(
        self,
        plog: PartitionLog,
        x: int,
        data: bytes,
        n: int,
        last_id: int,
        new_segment: bool,
        entries: list[ProducerEntry] | None = None,
    ) -> None:
        sink = self.producers
        synced: list[Callable[[], None]] = []

        def before_write(_offset: int, _first_id: int, _count: int) -> None:
            assert sink is not None and entries
            synced.append(sink.adopt(plog, entries))

        def on_durable(_result: AppendResult, exc: BaseException | None) -> None:
            if exc is None and synced:
                try:
                    synced[0]()  # the entries are durable with the records
                except OSError as e:
                    log.error("%s: syncing the producers file failed: %s", plog.name, e)

        hooks = bool(entries) and sink is not None
        try:
            plog.append(
                bytearray(memoryview(data)[:n]),
                stamp_ids=False,
                new_segment=new_segment,
                before_write=before_write if hooks else None,
                on_durable=on_durable if hooks else None,
            )
        except (StorageError, OSError) as e:
            raise ReplicaError(f"appending {n} bytes at {x} failed: {e}") from e
        self.appended += n
        self.last_id_ms = id_time_ms(last_id)
        self.master_max = max(self.master_max, x + n)
        self.error = None

    def _not_data(self, reply: Any, x: int) -> None:
        if isinstance(reply, ResultReply) and reply.code == 404:
            self.master_max = x  # the long poll ended without new data: caught up
            return
        if isinstance(reply, ResultReply) and reply.code == 301:
            moved = int(reply.body or b"-1")
            if moved > x:
                raise ReplicaError(
                    f"the master's log now starts at {moved}, past this slave's end {x} "
                    "(its retention deleted what this slave lacks)"
                )
            raise ReplicaError(
                f"the master ends at {moved}, before this slave's end {x}: the slave holds "
                "data the master does not (a different master, or the master lost data)"
            )
        raise ReplicaError(f"get at {x} failed: {_describe(reply)}")


def _describe(reply: Any) -> str:
    if isinstance(reply, ResultReply):
        return f"{reply.code} {reply.body.decode('utf-8', 'replace')}"
    return type(reply).__name__
