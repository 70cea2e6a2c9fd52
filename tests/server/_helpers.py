"""Raw-socket helpers for the broker tests: send exact bytes, read exact reply frames
(``wait_for`` is the shared one from :mod:`tests._helpers`)."""

from __future__ import annotations

import socket
import time

from pymetaq.client.protocol import NEED_DATA, Limits, Parser, ResultReply, Role, ValueReply
from pymetaq.storage.record import encode_record
from tests._helpers import wait_for

Reply = ResultReply | ValueReply


class Wire:
    """One blocking connection that reads replies through the codec's client parser."""

    def __init__(
        self, address: tuple[str, int], timeout: float = 20.0, source: str | None = None
    ) -> None:
        src = None if source is None else (source, 0)
        self.sock = socket.create_connection(address, timeout=timeout, source_address=src)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = Parser(Role.CLIENT, Limits(max_body=64 << 20))
        self.raw = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> Reply:
        """The next reply frame (blocks up to the socket timeout)."""
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, ResultReply | ValueReply)
                return event
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.raw += chunk
            self.parser.feed(chunk)

    def call(self, data: bytes) -> Reply:
        self.send(data)
        return self.reply()

    def read_exact(self, n: int) -> bytes:
        """Exactly ``n`` raw bytes (for exact-bytes assertions; bypasses the parser)."""
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes: {bytes(out)!r}")
            out += chunk
        return bytes(out)

    def read_until_closed(self, timeout: float = 20.0) -> bytes:
        """Everything until the broker closes the connection."""
        out = bytearray()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = self.sock.recv(65536)
            if not chunk:
                return bytes(out)
            out += chunk
        raise TimeoutError(f"connection still open after {timeout} s; got {bytes(out)!r}")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def put_line(
    topic: str, partition: int, data: bytes, opaque: int, checksum: int = -1, flag: int = 0
) -> bytes:
    return (
        b"put %s %d %d %d %d %d\r\n"
        % (topic.encode(), partition, len(data), flag, checksum, opaque)
        + data
    )


def bput_frame(
    topic: str, partition: int, payloads: list[bytes], opaque: int, checksum: bool = True
) -> bytes:
    from pymetaq.storage.checksum import checksum as crc

    body = b"".join(encode_record(p) for p in payloads)
    ck = crc(body) if checksum else -1
    return (
        b"bput %s %d %d %d %d %d\r\n"
        % (topic.encode(), partition, len(body), len(payloads), ck, opaque)
        + body
    )


def result(code: int, body: bytes, opaque: int) -> bytes:
    return b"result %d %d %d\r\n" % (code, len(body), opaque) + body


__all__ = ["Reply", "Wire", "bput_frame", "put_line", "result", "wait_for"]
