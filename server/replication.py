"""The broker's side of replication: ``-Fmetaslave=...`` wiring and ``stats replication``.

A broker started with ``-Fmetaslave=async_slave.properties`` is an asynchronous slave
(:mod:`pymetaq.ha.slave`): it needs ZooKeeper (``zk.zkEnable=true``, to find its master at
``brokers/ids/<brokerId>/master``), registers as ``slave<slaveId>`` with topics as
``<brokerId>-s<slaveId>`` (:mod:`pymetaq.server.registry`), serves gets, and refuses puts
(403: they would put data at offsets the master owns).

``stats replication`` (pymetaq extension):

- on a slave, a head line ``slave_id <n> group <g> master <meta://...|-> state <s>`` then per
  partition ``<topic> part <p> offset <n> master_max_offset <n> lag_bytes <n> lag_seconds <s>
  state <following|waiting|error: ...>`` (:class:`pymetaq.ha.replica.ReplicaStatus`);
- on a master, per slave fetch group (groups named ``meta-slave-group...``, MetaQ's default
  slaveGroup) and partition, the ``stats lag`` line: ``<group> <topic> part <p> fetch_offset
  <n> max_offset <n> lag_bytes <n> lag_seconds <s> idle_seconds <s>``;
- on a samsa master, first a line for its gregor slave: ``gregor <host:port> state
  <connected|disconnected|unhealthy> form <bsync|sync> batches <n> failures <n>`` (``form``:
  what its batches are sent as; ``failures``: consecutive, towards
  slaveContinuousFailureThreshold).  A promoted master (automatic failover) shows the slave
  that rejoined it the same way (``catching-up`` while it is sent what it lacks), or
  ``gregor - state none form - batches 0 failures 0`` while it has none (it acknowledges
  alone then: server/rejoin.py).

With ``autoSyncMasterConfig=true`` the master's ``[topic=...]`` sections (from ``stats
config``) replace the slave's own in its server.ini (written to a temporary file and renamed;
``[system]`` and ``[zookeeper]`` stay the slave's) and the topics are reloaded.

Thread-safety: ``attach``/``close`` on the broker's loop; the ZooKeeper watch's callback runs
on kazoo's thread and only stores a string.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from typing import TYPE_CHECKING, Any

from pymetaq.ha.config import SLAVE_GROUP_PREFIX, SlaveConfig, merge_master_topics
from pymetaq.ha.failover import Promoter
from pymetaq.ha.rejoin import ends_of
from pymetaq.ha.slave import AsyncSlave
from pymetaq.ha.sync import SyncLink
from pymetaq.server.errors import ConfigError
from pymetaq.server.monitor.state import lag_line

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker

log = logging.getLogger("pymetaq.server")

REPLICATION_HELP = (
    "Returns the replication state: a slave's lag per partition, a master's slaves (pymetaq)."
)
GREGOR_PUT_REFUSED = (
    "broker {id} is a gregor slave (the synchronous replica of its samsa master): "
    "send messages to the master"
)
SLAVE_PUT_REFUSED = (
    "broker {id} is slave{sid} (an asynchronous replica of its master): "
    "send messages to the master, brokerId={id}"
)


def put_refusal(broker: Broker) -> str | None:
    """Why a client's put is refused here (a replica, or a fenced master), or None."""
    if broker.fenced is not None:
        return f"broker {broker.config.system.broker_id} is not accepting writes: {broker.fenced}"
    bid = broker.config.system.broker_id
    if broker.slave_config is not None:
        return SLAVE_PUT_REFUSED.format(id=bid, sid=broker.slave_config.slave_id)
    if broker.gregor:
        return GREGOR_PUT_REFUSED.format(id=bid)
    return None


def check_slave_config(broker_config: Any, slave: SlaveConfig) -> None:
    """A slave needs ZooKeeper to find its master (ConfigError otherwise)."""
    if not broker_config.zookeeper.enabled:
        raise ConfigError(
            f"-Fmetaslave={slave.path}: an asynchronous slave finds its master in ZooKeeper; "
            "set zk.zkEnable=true and zk.zkConnect in [zookeeper]"
        )


