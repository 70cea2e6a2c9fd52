"""The ``pymetaq tail`` agent: every source of a configuration, run by one thread.

Each source has its own producer (its own ``compress`` and ``timeout``) and checkpoint. The
first start of every source must succeed (an unknown topic or no broker is the user's error,
reported at once); afterwards a failure (a refused or lost send, a broker going away) closes
that source and starts it again from its checkpoint after a backoff (0.5 s doubling to 30 s),
so the agent keeps running through broker restarts.

Thread-safety: :meth:`TailAgent.run` runs in one thread; :meth:`TailAgent.stop` may be called
from any thread or a signal handler.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from pymetaq.client.errors import MetaClientError
from pymetaq.client.producer.config import MAX_BATCH_MESSAGES
from pymetaq.client.producer.sync import Producer
from pymetaq.client.tail.config import AgentConfig, SourceConfig
from pymetaq.client.tail.source import SendFailed, Source

log = logging.getLogger("pymetaq.tail")

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0


class TailAgent:
    def __init__(
        self, cfg: AgentConfig, servers: str, host: str | None = None, once: bool = False
    ) -> None:
        self.cfg = cfg
        self.servers = servers
        self.host = host or socket.gethostname()
        self._stop = threading.Event()
        self.sources: list[Source | None] = [None] * len(cfg.sources)
        self._retry_at = [0.0] * len(cfg.sources)
        self._backoff = [BACKOFF_MIN_S] * len(cfg.sources)
        #: lines sent / acknowledged by sources that were closed (restarts)
        self.lines_done = 0
        #: stop once every file is read to its end and every line acknowledged
        self.once = once

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _open(self, sc: SourceConfig) -> Source:
        producer = Producer(
            self.servers,
            compression="lz4" if sc.compress else None,
            batch_messages=MAX_BATCH_MESSAGES,
            batch_bytes=self.cfg.max_buf_size + 64 * 1024,
            request_timeout_ms=sc.timeout_ms,
            linger_ms=0,
        )
        src = Source(sc, self.servers, producer, self.cfg.max_buf_size, self.host)
        try:
            src.start()
        except BaseException:
            src.close()
            producer.close()
            raise
        return src

    def start(self) -> None:
        """Start every source (errors propagate: the caller reports them)."""
        for i, sc in enumerate(self.cfg.sources):
            self.sources[i] = self._open(sc)

    def _failed(self, i: int, e: BaseException) -> None:
        src = self.sources[i]
        log.warning(
            "source %s: %s; starting again in %.1fs", self.cfg.sources[i].name, e, self._backoff[i]
        )
        if src is not None:
            self._close(src)
        self.sources[i] = None
        self._retry_at[i] = time.monotonic() + self._backoff[i]
        self._backoff[i] = min(BACKOFF_MAX_S, self._backoff[i] * 2)

    def _close(self, src: Source) -> None:
        try:
            src.close()
        finally:
            src.producer.close()
            self.lines_done += src.stats.acked_lines

    def run(self) -> None:
        """Run until :meth:`stop` (or, ``once``, until every source is caught up); then send
        what is read, checkpoint, close."""
        try:
            while not self._stop.is_set():
                busy = False
                for i, sc in enumerate(self.cfg.sources):
                    src = self.sources[i]
                    if src is None:
                        if time.monotonic() < self._retry_at[i]:
                            continue
                        try:
                            src = self.sources[i] = self._open(sc)
                        except (MetaClientError, SendFailed, TimeoutError, OSError) as e:
                            self._failed(i, e)
                            continue
                    try:
                        busy |= src.poll()
                        self._backoff[i] = BACKOFF_MIN_S
                    except (MetaClientError, SendFailed, TimeoutError) as e:
                        self._failed(i, e)
                if (
                    not busy
                    and self.once
                    and all(s is not None and s.caught_up() for s in self.sources)
                ):
                    break
                if not busy:
                    live = [s for s in self.sources if s is not None and s.inflight]
                    if live:
                        live[0].wait_acks(self.cfg.poll_interval_s)
                    else:
                        self._stop.wait(self.cfg.poll_interval_s)
        finally:
            for i, src in enumerate(self.sources):
                if src is not None:
                    self._close(src)
                    self.sources[i] = None

    def acked_lines(self) -> int:
        return self.lines_done + sum(s.stats.acked_lines for s in self.sources if s is not None)
