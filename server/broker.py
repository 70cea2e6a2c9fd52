"""The broker: storage + an asyncio TCP listener + the dispatcher, with a clean lifecycle.

``Broker(config)`` can run two ways:

- in-process: ``start()`` runs its own event loop in a thread and returns once the listener
  is bound (``.port`` / ``.address``; ``serverPort=0`` picks a free port); ``stop()`` shuts
  down; it is also a context manager.
- in the foreground: ``run()`` (the ``pymetaq server`` command) blocks, handles SIGTERM/SIGINT
  (clean stop) and SIGHUP (reload the ``[topic=...]`` sections) and returns the exit code.

With ``zk.zkEnable=true`` the broker registers in ZooKeeper once it listens
(:mod:`pymetaq.server.registry`); a conflicting registration stops the start.

Stop sequence: with ZooKeeper, unregister and keep serving for ``zk.zkSyncTimeMs``; stop
accepting; stop reading from every connection; answer waiting long-poll gets; wait (bounded by
``STOP_GRACE_S``) until every in-flight put is acknowledged; flush the replies; close the
connections; ``store.close()`` (flush, stop threads, write the clean-shutdown marker).

Thread-safety: ``start``/``stop``/``reload_config`` may be called from any thread; everything
else runs on the broker's loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pymetaq.ha.failover import replica_id
from pymetaq.server import default_config
from pymetaq.server.config import BrokerConfig
from pymetaq.server.connection import Connection
from pymetaq.server.dispatch import Dispatcher
from pymetaq.server.errors import BrokerStateError, ConfigError, StartupError
from pymetaq.server.http import start_dashboard
from pymetaq.server.registry import RegistryError
from pymetaq.server.replication import (
    check_slave_config,
    start_slave,
    start_sync_link,
    stop_promoter,
)
from pymetaq.server.retention import open_progress
from pymetaq.server.security.tls import server_context
from pymetaq.server.transaction.service import TransactionService
from pymetaq.storage import MessageStoreManager, StorageError

if TYPE_CHECKING:
    from pymetaq.ha.config import SamsaConfig, SlaveConfig
    from pymetaq.ha.slave import AsyncSlave
    from pymetaq.ha.sync import SyncLink

log = logging.getLogger("pymetaq.server")

STOP_GRACE_S = 10.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0


class Broker:
    """One pymetaq broker (see the module docstring)."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        slave_config: SlaveConfig | None = None,
        samsa: SamsaConfig | None = None,
        gregor: bool = False,
    ) -> None:
        if slave_config is not None:
            check_slave_config(config, slave_config)
        self.config = config
        #: ``-Fmetaslave=...``: this broker is an asynchronous slave (pymetaq.ha.slave)
        self.slave_config = slave_config
        self.slave: AsyncSlave | None = None
        #: ``-Fsamsa=...``: the master of a synchronous pair; ``-Fgregor=...``: its slave
        self.samsa = samsa
        self.gregor = gregor
        self.sync_link: SyncLink | None = None
        #: automatic failover (pymetaq.ha.failover): the epoch this broker is the master at,
        #: why it may not accept writes now (None: it may), a gregor slave's watch on its master
        self.epoch: int | None = None
        self.fenced: str | None = None
        self.promoter: Any = None
        self.promotion: asyncio.Task[None] | None = None  # the promoted broker's registration
        #: a replaced master rejoining (server/rejoin.py): the task, then its gregor node;
        #: a promoted master: its log ends at promotion, and its watch for a rejoining slave
        self.rejoining: asyncio.Task[None] | None = None
        self.gregor_node: Any = None
        self.promoted_ends: dict[tuple[str, int], int] = {}
        self.reattach: Any = None
        self.replica = ""  # a pair's replica id (pymetaq.ha.failover.replica_id), with zk
        #: map consumer offsets by msgId before registering (pymetaq.ha.recover): a samsa
        #: master's recoverOffset=true, and always for a promoted gregor slave
        self.recover_offsets = samsa.recover_offset if samsa is not None else False
        self.store: Any = None
        self.transactions: Any = None
        self.port = 0
        self.tls_port = -1  # the TLS listener's port (== port with tlsOnServerPort), -1 = none
        self.host = config.system.host_name or "127.0.0.1"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.dispatcher: Dispatcher | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._stop_event: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._store_configs: dict[str, Any] = {}
        self._loop_thread_id = 0
        self.registry: Any = None  # pymetaq.server.registry.BrokerRegistry when zk is enabled
        self.dashboard: Any = None  # pymetaq.server.http.Dashboard when dashboardHttpPort > 0

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> Broker:
        """Run the broker in a background thread; returns once it listens (or raises)."""
        if self._thread is not None:
            raise BrokerStateError("broker already started")
        self._thread = threading.Thread(
            target=self._thread_main, name="pymetaq-broker", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            raise BrokerStateError(f"broker did not start within {timeout} s")
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop a broker started with :meth:`start` (idempotent)."""
        if self._thread is None:
            raise BrokerStateError("broker was not started")
        self.request_stop()
        self._thread.join(timeout)

    def request_stop(self) -> None:
        """Ask the loop to stop (any thread, signal-safe from the loop thread)."""
        loop, event = self.loop, self._stop_event
        if loop is not None and event is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self.serve())
        except StartupError as exc:
            self._error = exc
            log.error("%s", exc)
        except BaseException as exc:
            self._error = exc
            log.exception("broker failed")
        finally:
            self._ready.set()
            self._stopped.set()

    def run(self) -> int:
        """Serve in the foreground with signal handling; the process's exit code.

        Raises :class:`StartupError` (a reason for a person: the ``pymetaq`` command prints it
        without a traceback) when the broker cannot start, also for a ZooKeeper registration
        that failed (``broker <id> not started: ...``), and :class:`ConfigError`."""
        try:
            asyncio.run(self.serve(install_signals=True, own_process=True))
        except (ConfigError, StartupError):
            raise
        except RegistryError as exc:
            raise StartupError(f"broker {self.config.system.broker_id} not started: {exc}") from exc
        except Exception:
            log.exception("broker failed")
            return 1
        return 0

    # -- the loop ---------------------------------------------------------------------------------
    async def serve(self, *, install_signals: bool = False, own_process: bool = False) -> None:
        """Open storage, listen, serve until asked to stop, then shut down cleanly.

        ``own_process`` (``run()``): the process is the broker's, so once started it moves every
        object allocated so far (modules, config, storage) out of the cyclic GC's reach
        (``gc.freeze``): later full collections then walk only what the traffic allocates."""
        loop = asyncio.get_running_loop()
        self.loop = loop
        self._loop_thread_id = threading.get_ident()
        self._stop_event = asyncio.Event()
        self._open_store()
        self.dispatcher = dispatcher = Dispatcher(self, loop)
        if self.samsa is not None:
            self.sync_link = start_sync_link(self)
            dispatcher.appender.replicator = self.sync_link
        try:
            server, tls_server = await self._listen(dispatcher)
        except BaseException:
            self.transactions.close_blocking()
            self.store.close()
            raise
        self.port = server.sockets[0].getsockname()[1]
        if self.config.security.tls_on_server_port:
            self.tls_port = self.port
        elif tls_server is not None:
            self.tls_port = tls_server.sockets[0].getsockname()[1]
        try:
            self.dashboard = await start_dashboard(self, dispatcher)
            await self._register()
            if self.slave_config is not None:
                self.slave = start_slave(self)
        except BaseException:
            server.close()
            if tls_server is not None:
                tls_server.close()
            if self.dashboard is not None:
                await self.dashboard.close()
            await self.transactions.aclose()
            await loop.run_in_executor(None, self.store.close)
            raise
        if install_signals:
            loop.add_signal_handler(signal.SIGTERM, self._stop_event.set)
            loop.add_signal_handler(signal.SIGINT, self._stop_event.set)
            loop.add_signal_handler(signal.SIGHUP, self.reload_config)
        idle = loop.create_task(self._idle_sweeper())
        log.info(
            "pymetaq broker %d listening on %s:%d%s (data: %s)",
            self.config.system.broker_id,
            self.host,
            self.port,
            "" if self.tls_port < 0 else f", TLS on {self.host}:{self.tls_port}",
            self.config.system.data_path,
        )
        if own_process:
            gc.collect()
            gc.freeze()
        self._ready.set()
        try:
            await self._stop_event.wait()
        finally:
            idle.cancel()
            if tls_server is not None:
                tls_server.close()
            await self._shutdown(server, dispatcher)

    async def _listen(self, dispatcher: Dispatcher) -> tuple[asyncio.Server, asyncio.Server | None]:
        """The broker port (TLS with ``tlsOnServerPort``) and the ``tlsPort`` listener, if any."""
        loop = asyncio.get_running_loop()
        security = self.config.security
        ctx = server_context(security) if security.tls else None

        async def listen(port: int, tls: bool) -> asyncio.Server:
            try:
                return await loop.create_server(
                    lambda: Connection(dispatcher),
                    self.host,
                    port,
                    backlog=1024,
                    reuse_address=True,
                    ssl=ctx if tls else None,
                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if tls else None,
                )
            except OSError as exc:
                what = "tlsPort" if tls and security.tls_port >= 0 else "serverPort"
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
                raise StartupError(
                    f"cannot listen on {self.host}:{port}: {reason} (check hostName and {what})"
                ) from exc

        server = await listen(self.config.system.server_port, security.tls_on_server_port)
        if security.tls_port < 0:
            return server, None
        try:
            return server, await listen(security.tls_port, True)
        except BaseException:
            server.close()
            raise

    def _open_store(self) -> None:
        """Lock and open the data directory; every damaged partition is fenced (logged, with
        errors for it) and the rest served; a directory that cannot be used stops the start."""
        self.store = MessageStoreManager(self.config.store_config(), self._topic_store_config)
        try:
            reports = self.store.open()
        except (StorageError, OSError) as exc:
            self.store.abort()
            raise StartupError(f"cannot start: {exc}") from exc
        for report in reports:
            if report.fenced:
                log.error(
                    "partition %s-%d is fenced (damaged): puts and gets to it fail until "
                    "`pymetaq repair%s` is run with the broker stopped",
                    report.topic,
                    report.partition,
                    default_config.file_option(self.config),
                )
        self.store.consumer_progress = open_progress(self)
        self.store.start()
        try:
            self.transactions = TransactionService.open(self.config, self.store)
        except BaseException:
            self.store.close()
            raise

    async def _register(self) -> None:
        if (self.gregor or self.samsa is not None) and self.config.zookeeper.enabled:
            self.replica = replica_id(self.config.system.data_path)
        if self.gregor:  # MetaQ's gregor slave forces zkEnable=false: clients never see it
            if self.config.zookeeper.enabled:  # pymetaq: it watches its master (failover)
                log.info(
                    "gregor slave: not registering in ZooKeeper (as MetaQ); watching the master"
                )
                from pymetaq.server.rejoin import gregor_start

                await gregor_start(self)
            return
        if self.config.zookeeper.enabled:  # kazoo is imported only then
            from pymetaq.server.registry import Replaced, open_registry

            loop = asyncio.get_running_loop()
            try:
                self.registry = await loop.run_in_executor(None, open_registry, self)
            except Replaced as e:  # a samsa master replaced while it was down: rejoin
                url = f"{self.host}:{self.port}"
                self.set_fenced(
                    f"brokerId {self.config.system.broker_id}'s master is {e.holder} since "
                    f"epoch {e.epoch} (this broker at {url} was replaced): it rejoins as its slave"
                )
                self.replaced(e.holder, e.epoch)
                return
            self.epoch = self.registry.epoch

    def replaced(self, holder: str, epoch: int) -> None:
        """(any thread) Another replica is this brokerId's master: rejoin it as its slave."""
        from pymetaq.server.rejoin import replaced

        replaced(self, holder, epoch)

    def set_fenced(self, why: str | None) -> None:
        """(any thread) Why this master may not accept writes now, or None when it may."""
        if why != self.fenced:
            if why is None:
                log.info("epoch %s confirmed: accepting writes", self.epoch)
            else:
                log.error("not accepting writes: %s", why)
        self.fenced = why

    async def _stop_rejoin(self) -> None:
        if self.rejoining is not None:
            self.rejoining.cancel()
            with contextlib.suppress(BaseException):
                await self.rejoining
        if self.gregor_node is not None:
            self.gregor_node.close()
        if self.reattach is not None:
            await self.reattach.close()

    def topic_stored(self, topic: str) -> None:
        """The dispatcher opened ``topic`` for writing (a pattern topic's first put)."""
        if self.registry is not None:
            self.registry.add_topic(topic)

    def _topic_store_config(self, topic: str) -> Any:
        tc = self.config.topic_config(topic)
        if tc is None:
            return None
        # keyed by [topic=...] section, not by name: invented names must not grow this
        cached = self._store_configs.get(tc.name)
        if cached is None:
            cached = self._store_configs[tc.name] = tc.store_config()
        return cached

    async def _shutdown(self, server: asyncio.Server, dispatcher: Dispatcher) -> None:
        if self.slave is not None:  # stop appending before anything else stops
            await self.slave.close()
        await self._stop_rejoin()
        if self.promoter is not None:
            await asyncio.get_running_loop().run_in_executor(None, stop_promoter, self.promoter)
        if self.registry is not None:  # MetaQ: unregister, let clients notice, then stop
            await asyncio.get_running_loop().run_in_executor(None, self.registry.stop)
            sync_ms = self.config.zookeeper.sync_time_ms
            log.info("unregistered from ZooKeeper; serving %d ms more (zk.zkSyncTimeMs)", sync_ms)
            await asyncio.sleep(sync_ms / 1000)
        log.info("stopping: no longer accepting connections")
        if self.dashboard is not None:
            await self.dashboard.close()
        dispatcher.accepting = False
        server.close()
        for conn in list(dispatcher.connections):
            if conn.transport is not None and not conn.closed:
                conn.transport.pause_reading()
        dispatcher.longpoll.expire_all()
        deadline = time.monotonic() + STOP_GRACE_S
        while any(c.inflight for c in dispatcher.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)  # let the last replies flush
        for conn in list(dispatcher.connections):
            conn.close_after_flush()
        deadline = time.monotonic() + 2.0
        while dispatcher.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        for conn in list(dispatcher.connections):
            conn.abort()
        await server.wait_closed()
        await self.transactions.aclose()
        if self.sync_link is not None:
            await self.sync_link.close()
        dispatcher.filters.close()
        dispatcher.appender.idempotence.close()
        await asyncio.get_running_loop().run_in_executor(None, self.store.close)
        if self.store.consumer_progress is not None:
            self.store.consumer_progress.close()
        log.info("stopped: storage closed cleanly")

    async def _idle_sweeper(self) -> None:
        idle_ms = self.config.system.idle_timeout_ms
        if idle_ms <= 0:
            return
        period = min(1.0, idle_ms / 4000.0)
        idle_for: dict[Connection, float] = {}
        dispatcher = self.dispatcher
        assert dispatcher is not None
        while True:
            await asyncio.sleep(period)
            for conn in list(dispatcher.connections):
                if conn.active or conn.inflight:
                    conn.active = False
                    idle_for[conn] = 0.0
                    continue
                idle_for[conn] = idle_for.get(conn, 0.0) + period
                if idle_for[conn] * 1000 >= idle_ms:
                    log.info("closing idle connection from %s", conn.peer)
                    conn.close_after_flush()
            for conn in [c for c in idle_for if c not in dispatcher.connections]:
                del idle_for[conn]

    # -- configuration reload -------------------------------------------------------------------
    def reload_config(self) -> bool:
        """Re-read the file and apply its ``[topic=...]`` sections (SIGHUP); False on error."""
        loop = self.loop
        if loop is None or threading.get_ident() == self._loop_thread_id:
            return self._reload()
        fut = asyncio.run_coroutine_threadsafe(self._reload_async(), loop)
        return fut.result(30)

    async def _reload_async(self) -> bool:
        return self._reload()

    def _reload(self) -> bool:
        return self.reload_now()[0]

    def reload_now(self) -> tuple[bool, str]:
        """(loop thread) Reload now: (applied?, what happened - for ``admin reload``)."""
        try:
            new = default_config.load(self.config.path)
        except ConfigError as exc:
            log.error("config reload failed, keeping the old configuration: %s", exc)
            return False, f"config reload failed, keeping the old configuration: {exc}"
        note = ""
        if new.security != self.config.security:
            log.warning("config reload: [security] and [user=...] changes need a restart")
            note += "; [security]/[user=...] changes need a restart (not applied)"
        if new.system != self.config.system:
            log.warning("config reload: [system] changes need a restart; applying topics only")
            note += "; [system] changes need a restart (not applied)"
        self.config = dataclasses.replace(
            self.config, topics=new.topics, text=new.text, checksum=new.checksum
        )
        self._store_configs.clear()
        if self.dispatcher is not None:
            self.dispatcher.invalidate_logs()
        self.store.reload_topic_config()
        if self.registry is not None:
            self.registry.reload()
        log.info("config reloaded: %d topic section(s)", len(new.topics))
        return True, (
            f"config reloaded: {len(new.topics)} topic section(s), checksum {new.checksum}{note}"
        )
