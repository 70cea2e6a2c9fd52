"""Helpers shared by the client tests (no tests here).

Producer side: raw fetches (``fetch_all``, ``fetch_raw``), free ports, a ``SilentBroker`` fake.
Consumer side: ``produce`` (raw ``bput`` to a real broker), an in-memory ``FakeTransport`` over
``FakeLog`` partitions, a ``Recording`` reject policy, ``cfg(**overrides)``, ``run(coro)``.

``fetch_all`` reads a partition with plain ``get`` requests over a blocking socket (no client
code but the codec and ``decode_messages``), so the producer is checked against what the broker
actually stored.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Coroutine
from typing import Any, TypeVar

from pymetaq.client.consumer.config import ConsumerConfig
from pymetaq.client.consumer.transport import FetchReply, FetchStatus
from pymetaq.client.protocol import (
    NEED_DATA,
    BatchPutCommand,
    GetCommand,
    Parser,
    ResultReply,
    Role,
    ValueReply,
    encode,
)
from pymetaq.client.transport.brokers import BrokerSet
from pymetaq.client.transport.records import build_record, build_records, decode_messages
from pymetaq.client.types import Message, TopicPartition
from tests._broker import BrokerProcess

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _roundtrip(sock: socket.socket, parser: Parser, cmd: GetCommand) -> ResultReply | ValueReply:
    sock.sendall(encode(cmd))
    while True:
        event = parser.next_event()
        if event is not NEED_DATA:
            assert isinstance(event, (ResultReply, ValueReply))
            return event
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("broker closed the connection")
        parser.feed(chunk)


def fetch_raw(
    address: tuple[str, int], topic: str, partition: int, offset: int = 0, max_size: int = 1 << 20
) -> bytes:
    """The bytes of one ``get`` (b"" on 404)."""
    with socket.create_connection(address, timeout=10) as sock:
        reply = _roundtrip(
            sock, Parser(Role.CLIENT), GetCommand(topic, "g", partition, offset, max_size, 1)
        )
    if isinstance(reply, ValueReply):
        return reply.data
    assert reply.code == 404, reply
    return b""


def fetch_all(
    address: tuple[str, int], topic: str, partition: int, *, broker_id: int = 0
) -> list[Message]:
    """Every message stored in a partition, in log order."""
    out: list[Message] = []
    offset = 0
    with socket.create_connection(address, timeout=10) as sock:
        parser = Parser(Role.CLIENT)
        opaque = 1
        while True:
            opaque += 1
            reply = _roundtrip(
                sock, parser, GetCommand(topic, "g", partition, offset, 1 << 20, opaque)
            )
            if isinstance(reply, ResultReply):
                assert reply.code == 404, reply
                return out
            msgs, nxt = decode_messages(reply.data, topic, partition, offset, broker_id=broker_id)
            assert nxt > offset, "no complete record in a 1 MiB fetch"
            out.extend(msgs)
            offset = nxt


class SilentBroker:
    """A fake broker on a thread: answers ``stats`` (broker id, N partitions), never answers
    ``bput``/``put`` (so a producer's request times out). ``requests`` counts the puts seen."""

    def __init__(self, partitions: int = 2, broker_id: int = 0) -> None:
        import threading

        self.partitions = partitions
        self.broker_id = broker_id
        self.requests = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        self.port: int = self._sock.getsockname()[1]
        self._stop = False
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"meta://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        import threading

        self._sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        from pymetaq.client.protocol import BatchPutCommand, PutCommand, StatsCommand

        parser = Parser(Role.SERVER)
        while not self._stop:
            try:
                chunk = conn.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            parser.feed(chunk)
            while (event := parser.next_event()) is not NEED_DATA:
                if isinstance(event, StatsCommand):
                    body = f"STATS\r\nbroker_id {self.broker_id}\r\npartitions {self.partitions}\r\nEND\r\n"
                    try:
                        conn.sendall(encode(ResultReply(200, body.encode(), event.opaque)))
                    except OSError:  # close() closed the connection meanwhile
                        return
                elif isinstance(event, (BatchPutCommand, PutCommand)):
                    self.requests += 1

    def close(self) -> None:
        self._stop = True
        self._sock.close()
        for c in self._conns:
            c.close()
        self._thread.join(5)

    def __enter__(self) -> SilentBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- consumer side


def server(b: BrokerProcess) -> str:
    return f"meta://{b.host}:{b.port}"


def produce(b: BrokerProcess, topic: str, partition: int, values: list[bytes]) -> list[int]:
    """bput ``values`` in batches of 500; returns the offset of each batch's first record."""

    async def go() -> list[int]:
        bs = BrokerSet(server(b))
        await bs.start()
        try:
            conn = await bs.connection(0)
            firsts = []
            for i in range(0, len(values), 500):
                chunk = values[i : i + 500]
                cmd = BatchPutCommand(topic, partition, build_records(chunk), len(chunk))
                reply = await conn.request(cmd, 30)
                assert reply.code == 200, reply  # type: ignore[union-attr]
                firsts.append(int(reply.body.split()[2]))  # type: ignore[union-attr]
            return firsts
        finally:
            bs.close()

    return asyncio.run(go())


def stamped(value: bytes, msg_id: int, attribute: str | None = None) -> bytes:
    rec = bytearray(build_record(value, attribute))
    struct.pack_into(">q", rec, 8, msg_id)
    return bytes(rec)


class FakeLog:
    def __init__(self) -> None:
        self.data = bytearray()
        self.min_offset = 0
        self.next_id = 1
        self.offsets: list[int] = []

    def append(self, value: bytes, attribute: str | None = None) -> int:
        off = self.min_offset + len(self.data)
        self.data += stamped(value, self.next_id, attribute)
        self.next_id += 1
        self.offsets.append(off)
        return off

    @property
    def max_offset(self) -> int:
        return self.min_offset + len(self.data)


class FakeTransport:
    """In-memory ConsumerTransport: one log per partition, MetaQ's get/offset rules."""

    def __init__(self, partitions: dict[TopicPartition, FakeLog]) -> None:
        self.logs = partitions
        self.fetches: list[tuple[TopicPartition, int, int]] = []
        self.corrupt_once: dict[tuple[TopicPartition, int], int] = {}  # (tp, fetch off) -> byte
        self.closed = False

    async def start(self) -> None:
        pass

    async def partitions(self, topic: str) -> list[TopicPartition]:
        return sorted(tp for tp in self.logs if tp.topic == topic)

    async def fetch(
        self, tp: TopicPartition, group: str, offset: int, max_size: int, max_wait_ms: int
    ) -> FetchReply:
        self.fetches.append((tp, offset, max_size))
        log = self.logs[tp]
        await asyncio.sleep(0)
        if offset < log.min_offset or offset > log.max_offset:
            return FetchReply(
                FetchStatus.MOVED, new_offset=await self.nearest_offset(tp, group, offset)
            )
        if offset == log.max_offset:
            return FetchReply(FetchStatus.NO_DATA)
        start = offset - log.min_offset
        data = bytearray(log.data[start : start + max_size])
        flip = self.corrupt_once.pop((tp, offset), None)
        if flip is not None:
            data[flip] ^= 0xFF
        return FetchReply(FetchStatus.DATA, bytes(data))

    async def nearest_offset(self, tp: TopicPartition, group: str, offset: int) -> int:
        log = self.logs[tp]  # one segment: its start, or the end when beyond it
        return log.max_offset if offset > log.max_offset else log.min_offset

    def close(self) -> None:
        self.closed = True


def cfg(**kw: object) -> ConsumerConfig:
    base: dict[str, object] = dict(long_poll_ms=0, max_delay_fetch_ms=50, commit_interval_s=3600.0)
    base.update(kw)
    return ConsumerConfig(**base)  # type: ignore[arg-type]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Recording:
    def __init__(self) -> None:
        self.rejected: list[tuple[Message, BaseException]] = []

    def bind(self, group: str, listeners: dict[str, Any]) -> None:
        pass

    def reject(self, message: Message, error: BaseException) -> None:
        self.rejected.append((message, error))

    def close(self) -> None:
        pass
