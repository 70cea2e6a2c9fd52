"""One client connection: bytes in through the codec, replies out in order of completion.

The hot path is an :class:`asyncio.Protocol`: ``data_received`` feeds the sans-I/O parser and
hands every complete command to the dispatcher; replies are collected and written with one
``transport.write`` per loop iteration (a pipelined batch of 100 puts is one write).  A ``get``
reply is the ``value <len> <opaque>`` header followed by a slice of a segment file sent with
``loop.sendfile`` (``os.sendfile``, zero-copy); while a slice is being sent, later replies
queue behind it so bytes never interleave.

Replies may complete out of order (a put waits for its fsync, a long-poll get for data); the
client matches them by opaque, as MetaQ's do.

Back-pressure: reading pauses while more than ``MAX_INFLIGHT`` requests await completion, more
than ``MAX_BUFFERED`` reply bytes wait for the client to read them, or more than ``MAX_QUEUED``
get replies wait behind a sendfile (each holds a descriptor).

Thread-safety: every method runs on the broker's event-loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any

from pymetaq.client.protocol import NEED_DATA, Parser, ProtocolError, QuitCommand, Role

if TYPE_CHECKING:
    from pymetaq.server.dispatch import Dispatcher

log = logging.getLogger("pymetaq.server")

MAX_INFLIGHT = 512
MAX_BUFFERED = 4 << 20
#: get replies (each holding a dup'd segment descriptor) queued behind a running sendfile
MAX_QUEUED = 64


def result_frame(code: int, body: bytes, opaque: int) -> bytes:
    """``result <code> <len> <opaque>\\r\\n<body>``."""
    return b"result %d %d %d\r\n%b" % (code, len(body), opaque, body)


class Connection(asyncio.Protocol):
    """The protocol object of one TCP connection."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.loop = dispatcher.loop
        self.parser = Parser(Role.SERVER, dispatcher.limits)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.inflight = 0
        self.active = True  # bytes arrived since the last idle sweep
        self.closed = False
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._queue: collections.deque[Any] = collections.deque()
        self._sender: asyncio.Task[None] | None = None
        self._reading_paused = False
        self._close_after_flush = False
        self._eof = False

    # -- asyncio callbacks ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if not self.dispatcher.connection_opened(self):
            log.warning("closing connection from %s: maxConnections reached", self.peer)
            self.closed = True
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
        self._out.clear()
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, tuple):
                item[1].close()
        self.dispatcher.connection_closed(self)

    def data_received(self, data: bytes) -> None:
        self.active = True
        parser = self.parser
        parser.feed(data)
        handle = self.dispatcher.handle
        while not self.closed and not self._close_after_flush:
            try:
                event = parser.next_event()
            except ProtocolError as exc:
                self._protocol_error(exc)
                if exc.fatal:
                    return
                continue
            if event is NEED_DATA:
                if self._bare_lf_line():
                    parser = self.parser
                    continue
                break
            if type(event) is QuitCommand:
                self.close_after_flush()
                return
            handle(self, event)

    def _bare_lf_line(self) -> bool:
        """A human client (``echo stats | nc host 8123``) ends lines with a bare LF.

        At NEED_DATA, if the buffered bytes start with a line ended by ``\n`` without ``\r``
        (the parser has then consumed nothing of it: no CRLF line is pending), restart the
        parser on the same bytes with that terminator made CRLF.  Binary clients always send
        CRLF, so their bytes never take this path.
        """
        data = self.parser.trailing_data
        lf = data.find(b"\n", 0, self.dispatcher.limits.max_line + 1)
        if lf < 0 or (lf > 0 and data[lf - 1] == 0x0D):
            return False
        self.parser = Parser(Role.SERVER, self.dispatcher.limits)
        self.parser.feed(data[:lf] + b"\r\n" + data[lf + 1 :])
        return True

    def eof_received(self) -> bool:
        """The client half-closed: answer what is in flight, then close."""
        self._eof = True
        if self.inflight == 0:
            self.close_after_flush()
        return True  # keep the transport open until the replies are written

    def pause_writing(self) -> None:  # pragma: no cover - only with huge replies
        self._maybe_pause()

    def resume_writing(self) -> None:  # pragma: no cover
        self._maybe_resume()

    # -- replies ----------------------------------------------------------------------------------
    def reply(self, frame: bytes) -> None:
        """Queue a complete reply frame; written at the end of this loop iteration."""
        if self.closed:
            return
        if self._sender is not None:
            self._queue.append(frame)
            return
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def flush_replies(self) -> None:
        """Write the queued replies now instead of at the end of this loop iteration."""
        if self._out and self._sender is None:
            self._flush()

    def result(self, code: int, body: bytes, opaque: int) -> None:
        self.reply(result_frame(code, body, opaque))

    def reply_region(self, header: bytes, region: Any) -> None:
        """Queue ``header`` followed by the bytes of a storage FileRegion (sent zero-copy)."""
        if self.closed:
            region.close()
            return
        self._flush()
        self._queue.append((header, region))
        if self._sender is None:
            self._sender = self.loop.create_task(self._send_queue())
        elif len(self._queue) > MAX_QUEUED:
            self._maybe_pause()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.closed:
            data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
            self._out.clear()
            self.transport.write(data)
            self._maybe_pause()
        if self._close_after_flush and self._sender is None:
            self._close()

    async def _send_queue(self) -> None:
        transport = self.transport
        assert transport is not None
        try:
            while self._queue and not self.closed:
                item = self._queue.popleft()
                if isinstance(item, bytes):
                    transport.write(item)
                    continue
                header, region = item
                try:
                    transport.write(header)
                    await self._sendfile(transport, region)
                finally:
                    region.close()
                if self._reading_paused:
                    self._maybe_resume()
        except (ConnectionError, RuntimeError, OSError) as exc:
            log.debug("sendfile to %s failed: %r", self.peer, exc)
            self._close()
        finally:
            self._sender = None
        self._maybe_resume()
        if self._close_after_flush and not self.closed:
            self._close()

    async def _sendfile(self, transport: asyncio.Transport, region: Any) -> None:
        if region.length <= 0:
            return
        # loop.sendfile uses os.sendfile with an explicit offset and then lseeks the file it
        # was given; storage writes with mmap/pwrite only, so sharing the position is harmless.
        with open(region.fd, "rb", buffering=0, closefd=False) as f:
            await self.loop.sendfile(transport, f, region.position, region.length)

    # -- flow control -------------------------------------------------------------------------
    def request_started(self) -> None:
        self.inflight += 1
        if self.inflight > MAX_INFLIGHT:
            self._maybe_pause()

    def request_done(self) -> None:
        self.inflight -= 1
        if self._eof and self.inflight == 0:
            self.close_after_flush()
        if self._reading_paused:
            self._maybe_resume()

    def _maybe_pause(self) -> None:
        if self._reading_paused or self.transport is None or self.closed:
            return
        buffered = self.transport.get_write_buffer_size()
        if self.inflight > MAX_INFLIGHT or buffered > MAX_BUFFERED or len(self._queue) > MAX_QUEUED:
            self._reading_paused = True
            self.transport.pause_reading()
            if buffered > MAX_BUFFERED:
                self.loop.call_later(0.01, self._maybe_resume)

    def _maybe_resume(self) -> None:
        if not self._reading_paused or self.transport is None or self.closed:
            return
        buffered = self.transport.get_write_buffer_size()
        if (
            self.inflight <= MAX_INFLIGHT // 2
            and buffered <= MAX_BUFFERED // 2
            and len(self._queue) <= MAX_QUEUED // 2
            and not self._close_after_flush
        ):
            self._reading_paused = False
            self.transport.resume_reading()
        elif buffered > MAX_BUFFERED // 2:
            self.loop.call_later(0.01, self._maybe_resume)

    # -- closing ------------------------------------------------------------------------------
    def _protocol_error(self, exc: ProtocolError) -> None:
        opaque = 0 if exc.opaque is None else exc.opaque
        self.dispatcher.protocol_error(self, exc)
        self.result(400, exc.reason.encode("utf-8", "replace"), opaque)
        if exc.fatal:
            self.close_after_flush()

    def close_after_flush(self) -> None:
        """Stop reading; close once the queued replies are written (quit, fatal errors)."""
        self._close_after_flush = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
            self._reading_paused = True
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.closed = True
            self.transport.abort()
