"""Helpers shared by the producer tests (no tests here): raw fetches and free ports.

``fetch_all`` reads a partition with plain ``get`` requests over a blocking socket (no client
code but the codec and ``decode_messages``), so the producer is checked against what the broker
actually stored.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from pymetaq.client.protocol import (
    NEED_DATA,
    GetCommand,
    Parser,
    ResultReply,
    Role,
    ValueReply,
    encode,
)
from pymetaq.client.transport.records import decode_messages
from pymetaq.client.types import Message


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


def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``cond`` until true or fail after ``timeout`` seconds (no bare sleeps in tests)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


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
                    conn.sendall(encode(ResultReply(200, body.encode(), event.opaque)))
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
