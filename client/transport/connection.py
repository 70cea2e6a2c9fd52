"""One asyncio TCP connection to one broker.

``BrokerConnection`` wraps the sans-I/O codec (``Parser(Role.CLIENT)`` + ``encode_parts``) in an
``asyncio.Protocol``. Requests are pipelined: each gets the next opaque (a signed 32-bit
counter, 1 .. 2**31 - 2, wrapping; ``2**31 - 1`` is what MetaQ uses for an opaque-less
``stats``) and the reply is matched by its opaque, so replies may arrive in any order.

* ``send_request(cmd, timeout_s, on_done=None)`` writes at once and returns an
  ``asyncio.Future`` (no coroutine per request: the producer's sender uses it to keep many
  batches in flight). ``on_done(fut)``, if given, is called with the future as soon as it is
  settled (reply, timeout or failure), directly from the reply handler, one loop iteration
  earlier than a done-callback (which asyncio schedules with ``call_soon``).
* ``await request(cmd, timeout_s)`` is the same, awaited. Both return the raw
  ``ResultReply``/``ValueReply``; :func:`raise_for_reply` turns a non-200 into an exception.
* A timeout fails that request with :class:`RequestTimeout` (a late reply is dropped).
* A lost connection, a fatal protocol error or ``close()`` fails every pending request with
  :class:`ConnectionLost` (retriable); the connection is then unusable (``closed`` is True).
* ``await drain()`` waits while the transport's write buffer is above its high-water mark.
* Reading is an ``asyncio.BufferedProtocol``: a long reply body (a ``get`` of up to 1 MiB) is
  received in place, into the bytes it becomes (``Parser(body_into=...)``, the C
  ``BodyBuffer``), so a reply already queued in the socket is one ``recv_into`` and no join;
  anything else is read into one scratch buffer per thread and copied by the parser.

Thread-safety: ``BrokerConnection`` belongs to the loop it was opened on (call it only from that
loop).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

from pymetaq.client.errors import (
    ClientClosed,
    ConnectionLost,
    MetaClientError,
    NoBrokerAvailable,
    RequestTimeout,
    error_for_reply,
)
from pymetaq.client.protocol import (
    NEED_DATA,
    AuthCommand,
    Limits,
    Parser,
    ProtocolError,
    ResultReply,
    Role,
    ValueReply,
    encode_parts,
)
from pymetaq.client.speedups import speedups
from pymetaq.client.transport.security import NO_SECURITY, ClientSecurity

T = TypeVar("T")
Reply: TypeAlias = ResultReply | ValueReply

OPAQUE_MAX = (1 << 31) - 2
DEFAULT_CONNECT_TIMEOUT_S = 3.0
DEFAULT_REQUEST_TIMEOUT_S = 3.0
WRITE_HIGH_WATER = 4 << 20
_JOIN_BELOW = 16 << 10
#: what one receive reads when no long body is being received in place (asyncio's own size)
_READ_SIZE = 256 << 10
_BodyBuffer = getattr(speedups, "BodyBuffer", None)

log = logging.getLogger(__name__)


def raise_for_reply(reply: Reply) -> Reply:
    """Return ``reply`` if it is a ``value`` or a ``result 200``, else raise the mapped error."""
    if isinstance(reply, ResultReply) and reply.code != 200:
        raise error_for_reply(reply.code, reply.body)
    return reply


def _body_into_c(n: int) -> tuple[memoryview, Callable[[], bytes]]:
    """Where a long reply body is received in place (the parser's ``body_into``): the C
    ``BodyBuffer``, whose filled ``bytes`` are handed out without a copy."""
    assert _BodyBuffer is not None
    buf = _BodyBuffer(n)
    return memoryview(buf), buf.take


def _body_into_python(n: int) -> tuple[memoryview, Callable[[], bytes]]:
    """The same in pure Python: a ``bytearray``, copied into ``bytes`` once it is filled (the
    one copy that joining the received chunks would make)."""
    raw = bytearray(n)
    return memoryview(raw), lambda: bytes(raw)


_body_into = _body_into_c if _BodyBuffer is not None else _body_into_python


class _Scratch(threading.local):
    """The read buffer of the connections whose loop runs in this thread (one per thread, not
    per connection: a read is parsed, and its bytes copied out, before the next one starts)."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(_READ_SIZE))


_scratch = _Scratch()


class _Protocol(asyncio.BufferedProtocol):
    """Reads into the parser's body window while a long body is arriving (a ``get`` reply of
    1 MiB queued in the socket is one ``recv_into``, no chunks to join), else into the
    thread's scratch buffer, whose bytes the parser copies."""

    def __init__(self, conn: BrokerConnection) -> None:
        self._conn = conn
        self._direct = False  # the last get_buffer() was the parser's body window

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_buffer(self, sizehint: int) -> memoryview:
        window = self._conn._parser.body_window()  # the parser releases it when counted
        self._direct = window is not None
        return window if window is not None else _scratch.view

    def buffer_updated(self, nbytes: int) -> None:
        if self._direct:
            self._conn._on_body(nbytes)
        else:
            with _scratch.view[:nbytes] as data:
                self._conn._on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn._on_lost(exc)

    def pause_writing(self) -> None:
        self._conn._paused = True

    def resume_writing(self) -> None:
        self._conn._paused = False
        waiter = self._conn._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class BrokerConnection:
    """A pipelined connection to one broker. Open it with :meth:`open`."""

    def __init__(
        self, host: str, port: int, loop: asyncio.AbstractEventLoop, limits: Limits | None = None
    ) -> None:
        self.host = host
        self.port = port
        self._loop = loop
        self._parser = Parser(Role.CLIENT, limits, body_into=_body_into)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        #: pending requests' deadlines (``loop.time()``); one timer for all (:meth:`_sweep`)
        self._deadlines: dict[int, float] = {}
        #: per timeout, its requests' (deadline, opaque) in the order they were sent
        self._by_timeout: dict[float, collections.deque[tuple[float, int]]] = {}
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        #: ``on_done`` hooks of pending requests (called when their future is settled)
        self._on_done: dict[int, Callable[[asyncio.Future[Reply]], object]] = {}
        self._opaque = 0
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._error: MetaClientError | None = None
        self.scheme = "meta"

    def __repr__(self) -> str:
        return f"BrokerConnection({self.host}:{self.port}, pending={len(self._pending)})"

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        limits: Limits | None = None,
        security: ClientSecurity | None = None,
    ) -> BrokerConnection:
        """Connect (raises :class:`NoBrokerAvailable` on refusal or after ``connect_timeout_s``).

        ``limits`` bounds reply sizes (default: a 1 MiB ``maxTransferSize``); a consumer that
        fetches more per ``get`` passes ``Limits.for_transfer_size(n)``.  ``security``
        (:mod:`.security`): TLS (the handshake is part of the connect), then ``auth PLAIN`` when
        it names a user (:class:`AuthenticationFailed` if refused).
        """
        loop = asyncio.get_running_loop()
        conn = cls(host, port, loop, limits)
        sec = security or NO_SECURITY
        try:
            ctx = sec.context()
        except (OSError, ssl.SSLError) as e:
            raise NoBrokerAvailable(f"cannot load the TLS files: {e}") from None
        if ctx is not None:
            conn.scheme = "meta+tls"
        try:
            async with asyncio.timeout(connect_timeout_s):
                transport, proto = await loop.create_connection(lambda: _Protocol(conn), host, port)
                if ctx is not None:  # start_tls closes the socket if the handshake fails
                    tls = await loop.start_tls(transport, proto, ctx, server_hostname=host)
                    assert tls is not None
                    transport = tls
        except TimeoutError:
            raise NoBrokerAvailable(f"connect to {host}:{port} timed out") from None
        except ssl.SSLCertVerificationError as e:
            raise NoBrokerAvailable(
                f"TLS handshake with {host}:{port} failed: certificate verify failed: "
                f"{e.verify_message or e.reason}"
            ) from None
        except (OSError, ssl.SSLError) as e:
            raise NoBrokerAvailable(f"cannot connect to {host}:{port}: {e}") from None
        assert isinstance(transport, asyncio.Transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        conn._transport = transport
        if sec.user:
            await conn._authenticate(sec, connect_timeout_s)
        return conn

    async def _authenticate(self, sec: ClientSecurity, timeout_s: float) -> None:
        try:
            reply = await self.request(AuthCommand("PLAIN", sec.auth_body()), timeout_s)
            raise_for_reply(reply)
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return self._error is not None or self._transport is None

    @property
    def address(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _next_opaque(self) -> int:
        op = self._opaque + 1
        if op > OPAQUE_MAX:
            op = 1
        self._opaque = op
        return op

    def send_request(
        self,
        cmd: Any,
        timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
        on_done: Callable[[asyncio.Future[Reply]], object] | None = None,
    ) -> asyncio.Future[Reply]:
        """Write ``cmd`` (its ``opaque`` is replaced) and return the future of its reply;
        ``on_done(fut)`` runs as soon as the future is settled (see the module doc)."""
        fut: asyncio.Future[Reply] = self._loop.create_future()
        if self._error is not None or self._transport is None:
            fut.set_exception(self._error or ConnectionLost(f"{self.address} is not connected"))
            if on_done is not None:
                self._loop.call_soon(on_done, fut)  # never re-enter the caller
            return fut
        op = self._next_opaque()
        line, body = encode_parts(cmd, op)
        self._pending[op] = fut
        if on_done is not None:
            self._on_done[op] = on_done
        if timeout_s is not None:
            self._track(op, timeout_s)
        if len(body) < _JOIN_BELOW:
            self._transport.write(line + body if body else line)
        else:  # a big body is written as is (no copy) after its line
            self._transport.write(line)
            self._transport.write(body)
        return fut

    async def request(self, cmd: Any, timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S) -> Reply:
        """Send ``cmd`` and wait for its reply (raises RequestTimeout / ConnectionLost)."""
        return await self.send_request(cmd, timeout_s)

    def send_oneway(self, cmd: Any) -> None:
        """Write a command that has no reply (``quit``, transaction END)."""
        if self._error is not None or self._transport is None:
            raise self._error or ConnectionLost(f"{self.address} is not connected")
        line, body = encode_parts(cmd, self._next_opaque())
        self._transport.write(line + body if body else line)

    async def drain(self) -> None:
        """Wait until the write buffer is below its high-water mark."""
        while self._paused and self._error is None:
            if self._drain_waiter is None or self._drain_waiter.done():
                self._drain_waiter = self._loop.create_future()
            await self._drain_waiter

    def close(self) -> None:
        """Close the transport and fail every pending request with ConnectionLost."""
        self._fail(ClientClosed(f"connection to {self.address} closed"))
        if self._transport is not None:
            if self.scheme == "meta":
                self._transport.close()
            else:  # TLS: no close_notify exchange (it can outlive the client's loop)
                self._transport.abort()

    # --- internals (loop thread) ---

    def _track(self, op: int, timeout_s: float) -> None:
        """Time request ``op`` out after ``timeout_s``: no timer per request (``call_later``
        and ``cancel`` are 2.3 us, and the loop sweeps the cancelled handle from its heap
        later), one for the earliest deadline."""
        deadline = self._loop.time() + timeout_s
        self._deadlines[op] = deadline
        queue = self._by_timeout.get(timeout_s)
        if queue is None:
            queue = self._by_timeout[timeout_s] = collections.deque()
        deadlines = self._deadlines
        while queue and deadlines.get(queue[0][1]) != queue[0][0]:
            queue.popleft()  # answered (replies mostly come in order: this keeps it short)
        queue.append((deadline, op))
        if deadline < self._sweep_at:
            self._arm_sweep(deadline)

    def _arm_sweep(self, when: float) -> None:
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
        self._sweep_at = when
        self._sweep_timer = self._loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Fail every request whose deadline passed; arm the timer for the next deadline.
        Each timeout's queue is in deadline order (one clock, one timeout)."""
        self._sweep_timer = None
        self._sweep_at = math.inf
        now = self._loop.time()
        deadlines = self._deadlines
        following = math.inf
        for timeout_s, queue in list(self._by_timeout.items()):
            while queue:
                deadline, op = queue[0]
                if deadlines.get(op) != deadline:  # answered (or the opaque was reused)
                    queue.popleft()
                elif deadline <= now:
                    queue.popleft()
                    self._expire(op, timeout_s)
                else:
                    following = min(following, deadline)
                    break
            if not queue and self._by_timeout.get(timeout_s) is queue:
                del self._by_timeout[timeout_s]
        # a hook run by _expire may have sent a request (and armed the timer) meanwhile
        if following < self._sweep_at and self._error is None:
            self._arm_sweep(following)

    def _expire(self, op: int, timeout_s: float) -> None:
        self._deadlines.pop(op, None)
        fut = self._pending.pop(op, None)
        if fut is not None and not fut.done():
            fut.set_exception(RequestTimeout(f"no reply from {self.address} within {timeout_s:g}s"))
        self._settled(op, fut)

    def _settled(self, op: int, fut: asyncio.Future[Reply] | None) -> None:
        """Run request ``op``'s ``on_done`` hook, if any (once: it is popped)."""
        hook = self._on_done.pop(op, None) if self._on_done else None
        if hook is not None and fut is not None:
            try:
                hook(fut)
            except Exception:  # a hook must not break the reply loop
                log.exception("reply hook %r raised", hook)

    def _on_body(self, nbytes: int) -> None:
        """``nbytes`` of a long body were received in place (:meth:`Parser.body_window`)."""
        self._parser.body_received(nbytes)
        self._on_events()

    def _on_data(self, data: bytes | memoryview) -> None:
        self._parser.feed(data)
        self._on_events()

    def _on_events(self) -> None:
        parser = self._parser
        pending = self._pending
        while True:
            try:
                event = parser.next_event()
            except ProtocolError as e:
                if e.fatal or e.opaque is None:
                    self._fail(ConnectionLost(f"protocol error from {self.address}: {e.reason}"))
                    if self._transport is not None:
                        self._transport.close()
                    return
                self._complete_error(e.opaque, ConnectionLost(f"bad reply: {e.reason}"))
                continue
            if event is NEED_DATA:
                return
            if not isinstance(event, ResultReply | ValueReply):
                self._fail(ConnectionLost(f"unexpected request from broker {self.address}"))
                if self._transport is not None:
                    self._transport.close()
                return
            op = event.opaque
            fut = pending.pop(op, None)
            if fut is None:
                continue  # late reply to a timed-out request
            self._deadlines.pop(op, None)
            if not fut.done():
                fut.set_result(event)
            self._settled(op, fut)

    def _complete_error(self, op: int, exc: MetaClientError) -> None:
        fut = self._pending.pop(op, None)
        self._deadlines.pop(op, None)
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        self._settled(op, fut)

    def _on_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        self._fail(ConnectionLost(f"connection to {self.address} lost{reason}"))
        self._parser.release()  # a half-received body is freed now, not with this object

    def _fail(self, error: MetaClientError) -> None:
        if self._error is None:
            self._error = error if isinstance(error, ConnectionLost) else ConnectionLost(str(error))
        pending, self._pending = self._pending, {}
        self._deadlines.clear()
        self._by_timeout.clear()
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        self._sweep_at = math.inf
        hooks, self._on_done = self._on_done, {}
        for op, fut in pending.items():
            if not fut.done():
                fut.set_exception(ConnectionLost(str(error)))
                fut.exception()  # mark retrieved: nobody may be awaiting a pipelined request
            hook = hooks.get(op)
            if hook is not None:
                self._loop.call_soon(hook, fut)  # _fail may run inside a caller: no re-entry
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