class MasterWatch:
    """The master's ``meta://`` address, kept current by a ZooKeeper data watch."""

    def __init__(self, client: Any, path: str) -> None:
        self.url: str | None = None
        self._watch = client.DataWatch(path, self._changed)

    def _changed(self, data: bytes | None, _stat: Any) -> None:
        self.url = data.decode("utf-8", "replace").strip() if data else None

    def __call__(self) -> str | None:
        return self.url


def start_slave(broker: Broker) -> AsyncSlave:
    """Start following the master (loop thread; the registry is running)."""
    slave_cfg = broker.slave_config
    assert slave_cfg is not None and broker.registry is not None
    registry = broker.registry
    watch = MasterWatch(registry.client, registry.paths.broker_master(registry.broker_id))

    def replicated(topic: str, partition: int) -> bool:
        tc = broker.config.topic_config(topic)
        return tc is not None and 0 <= partition < tc.num_partitions

    slave = AsyncSlave(
        slave_cfg,
        broker.store,
        master_url=watch,
        replicated=replicated,
        fetch_size=broker.config.system.max_transfer_size,
        apply_master_config=lambda text: apply_master_config(broker, text),
        producers=broker.dispatcher.appender.idempotence if broker.dispatcher else None,
    )
    slave.start()
    return slave


def apply_master_config(broker: Broker, master_text: str) -> None:
    """Take the master's ``[topic=...]`` sections into the slave's server.ini (its own
    ``[system]`` and ``[zookeeper]`` stay) and reload the topics."""
    path = broker.config.path
    if not path or path.startswith("<") or not os.path.isfile(path):
        log.warning("autoSyncMasterConfig: this broker runs without a config file; not copying")
        return
    try:
        with open(path, encoding="utf-8") as f:
            own = f.read()
    except OSError as e:
        log.error("autoSyncMasterConfig: cannot read %s: %s", path, e)
        return
    text = merge_master_topics(own, master_text)
    if text == own:
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".server.ini.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        log.error("autoSyncMasterConfig: cannot write %s: %s", path, e)
        return
    _applied, what = broker.reload_now()
    log.info("autoSyncMasterConfig: copied the master's configuration to %s: %s", path, what)


def slaves_text(broker: Broker, none: str) -> str:
    """``admin slaves``: the replication lines with a title (``none`` when there are none)."""
    lines = replication_lines(broker)
    if broker.slave_config is not None:
        sid, bid = broker.slave_config.slave_id, broker.config.system.broker_id
        return "\r\n".join([f"this broker is slave{sid} of brokerId {bid}", *lines])
    if not lines:
        return none
    return "\r\n".join(["slaves (one line per slave group and partition):", *lines])


def replication_lines(broker: Broker) -> list[str]:
    """``stats replication`` (see the module doc)."""
    if broker.slave is not None:
        lines: list[str] = broker.slave.status_lines()
        return lines
    dispatcher = broker.dispatcher
    if dispatcher is None:
        return []
    rows = dispatcher.monitor.lag_rows(broker.store.logs())
    lines = [lag_line(r) for r in rows if r.group.startswith(SLAVE_GROUP_PREFIX)]
    if broker.epoch is not None or broker.fenced is not None or broker.promoter is not None:
        lines.insert(0, failover_line(broker))
    link = broker.sync_link
    reattach = broker.reattach
    if link is not None:
        state = "unhealthy" if link.unhealthy else "connected" if link.connected else "disconnected"
    elif reattach is not None and reattach.link is not None:  # sending a rejoined slave its gap
        link, state = reattach.link, "catching-up"
    elif reattach is not None:  # a promoted master without a slave: it acknowledges alone
        lines.insert(0, "gregor - state none form - batches 0 failures 0")
    if link is not None:
        lines.insert(
            0,
            f"gregor {link.url} state {state} form {'bsync' if link.batched else 'sync'} "
            f"batches {link.batches} failures {link.failures}",
        )
    return lines


