"""A small HTTP/1.1 server on the broker's event loop (stdlib ``asyncio`` streams).

It serves one application callable (``Request -> Response``, :mod:`pymetaq.server.http.app`)
and nothing else: GET, HEAD and POST; persistent connections (HTTP/1.1, or 1.0 with
``keep-alive``); no chunked request bodies, no pipelining beyond reading requests in order.
Handlers run on the loop thread and must not block (they read in-memory state).

Bounds (every peer is untrusted, whatever address the port listens on):

| bound              | value   | past it                                   |
|--------------------|---------|-------------------------------------------|
| connections        | 64      | ``503`` and close                         |
| request head       | 16 KiB, 100 fields | ``431`` and close              |
| request body       | 64 KiB  | ``413`` and close                         |
| head arrival       | 10 s    | the connection is closed                  |
| idle keep-alive    | 30 s    | the connection is closed                  |
| requests/connection| 1000    | the last reply carries ``Connection: close`` |

Thread-safety: loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

from pymetaq.server.security.tls import certificate_name

log = logging.getLogger("pymetaq.server.http")

MAX_CONNECTIONS = 64
MAX_HEAD = 16 * 1024
MAX_HEADERS = 100
MAX_BODY = 64 * 1024
HEAD_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 30.0
MAX_REQUESTS = 1000
LINGER_S = 2.0
LINGER_BYTES = 256 * 1024
SERVER = "pymetaq"


@dataclass
class Request:
    method: str
    path: str  # percent-decoded
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes
    peer: str
    #: the subject CN of a verified client certificate (HTTPS with client certificates)
    cert_name: str | None = None

    def arg(self, name: str, default: str = "") -> str:
        values = self.query.get(name)
        return values[0] if values else default

    def form(self) -> dict[str, str]:
        """An ``application/x-www-form-urlencoded`` body (first value of each field)."""
        parsed = urllib.parse.parse_qs(self.body.decode("utf-8", "replace"), max_num_fields=32)
        return {k: v[0] for k, v in parsed.items()}


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


App = Callable[[Request], Response]
#: the security gate (:mod:`pymetaq.server.security.http`): a refusal, or None to answer
Gate = Callable[[Request], Awaitable[Response | None]]


def _plain(status: int, text: str = "") -> Response:
    return Response(status, (text or HTTPStatus(status).phrase).encode() + b"\n")


class _Bad(Exception):
    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(reason)
        self.response = _plain(status, reason)


def parse_head(head: bytes, peer: str) -> tuple[Request, int, bool]:
    """(request without body, content length, keep-alive asked) from the bytes before the
    blank line; raises :class:`_Bad` (400/501/505)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes anything
        raise _Bad(400) from None
    lines = text.split("\r\n")
    if len(lines) > MAX_HEADERS + 1:
        raise _Bad(431, "too many header fields")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise _Bad(400, "bad request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _Bad(505)
    if not target.startswith("/"):
        raise _Bad(400, "bad request target")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _Bad(400, "bad header")
        headers[name.lower()] = value.strip()
    if "transfer-encoding" in headers:
        raise _Bad(501, "chunked request bodies are not supported")
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit() or len(length_text) > 12:
        raise _Bad(400, "bad Content-Length")
    raw_path, _, raw_query = target.partition("?")
    request = Request(
        method,
        urllib.parse.unquote(raw_path),
        urllib.parse.parse_qs(raw_query, max_num_fields=32),
        headers,
        b"",
        peer,
    )
    connection = headers.get("connection", "").lower()
    keep = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return request, int(length_text), keep


def render(resp: Response, *, keep: bool, head_only: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {resp.status} {HTTPStatus(resp.status).phrase}",
        f"Server: {SERVER}",
        f"Content-Type: {resp.content_type}",
        f"Content-Length: {len(resp.body)}",
        "Connection: keep-alive" if keep else "Connection: close",
        "X-Content-Type-Options: nosniff",
        *(f"{k}: {v}" for k, v in resp.headers),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + resp.body


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Finish an error reply so the peer reads it: send it, end our side, then drop what the
    peer still sends (bounded: ``LINGER_BYTES`` or ``LINGER_S``) - closing with unread input
    would reset the connection before the reply is read."""
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
    dropped = 0
    try:
        while dropped < LINGER_BYTES:
            chunk = await asyncio.wait_for(reader.read(65536), LINGER_S)
            if not chunk:
                break
            dropped += len(chunk)
    except (TimeoutError, ConnectionError, asyncio.LimitOverrunError):
        pass


class HttpServer:
    """Listens on (host, port) and answers with ``app``."""

    def __init__(
        self,
        app: App,
        host: str,
        port: int,
        *,
        ssl: ssl_module.SSLContext | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.ssl = ssl
        self.gate = gate
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            self.host,
            self.port,
            limit=MAX_HEAD,
            reuse_address=True,
            ssl=self.ssl,
            ssl_handshake_timeout=HEAD_TIMEOUT_S if self.ssl is not None else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_info = writer.get_extra_info("peername")
        peer = str(peer_info[0]) if isinstance(peer_info, tuple) else "?"
        self._writers.add(writer)
        try:
            if len(self._writers) > MAX_CONNECTIONS:
                writer.write(
                    render(_plain(503, "too many connections"), keep=False, head_only=False)
                )
                await _linger(reader, writer)
                return
            for n in range(MAX_REQUESTS):
                if not await self._one(reader, writer, peer, last=n == MAX_REQUESTS - 1):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str, *, last: bool
    ) -> bool:
        """Read and answer one request; whether the connection stays open."""
        try:
            first = await asyncio.wait_for(reader.read(1), IDLE_TIMEOUT_S)
            if not first:
                return False
            rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            writer.write(render(_plain(431), keep=False, head_only=False))
            await _linger(reader, writer)
            return False
        head = first + rest[:-4]
        try:
            request, length, keep = parse_head(head, peer)
            if length > MAX_BODY:
                raise _Bad(413)
        except _Bad as exc:
            writer.write(render(exc.response, keep=False, head_only=False))
            await _linger(reader, writer)
            return False
        if length:
            request.body = await asyncio.wait_for(reader.readexactly(length), HEAD_TIMEOUT_S)
        keep = keep and not last
        response = None
        if self.gate is not None:
            request.cert_name = certificate_name(writer.get_extra_info("peercert"))
            response = await self.gate(request)
        if response is None:
            response = self._answer(request)
        writer.write(render(response, keep=keep, head_only=request.method == "HEAD"))
        await writer.drain()
        return keep

    def _answer(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD", "POST"):
            return Response(405, b"method not allowed\n", headers=[("Allow", "GET, HEAD, POST")])
        try:
            return self.app(request)
        except Exception:
            log.exception("HTTP %s %s failed", request.method, request.path[:200])
            return _plain(500)
