"""One request/reply round trip over a plain socket, for the command-line tools (``stats``,
``admin``, ``top``): encode a command, read until one complete reply has been parsed.

``Session`` keeps one connection for repeated round trips (``top``); ``round_trip`` opens one
per call.  Errors are ``OSError`` (connect, timeout, the broker closing) or ``ConnectionError``
(an unexpected reply).

Thread-safety: a Session belongs to one thread.
"""

from __future__ import annotations

import socket

from pymetaq.client.protocol import NEED_DATA, Command, Parser, ResultReply, Role, encode


class Session:
    """A connection to one broker for sequential round trips."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.parser = Parser(Role.CLIENT)
        self._opaque = 0

    def request(self, command: Command) -> ResultReply:
        self.sock.sendall(encode(command))
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                break
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the broker closed the connection before replying")
            self.parser.feed(chunk)
        if not isinstance(event, ResultReply):
            raise ConnectionError(f"unexpected reply {event!r}")
        return event

    def close(self) -> None:
        self.sock.close()


def round_trip(host: str, port: int, command: Command, timeout: float = 10.0) -> ResultReply:
    """Connect, send ``command``, return its reply, close."""
    session = Session(host, port, timeout)
    try:
        return session.request(command)
    finally:
        session.close()
