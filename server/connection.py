"""One client connection: bytes in through the codec, replies out in order of completion.

The hot path is an :class:`asyncio.Protocol`: ``data_received`` feeds the sans-I/O parser and
hands every complete command to the dispatcher; replies are collected and written with one
``transport.write`` per loop iteration (a pipelined batch of 100 puts is one write).  A ``get``
reply is the ``value <len> <opaque>`` header followed by a slice of a segment file sent with
``loop.sendfile`` (``os.sendfile``, zero-copy); while a slice is being sent, later replies
queue behind it so bytes never interleave.  Replies may complete out of order (a put waits for
its fsync, a long-poll get for data); the client matches them by opaque, as MetaQ's do.

Bounds (each one a client could otherwise push without limit):

- *TLS*: ``sendfile`` cannot encrypt, so a get reply is one ``pread`` of the slice written
  through the TLS transport; while the client is not reading (``pause_writing``) later replies
  queue as :class:`DeferredGet` (no bytes, no descriptor) and are read when it drains.
- *Descriptors*: a get reply queued behind a running sendfile holds no descriptor - it is a
  :class:`DeferredGet` (log, offset, length) whose slice is opened when its turn comes.  So a
  connection holds at most one segment descriptor, however many gets it pipelines (before: one
  per queued reply; 20,000 pipelined gets held 10,048).
- *Work and memory*: the connection stops **reading and parsing** while more than
  ``MAX_INFLIGHT`` requests await completion, the transport holds more than ``MAX_BUFFERED``
  unsent reply bytes (``pause_writing``), more than ``MAX_QUEUED`` replies wait behind a
  sendfile, or its body is waiting for room in the broker's :class:`~pymetaq.server.limits.
  BodyBudget`; commands already buffered stay in the parser until it resumes.
- *Time*: ``requestTimeoutMs`` bounds how long a frame may take to arrive (from its first byte,
  while the broker is reading), how long replies may sit unread, and how long a closing
  connection may take to drain; past it the connection is aborted (:meth:`check_deadlines`,
  called by the dispatcher's sweep).  Activity-based idleness is the broker's idle sweeper.

Thread-safety: every method runs on the broker's event-loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import struct
from typing import TYPE_CHECKING, NamedTuple

from pymetaq.client.protocol import NEED_DATA, Parser, ProtocolError, QuitCommand, Role
from pymetaq.server.errors import describe_os_error
from pymetaq.server.limits import FREE_BODY_BYTES
from pymetaq.server.security.acl import ANONYMOUS, NO_RIGHTS, Identity
from pymetaq.storage import FileRegion, PartitionLog, ReadStatus, StorageError

if TYPE_CHECKING:
    from pymetaq.server.dispatch import Dispatcher

log = logging.getLogger("pymetaq.server")

MAX_INFLIGHT = 512
#: unsent reply bytes in the transport above which the connection stops reading
MAX_BUFFERED = 4 << 20
#: replies queued behind a running sendfile above which the connection stops reading
MAX_QUEUED = 64
#: commands one connection runs per turn before the loop serves the others (fairness)
TURN_COMMANDS = 256
#: bytes waiting in the parser above which a connection that used up its turn stops reading
MAX_PARSE_BACKLOG = 1 << 20
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


def result_frame(code: int, body: bytes, opaque: int) -> bytes:
    """``result <code> <len> <opaque>\\r\\n<body>``."""
    return b"result %d %d %d\r\n%b" % (code, len(body), opaque, body)


class RegionReply(NamedTuple):
    """A ``value`` reply whose slice is open (a descriptor held): sent next."""

    header: bytes
    region: FileRegion


class DeferredGet(NamedTuple):
    """A ``value`` reply queued behind a sendfile: its slice is re-opened when its turn comes."""

    plog: PartitionLog
    offset: int
    length: int
    opaque: int


Queued = bytes | RegionReply | DeferredGet


class Connection(asyncio.Protocol):
    """The protocol object of one TCP connection."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.loop = dispatcher.loop
        self.parser = Parser(Role.SERVER, dispatcher.limits, bare_lf=True)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_ip = "?"
        self.inflight = 0
        self.active = True  # bytes arrived since the last idle sweep
        self.closed = False
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._queue: collections.deque[Queued] = collections.deque()
        self._sender: asyncio.Task[None] | None = None
        self._paused = False  # not reading or parsing (see the module docstring)
        self._backlogged = False  # not reading: over MAX_PARSE_BACKLOG bytes wait to be parsed
        self._write_paused = False  # the transport's buffer is over MAX_BUFFERED
        self._awaiting_budget = False
        self._reserved = 0  # body bytes reserved (or asked for) in the dispatcher's BodyBudget
        self._close_after_flush = False
        self._eof = False
        self._drained = True  # the parser holds no complete command (the last _process ran dry)
        self._process_scheduled = False
        # deadlines (loop.time(); 0.0 = none)
        self._frame_since = 0.0  # first byte of the frame being received
        self._stalled_since = 0.0  # replies stopped moving (unread buffer or sendfile)
        self._closing_since = 0.0
        self.identity = Identity(ANONYMOUS, NO_RIGHTS)  # set by the dispatcher when accepted
        self.tls = False  # TLS: get replies are read and written (sendfile cannot encrypt)
        self._held = False  # reading held by the security guard (an ``auth`` being checked)

    # -- asyncio callbacks ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=MAX_BUFFERED)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer_ip = str(peer[0])
            self.peer = f"{peer[0]}:{peer[1]}"
        else:
            self.peer = self.peer_ip = str(peer)
        self.tls = transport.get_extra_info("sslcontext") is not None
        if not self.dispatcher.connection_opened(self):
            self.closed = True
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, RegionReply):
                item.region.close()
        self.parser.release()  # a half-received body is freed now, not when this is collected
        self.dispatcher.connection_closed(self)

    def data_received(self, data: bytes) -> None:
        self.active = True
        self._drained = False
        self.parser.feed(data)
        if self._paused or self._backlogged:
            # asyncio resumes reading by itself after a sendfile; keep this connection paused
            if self.transport is not None:
                self.transport.pause_reading()
            return
        self._process()

    def _process(self) -> None:
        """Run the complete commands buffered, unless (or until) the connection pauses; after
        ``TURN_COMMANDS`` the rest waits for the next loop turn so other connections are served."""
        self._process_scheduled = False
        parser = self.parser
        handle = self.dispatcher.handle
        budget = TURN_COMMANDS
        while not (self._paused or self.closed or self._close_after_flush):
            if not budget:
                self._frame_since = 0.0  # the broker owes this connection a turn
                self._next_turn()
                return
            try:
                event = parser.next_event()
            except ProtocolError as exc:
                self._protocol_error(exc)
                if exc.fatal:
                    return
                continue
            if event is NEED_DATA:
                self._drained = True
                break
            if type(event) is QuitCommand:
                self.close_after_flush()
                return
            handle(self, event)
            budget -= 1
        if self._eof:
            self._finish_eof()
        if self._backlogged and not self._paused:
            self._backlogged = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()
        self._track_frame(budget < TURN_COMMANDS)

    def _next_turn(self) -> None:
        """Continue parsing one loop turn later; stop reading if the backlog is large."""
        if not self._process_scheduled:
            self._process_scheduled = True
            self.loop.call_soon(self._process)
        if not self._backlogged and self.parser.pending_bytes > MAX_PARSE_BACKLOG:
            self._backlogged = True
            if self.transport is not None:
                self.transport.pause_reading()

    def _track_frame(self, progress: bool) -> None:
        """Time the frame being received (from when it began to arrive, as far as the broker
        can tell: the last time a frame completed, or its first byte); reserve room for a
        large body."""
        parser = self.parser
        if not parser.in_frame:
            self._frame_since = 0.0
            if self._reserved:
                self._release_body()
            return
        if progress or not self._frame_since:
            self._frame_since = self.loop.time()
        body = parser.pending_body
        if body == self._reserved or self._awaiting_budget:
            return
        if self._reserved:
            self._release_body()  # the previous large body is complete
        if body > FREE_BODY_BYTES:
            if self.dispatcher.body_budget.reserve(self, body):
                self._reserved = body
            else:
                self._reserved, self._awaiting_budget = body, True
                self._pause()

    def _release_body(self) -> None:
        self._reserved = 0
        self.dispatcher.body_budget.release(self)

    def budget_granted(self) -> None:
        """The body budget has room for this connection's body now."""
        self._awaiting_budget = False
        self._maybe_resume()

    def eof_received(self) -> bool:
        """The client half-closed: run what it sent, answer what is in flight, then close."""
        self._eof = True
        self._finish_eof()
        # keep the transport open until the replies are written (TLS cannot half-close:
        # asyncio closes it whatever this returns, and warns if it is True)
        return not self.tls

    def _finish_eof(self) -> None:
        """After a half-close: close once every command sent has been run and answered."""
        if self.inflight == 0 and self._drained and not self._close_after_flush:
            self.close_after_flush()

    def pause_writing(self) -> None:
        """The transport holds more than MAX_BUFFERED unsent bytes: stop reading."""
        self._write_paused = True
        if not self._stalled_since:
            self._stalled_since = self.loop.time()
        self._pause()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._sender is None:
            self._stalled_since = 0.0
        if self.tls and self._queue:
            self._drain_tls()
        self._maybe_resume()

    def _drain_tls(self) -> None:
        """TLS: write the replies queued while the client was not reading, until the transport
        is full again (each get slice read only now, as a :class:`DeferredGet`)."""
        while self._queue and not self._write_paused and not self.closed:
            item = self._queue.popleft()
            if isinstance(item, DeferredGet):
                opened = self._reopen(item)
                if isinstance(opened, RegionReply):
                    self._write_region(opened.region, item.opaque)
                    continue
                item = opened
            if isinstance(item, RegionReply):  # not queued on TLS connections; be safe
                self._write_region(item.region, int(item.header.split()[2]))
                continue
            assert self.transport is not None
            self.transport.write(item)
        if self._close_after_flush and not self._queue:
            self._flush()

    # -- replies ----------------------------------------------------------------------------------
    def reply(self, frame: bytes, *, caller_flushes: bool = False) -> None:
        """Queue a complete reply frame; written at the end of this loop iteration, or by the
        caller's :meth:`flush_replies` (``caller_flushes``: it promises one before it returns
        to the loop, so no flush is scheduled - an empty loop iteration per acknowledged put
        round, before)."""
        if self.closed:
            return
        if self._sender is not None or self._queue:  # (TLS: replies wait behind the queue)
            self._enqueue(frame)
            return
        self._out.append(frame)
        if not self._flush_scheduled and not caller_flushes:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def flush_replies(self) -> None:
        """Write the queued replies now instead of at the end of this loop iteration."""
        if self._out and self._sender is None:
            self._flush()

    def result(self, code: int, body: bytes, opaque: int, *, caller_flushes: bool = False) -> None:
        self.reply(result_frame(code, body, opaque), caller_flushes=caller_flushes)

    def reply_region(
        self, plog: PartitionLog, offset: int, region: FileRegion, opaque: int
    ) -> None:
        """Queue ``value <len> <opaque>`` + the bytes of ``region`` (sent zero-copy).

        Sent at once when nothing else is being sent; otherwise the descriptor is closed now
        and the slice re-opened when its turn comes (:class:`DeferredGet`)."""
        if self.closed:
            region.close()
            return
        if self.tls:
            if self._write_paused or self._queue:  # the client is not reading: hold no bytes
                region.close()
                self._enqueue(DeferredGet(plog, offset, region.length, opaque))
            else:
                self._write_region(region, opaque)
            return
        if self._sender is not None:
            region.close()
            self._enqueue(DeferredGet(plog, offset, region.length, opaque))
            return
        self._flush()
        self._queue.append(RegionReply(b"value %d %d\r\n" % (region.length, opaque), region))
        self._sender = self.loop.create_task(self._send_queue())

    def _write_region(self, region: FileRegion, opaque: int) -> None:
        """TLS: one ``pread`` of the whole slice, written after the header (no per-message
        work; the transport's buffer limit pauses reading as for any reply)."""
        try:
            data = os.pread(region.fd, region.length, region.position) if region.length > 0 else b""
        except OSError as exc:
            self.reply(result_frame(500, describe_os_error(exc).encode(), opaque))
            return
        finally:
            region.close()
        self._flush()
        assert self.transport is not None
        self.transport.write(b"value %d %d\r\n" % (len(data), opaque))
        self.transport.write(data)

    def hold_reading(self, held: bool) -> None:
        """Stop (True) or allow again (False) reading and parsing: the security guard holds a
        connection while its ``auth`` is checked."""
        self._held = held
        if held:
            self._pause()
        else:
            self._maybe_resume()

    def _enqueue(self, item: Queued) -> None:
        self._queue.append(item)
        if len(self._queue) > MAX_QUEUED:
            self._pause()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.closed:
            data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
            self._out.clear()
            self.transport.write(data)
        if (
            self._close_after_flush
            and self._sender is None
            and not self._queue
            and self.inflight <= 0
        ):
            self._close()

    async def _send_queue(self) -> None:
        transport = self.transport
        assert transport is not None
        try:
            while self._queue and not self.closed:
                self._stalled_since = self.loop.time()
                item = self._queue.popleft()
                if isinstance(item, bytes):
                    transport.write(item)
                    continue
                if isinstance(item, DeferredGet):
                    opened = self._reopen(item)
                    if isinstance(opened, bytes):
                        transport.write(opened)
                        continue
                    item = opened
                try:
                    transport.write(item.header)
                    await self._sendfile(transport, item.region)
                finally:
                    item.region.close()
                if self._paused:
                    self._maybe_resume()
        except (ConnectionError, RuntimeError, OSError) as exc:
            log.debug("sendfile to %s failed: %r", self.peer, exc)
            self._close()
        finally:
            self._sender = None
            if not self._write_paused:
                self._stalled_since = 0.0
        self._maybe_resume()
        if self._close_after_flush and not self.closed and self.inflight <= 0:
            self._close()

    def _reopen(self, item: DeferredGet) -> RegionReply | bytes:
        """Open a deferred slice again: the same durable bytes, unless retention removed the
        segment meanwhile (then the reply is the 301 a get at that offset would get now)."""
        try:
            res = item.plog.read(item.offset, item.length)
        except (StorageError, OSError) as exc:
            return result_frame(500, self.dispatcher.read_failure(item.plog, exc), item.opaque)
        if res.status is ReadStatus.OK and res.region is not None:
            header = b"value %d %d\r\n" % (res.region.length, item.opaque)
            return RegionReply(header, res.region)
        if res.status is ReadStatus.OUT_OF_RANGE:
            return result_frame(301, str(res.offset).encode(), item.opaque)
        body = f"Could not find message at position {item.offset}".encode()
        return result_frame(404, body, item.opaque)

    async def _sendfile(self, transport: asyncio.Transport, region: FileRegion) -> None:
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
            self._pause()

    def request_done(self) -> None:
        self.inflight -= 1
        if self._close_after_flush:
            # the last request before a quit or a fatal error: its reply (queued next) is
            # written, then the connection closes (see close_after_flush)
            if self.inflight <= 0 and not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self._flush)
        elif self._eof:
            self._finish_eof()
        if self._paused:
            self._maybe_resume()

    def _pause(self) -> None:
        if self._paused or self.transport is None or self.closed:
            return
        self._paused = True
        self.transport.pause_reading()

    def _maybe_resume(self) -> None:
        if not self._paused or self.transport is None or self.closed:
            return
        if (
            self.inflight > MAX_INFLIGHT // 2
            or self._write_paused
            or len(self._queue) > MAX_QUEUED // 2
            or self._awaiting_budget
            or self._held
            or self._close_after_flush
            or not self.dispatcher.accepting
        ):
            return
        self._paused = False
        self._frame_since = 0.0  # the clock restarts: the broker, not the client, waited
        if not self._backlogged:
            self.transport.resume_reading()
        if not self._process_scheduled:  # commands may be buffered already: no data will come
            self._process_scheduled = True
            self.loop.call_soon(self._process)

    # -- deadlines ----------------------------------------------------------------------------------
    def check_deadlines(self, now: float, timeout_s: float) -> str | None:
        """Abort this connection if a request, its replies or its close have taken longer than
        ``timeout_s``; the reason, or None."""
        if self.closed:
            if not self._closing_since or now - self._closing_since <= timeout_s:
                return None
            reason = f"its last replies were not read within {timeout_s:g} s of the close"
        elif (
            self._frame_since
            and not (self._paused or self._backlogged)
            and now - self._frame_since > timeout_s
        ):
            reason = f"a request did not arrive within {timeout_s:g} s"
        elif self._stalled_since and now - self._stalled_since > timeout_s:
            reason = f"its replies were not read for {timeout_s:g} s"
        else:
            return None
        self.abort()
        return reason

    # -- closing ------------------------------------------------------------------------------
    def _protocol_error(self, exc: ProtocolError) -> None:
        opaque = 0 if exc.opaque is None else exc.opaque
        self.dispatcher.protocol_error(self, exc)
        self.result(400, exc.reason.encode("utf-8", "replace"), opaque)
        if exc.fatal:
            self.close_after_flush()

    def close_after_flush(self) -> None:
        """Stop reading; close once every request read before is answered and the replies
        are written (quit, fatal errors): a put in flight is acknowledged first."""
        self._close_after_flush = True
        self._pause()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self._closing_since = self.loop.time()
            self.transport.close()  # writes what is buffered first: bounded by check_deadlines

    def abort(self) -> None:
        """Drop the connection now: unsent replies are discarded, the peer gets a reset (the
        kernel does not keep the unread bytes for a client that never reads them)."""
        transport = self.transport
        if transport is None:
            return
        self.closed = True
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            except OSError:  # already closed
                pass
        sender = self._sender
        if sender is not None and not sender.done():
            # asyncio (3.11) cannot abort a transport in the middle of loop.sendfile (its
            # connection_lost fails on the sendfile's waiter and the socket is left open):
            # cancel the sendfile first, abort once it has unwound
            sender.cancel()
            sender.add_done_callback(lambda _task: transport.abort())
            return
        transport.abort()