def start_sync_link(broker: Broker) -> SyncLink:
    """A samsa master's link to its gregor slave (loop thread); after
    ``slaveContinuousFailureThreshold`` failures the broker leaves ZooKeeper until the slave
    answers again (MetaQ's behaviour)."""
    assert broker.samsa is not None
    loop = asyncio.get_running_loop()

    def registry_call(name: str) -> None:
        registry = broker.registry
        if registry is not None:
            loop.run_in_executor(None, getattr(registry, name))

    link = SyncLink(
        broker.samsa,
        on_unhealthy=lambda: registry_call("suspend"),
        on_healthy=lambda: registry_call("resume"),
    )
    link.start()
    return link


def failover_line(broker: Broker) -> str:
    """``stats replication``'s failover line: ``epoch <n|-> state <master|fenced|gregor>
    master <meta://...|->`` (the master a gregor slave watches, or this broker's own)."""
    promoter = broker.promoter
    if broker.fenced is not None:
        state = "fenced"
    elif broker.gregor:
        state = "gregor"
    else:
        state = "master"
    seen = promoter.seen if promoter is not None and broker.gregor else None
    epoch = "-" if broker.epoch is None else str(broker.epoch)
    return f"epoch {epoch} state {state} master {seen or '-'}"


async def zk_client(broker: Broker) -> Any:
    """A started kazoo client for ``broker``'s ZooKeeper (:class:`RegistryError` if it does
    not answer)."""
    from pymetaq.client.cluster.session import kazoo_client, start_client
    from pymetaq.server.registry import RegistryError

    zk = broker.config.zookeeper
    client = kazoo_client(zk.connect, session_timeout_s=zk.session_timeout_ms / 1000)
    try:
        await asyncio.get_running_loop().run_in_executor(
            None, start_client, client, zk.connect, zk.connection_timeout_ms / 1000
        )
    except Exception as e:
        raise RegistryError(str(e)) from e
    return client


async def start_promoter(broker: Broker, client: Any = None) -> Promoter:
    """A gregor slave with ZooKeeper: watch the master; take over when it is gone
    (:mod:`pymetaq.ha.failover`).  :class:`RegistryError` if ZooKeeper does not answer."""
    from pymetaq.client.protocol.zk import ZkPaths, meta_url
    from pymetaq.server.registry import advertised_host

    if client is None:
        client = await zk_client(broker)
    loop = asyncio.get_running_loop()
    url = meta_url(advertised_host(broker.host), broker.port)

    def promoted(epoch: int) -> None:  # the promoter's thread
        loop.call_soon_threadsafe(_promote, broker, epoch)

    zk = broker.config.zookeeper
    bid = broker.config.system.broker_id
    promoter = Promoter(client, ZkPaths(zk.root), bid, url, broker.replica, promoted)
    promoter.start()
    return promoter


def stop_promoter(promoter: Promoter) -> None:
    promoter.stop()
    promoter.client.stop()
    promoter.client.close()


def _promote(broker: Broker, epoch: int) -> None:
    """(loop) The gregor slave becomes the master at ``epoch``: it takes puts from now on,
    refuses its old master's syncs, and registers as ``-m``."""
    if broker.dispatcher is not None:
        broker.dispatcher.appender.flush_all()  # syncs read but not yet appended
    broker.promoted_ends = ends_of(broker.store.logs())  # exactly what it got: the cut point
    broker.gregor = False
    broker.epoch = epoch
    broker.fenced = None
    broker.recover_offsets = True
    if broker.dispatcher is not None:
        broker.dispatcher.invalidate_logs()
    broker.promotion = asyncio.get_running_loop().create_task(_register_promoted(broker))


async def _register_promoted(broker: Broker) -> None:
    from pymetaq.server.registry import open_registry
    from pymetaq.server.rejoin import Reattach, record_promotion

    loop = asyncio.get_running_loop()
    assert broker.epoch is not None
    try:
        if broker.gregor_node is not None:  # it had rejoined a master: no longer its slave
            await loop.run_in_executor(None, broker.gregor_node.withdraw)
            broker.gregor_node = None
        args = (broker, broker.promoter.client, broker.epoch)
        await loop.run_in_executor(None, record_promotion, *args)
        broker.registry = await loop.run_in_executor(None, open_registry, broker)
        broker.reattach = Reattach(broker, broker.registry.client)
    except Exception:
        log.exception("failover: registering as the master failed")
