"""MetaQ's asynchronous slave ("metaslave"): follow the master, one replica per partition.

:class:`AsyncSlave` runs on the slave broker's event loop.  While the master's address is known
(the broker watches ``brokers/ids/<id>/master`` in ZooKeeper and passes ``master_url``), it
keeps two connections to the master: a control one, which every 250 ms asks ``stats offsets``
(which partitions exist there, their first and last offsets) and, with
``autoSyncMasterConfig=true``, watches the master's ``config_checksum`` and whenever it is not
the one last copied fetches ``stats config`` and hands the text to ``apply_master_config`` (the
broker takes the master's topics into its server.ini and reloads them); and a data one, shared by
the :class:`~pymetaq.ha.replica.PartitionReplica` of every partition that both brokers know
(the slave's own configuration decides which topics it keeps).

A lost connection or a master that changes address ends the round: every replica stops, and
the slave reconnects (100 ms, doubling to 2 s) and resumes each partition from its own log end.
A replica that fails for its own reason (a damaged reply, the master's retention overtaking
it) shows the error in its status and is retried every ``RETRY_S``.

Thread-safety: :meth:`start`, :meth:`close`, :meth:`status` on the broker's event-loop thread;
``master_url`` may be updated by any thread (it is read, never waited on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from pymetaq.client.errors import MetaClientError
from pymetaq.client.protocol import Limits, ResultReply, StatsCommand, VersionCommand
from pymetaq.client.protocol.zk import parse_meta_url
from pymetaq.client.transport.connection import BrokerConnection
from pymetaq.ha.config import SlaveConfig
from pymetaq.ha.replica import (
    MAX_FETCH,
    PartitionReplica,
    ProducerSink,
    ReplicaError,
    ReplicaStatus,
)
from pymetaq.ha.sync import PYMETAQ_VERSION
from pymetaq.storage import MessageStoreManager

log = logging.getLogger("pymetaq.ha")

POLL_S = 0.25
RETRY_S = 5.0
Key = tuple[str, int]


def parse_stats(body: bytes) -> list[str]:
    """The ``key value`` lines of a ``STATS ... END`` body."""
    lines = body.decode("utf-8", "replace").split("\r\n")
    return [ln for ln in lines if ln and ln not in ("STATS", "END")]


def parse_offsets(body: bytes) -> dict[Key, tuple[int, int]]:
    """``stats offsets`` -> {(topic, partition): (min_offset, max_offset)}; bad lines skipped."""
    out: dict[Key, tuple[int, int]] = {}
    for line in parse_stats(body):
        f = line.split()
        if len(f) == 7 and f[1] == "part" and f[3] == "min_offset" and f[5] == "max_offset":
            try:
                out[(f[0], int(f[2]))] = (int(f[4]), int(f[6]))
            except ValueError:
                continue
    return out


class AsyncSlave:
    """Follows the master (see the module doc)."""

    def __init__(
        self,
        config: SlaveConfig,
        store: MessageStoreManager,
        *,
        master_url: Callable[[], str | None],
        replicated: Callable[[str, int], bool],
        fetch_size: int,
        apply_master_config: Callable[[str], None] | None = None,
        producers: ProducerSink | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.master_url = master_url
        self.replicated = replicated
        self.fetch_size = fetch_size
        self._synced_checksum: str | None = None  # the master's config last copied
        self.apply_master_config = apply_master_config
        self.replicas: dict[Key, PartitionReplica] = {}
        #: where the master's idempotent producers' entries go (a pymetaq master only)
        self.producers = producers
        self._sink: ProducerSink | None = None  # this round's: set if the master is pymetaq
        self.state = "waiting for the master to register"
        self.connected_to: str | None = None
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def status(self) -> list[ReplicaStatus]:
        now_ms = time.time() * 1000
        return [self.replicas[k].status(now_ms) for k in sorted(self.replicas)]

    def status_lines(self) -> list[str]:
        head = [
            f"slave_id {self.config.slave_id} group {self.config.slave_group} "
            f"master {self.connected_to or '-'} state {self.state.replace(' ', '_')}"
        ]
        return head + [s.line() for s in self.status()]

    # -- rounds ------------------------------------------------------------------------------
    async def _run(self) -> None:
        backoff = 0.1
        while True:
            url = self.master_url()
            if url is None:
                self.state = "waiting for the master to register"
                await asyncio.sleep(0.2)
                continue
            try:
                await self._follow(url)
                backoff = 0.1
            except (MetaClientError, OSError, ValueError, ReplicaError) as e:
                self.state = f"master unreachable: {e}"
                log.warning("slave %d: following %s stopped: %s", self.config.slave_id, url, e)
            finally:
                self.connected_to = None
            await asyncio.sleep(backoff)
            backoff = min(2.0, backoff * 2)

    async def _follow(self, url: str) -> None:
        host, port = parse_meta_url(url)
        ctl = await BrokerConnection.open(host, port)
        try:
            data = await BrokerConnection.open(
                host, port, limits=Limits.for_transfer_size(MAX_FETCH)
            )
        except BaseException:
            ctl.close()
            raise
        try:
            self._sink = await self._producer_sink(ctl)
        except BaseException:
            ctl.close()
            data.close()
            raise
        tasks: dict[Key, asyncio.Task[None]] = {}
        failed_at: dict[Key, float] = {}
        self.connected_to = url
        self.state = "following"
        log.info("slave %d: following master %s", self.config.slave_id, url)
        try:
            while self.master_url() == url:
                if data.closed or ctl.closed:
                    raise ReplicaError("the connection to the master was lost")
                offsets = await self._poll(ctl)
                self._spawn(offsets, data, tasks, failed_at)
                if tasks:
                    done, _ = await asyncio.wait(
                        tasks.values(), timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED
                    )
                    self._reap(tasks, failed_at, done)
                else:
                    await asyncio.sleep(POLL_S)
        finally:
            for task in tasks.values():
                task.cancel()
            for task in tasks.values():
                with contextlib.suppress(BaseException):
                    await task
            ctl.close()
            data.close()

    async def _producer_sink(self, ctl: BrokerConnection) -> ProducerSink | None:
        """The sink of this round: only a pymetaq master (its ``version``) is asked for its
        producers' entries - a MetaQ master never sees the ``producers`` verb."""
        if self.producers is None:
            return None
        reply = await ctl.request(VersionCommand(), 30.0)
        pymetaq = isinstance(reply, ResultReply) and reply.body.startswith(PYMETAQ_VERSION)
        return self.producers if pymetaq else None

    async def _poll(self, ctl: BrokerConnection) -> dict[Key, tuple[int, int]]:
        reply = await ctl.request(StatsCommand("offsets"), 30.0)
        if not isinstance(reply, ResultReply) or reply.code != 200:
            raise ReplicaError(f"stats offsets on the master failed: {reply!r}")
        if self.config.auto_sync_master_config and self.apply_master_config is not None:
            await self._sync_config(ctl)
        return parse_offsets(reply.body)

    async def _sync_config(self, ctl: BrokerConnection) -> None:
        reply = await ctl.request(StatsCommand(""), 30.0)
        if not isinstance(reply, ResultReply) or reply.code != 200:
            return
        theirs = next(
            (ln.split()[1] for ln in parse_stats(reply.body) if ln.startswith("config_checksum ")),
            None,
        )
        if theirs is None or theirs == self._synced_checksum:
            return
        text = await ctl.request(StatsCommand("config"), 30.0)
        if isinstance(text, ResultReply) and text.code == 200 and self.apply_master_config:
            log.info(
                "slave %d: the master's configuration changed: copying it", self.config.slave_id
            )
            self.apply_master_config(text.body.decode("utf-8"))
            self._synced_checksum = theirs

    def _spawn(
        self,
        offsets: dict[Key, tuple[int, int]],
        data: BrokerConnection,
        tasks: dict[Key, asyncio.Task[None]],
        failed_at: dict[Key, float],
    ) -> None:
        now = time.monotonic()
        for key, (lo, hi) in offsets.items():
            if not self.replicated(*key):
                continue
            rep = self.replicas.get(key)
            if rep is None:
                rep = self.replicas[key] = PartitionReplica(
                    self.store,
                    key[0],
                    key[1],
                    self.config.slave_group,
                    fetch_size=self.fetch_size,
                    max_wait_ms=self.config.max_delay_ms,
                    master_min=lo,
                    master_max=hi,
                )
            rep.producers = self._sink
            rep.master_min = lo
            rep.master_max = max(rep.master_max, hi)
            if key in tasks or now - failed_at.get(key, -RETRY_S) < RETRY_S:
                continue
            tasks[key] = asyncio.get_running_loop().create_task(self._replicate(rep, data))

    async def _replicate(self, rep: PartitionReplica, data: BrokerConnection) -> None:
        try:
            await rep.run(data)
        except ReplicaError as e:
            rep.error = str(e)
            log.error("slave %d: %s-%d: %s", self.config.slave_id, rep.topic, rep.partition, e)
            raise
        except Exception as e:
            if isinstance(e, MetaClientError):
                raise
            rep.error = f"{type(e).__name__}: {e}"
            log.exception("slave %d: %s-%d failed", self.config.slave_id, rep.topic, rep.partition)
            raise ReplicaError(rep.error) from e

    def _reap(
        self,
        tasks: dict[Key, asyncio.Task[None]],
        failed_at: dict[Key, float],
        done: set[asyncio.Task[None]],
    ) -> None:
        for key, task in list(tasks.items()):
            if task not in done:
                continue
            del tasks[key]
            exc = task.exception()
            if isinstance(exc, MetaClientError):
                raise exc  # the connection: end the round, reconnect
            failed_at[key] = time.monotonic()
