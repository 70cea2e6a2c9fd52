"""The broker's registration in ZooKeeper (MetaQ's ``BrokerZooKeeper``), ``zk.zkEnable=true``.

What a master broker ``<id>`` at ``meta://host:port`` keeps registered, under ``zk.zkRoot``
(layout and values: :mod:`pymetaq.client.protocol.zk`):

| node                                        | kind       | value                          |
|---------------------------------------------|------------|--------------------------------|
| ``brokers/ids/<id>``                        | persistent | ``meta://host:port`` (blank    |
|                                             |            | after a clean stop)            |
| ``brokers/ids/<id>/master``                 | ephemeral  | ``meta://host:port``           |
| ``brokers/ids/<id>/master_config_checksum`` | ephemeral  | CRC32 of server.ini, decimal   |
| ``brokers/topics/<t>/<id>-m``               | ephemeral  | numPartitions, decimal         |
| ``brokers/topics-pub/<t>/<id>-m``           | ephemeral  | ``{"numParts":N,"broker":      |
|                                             |            | "<id>-m"}`` if acceptPublish   |
| ``brokers/topics-sub/<t>/<id>-m``           | ephemeral  | same, if acceptSubscribe       |

An asynchronous slave (``-Fmetaslave``, ``slave_id=n``) registers ``brokers/ids/<id>/slave<n>``
instead of ``master``, its topics as ``<id>-s<n>``, and neither the parent's data nor the
checksum node (MetaQ's slave).  :meth:`BrokerRegistry.suspend` / :meth:`resume` take a samsa
master out of ZooKeeper while its slave keeps failing, and back.

Topics: every configured (non-pattern) topic, every topic with a store on disk at startup, and
each topic matching a pattern section when its store is created (first put:
:meth:`BrokerRegistry.add_topic`, called by the dispatcher).  :meth:`BrokerRegistry.reload`
(config reload) recomputes the set: new topics appear, removed ones and ones that stopped
accepting publish/subscribe disappear, changed counts and the checksum are rewritten.

The registration is a *desired state* reconciled on the registry's thread whenever something
changes: the session (a new session after expiry re-creates everything), a node of ours being
deleted, the topic set.  A node held by another session is not touched: if it is our own
master node from a previous run of this broker (same address: a crash and a quick restart),
the registration completes when that session expires (a watch on the node); if the master
node names another address and is still there one session timeout later, another broker has
this id: :meth:`start` raises :class:`RegistryConflict` and the broker refuses to start.

Stop (:meth:`BrokerRegistry.stop`): delete our ephemeral nodes, blank the parent's data and
close the session; the broker then waits ``zk.zkSyncTimeMs`` (still serving) before it stops
accepting connections and closes its stores, so clients move away first.

Thread-safety: ``add_topic`` is non-blocking and may be called from the broker's loop thread;
``start``/``reload``/``stop`` from any one thread at a time; ZooKeeper work runs on the
registry's thread (``start`` does the first reconciliation itself).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pymetaq.client.cluster.session import (
    RefreshLoop,
    delete_if_owned,
    kazoo_client,
    negotiated_timeout_s,
    session_id,
)
from pymetaq.client.protocol.zk import (
    TopicBroker,
    ZkPaths,
    broker_node_name,
    encode_partition_count,
    meta_url,
)
from pymetaq.ha.failover import Fenced, claim_as_master, epoch_path, mark_stopped
from pymetaq.server.config import BrokerConfig
from pymetaq.server.errors import ServerError

log = logging.getLogger("pymetaq.server")


class RegistryError(ServerError):
    """ZooKeeper registration failed at startup (unreachable, or a conflict)."""

    retriable = True


class RegistryConflict(RegistryError):
    """Another live broker is registered with this broker's id and role."""

    retriable = False

    def __init__(self, message: str, holder: str = "") -> None:
        super().__init__(message)
        self.holder = holder  # the address registered by the other broker


class Replaced(RegistryConflict):
    """A samsa master starting finds that another replica took over its brokerId (automatic
    failover): it is not its master any more; it rejoins as its slave (server/rejoin.py)."""

    def __init__(self, message: str, holder: str, epoch: int) -> None:
        super().__init__(message, holder)
        self.epoch = epoch


@dataclass(frozen=True)
class TopicEntry:
    topic: str
    num_partitions: int
    accept_publish: bool
    accept_subscribe: bool


def broker_nodes(
    paths: ZkPaths,
    broker_id: int,
    url: str,
    checksum: int,
    topics: Iterable[TopicEntry],
    slave_id: int | None = None,
    tls_url: str = "",
) -> dict[str, bytes]:
    """The ephemeral nodes (path -> value) a broker keeps registered (pure): a master's, or
    with ``slave_id`` a slave's (``slave<n>``, topics as ``<id>-s<n>``, no checksum node); a
    master with a TLS listener also ``master_tls`` (pymetaq, for zk:// clients with TLS options)."""
    me = broker_node_name(broker_id, slave_id)
    if slave_id is None:
        nodes = {
            paths.broker_master(broker_id): url.encode(),
            paths.broker_checksum(broker_id): str(checksum).encode(),
        }
        if tls_url:
            nodes[paths.broker_master_tls(broker_id)] = tls_url.encode()
    else:
        nodes = {paths.broker_slave(broker_id, slave_id): url.encode()}
    for t in topics:
        nodes[paths.topic_legacy(t.topic, me)] = encode_partition_count(t.num_partitions)
        value = TopicBroker(t.num_partitions, me).encode()
        if t.accept_publish:
            nodes[paths.topic_pub(t.topic, me)] = value
        if t.accept_subscribe:
            nodes[paths.topic_sub(t.topic, me)] = value
    return nodes


def advertised_host(host: str) -> str:
    """The host put in ``meta://``: the listen host, or for a wildcard listen address the
    first non-loopback IPv4 address (MetaQ's default), else 127.0.0.1."""
    if host not in ("", "0.0.0.0", "::"):
        return host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: picks the outgoing interface
            addr = str(s.getsockname()[0])
            return addr if not addr.startswith("127.") else "127.0.0.1"
    except OSError:
        return "127.0.0.1"


class BrokerRegistry:
    """Keeps one master broker registered (see the module docstring)."""

    def __init__(
        self,
        config: Callable[[], BrokerConfig],
        host: str,
        port: int,
        *,
        stored_topics: Iterable[str] = (),
        client: Any = None,
        slave_id: int | None = None,
        tls_port: int = -1,
        epoch: int | None = None,
        claim: bool = False,
        replica: str = "",
        before_register: Callable[[Any], None] | None = None,
        on_fence: Callable[[str | None], None] = lambda why: None,
        on_replaced: Callable[[str, int], None] = lambda holder, epoch: None,
    ) -> None:
        self._config = config
        cfg = config()
        zk = cfg.zookeeper
        self.broker_id = cfg.system.broker_id
        self.slave_id = slave_id  # None: a master; n: the async slave ``slave<n>``
        self.url = meta_url(advertised_host(host), port)
        self.tls_url = (
            "meta+tls" + meta_url(advertised_host(host), tls_port)[len("meta") :]
            if tls_port > 0
            else ""
        )
        self.paths = ZkPaths(zk.root)
        self.hosts = zk.connect
        self._owns_client = client is None
        self.client = client or kazoo_client(
            zk.connect, session_timeout_s=zk.session_timeout_ms / 1000
        )
        self._connect_timeout_s = zk.connection_timeout_ms / 1000
        self._lock = threading.Lock()
        self._dynamic: set[str] = {t for t in stored_topics if cfg.topic_config(t) is not None}
        self._held: set[str] = set()  # ephemeral paths we created in the current session
        self._session: int | None = None
        self._waiting_logged: set[str] = set()
        self._suspended = False
        #: automatic failover (pymetaq.ha.failover): ``claim`` = a samsa master claims the
        #: epoch at start; with an epoch the master registers only while the epoch node still
        #: names it, and ``on_fence(why)`` / ``on_fence(None)`` says when it may not / may write
        self.claim = claim
        self.epoch = epoch
        self.replica = replica
        #: run with the started client before the first registration (recoverOffset)
        self.before_register = before_register
        self.epoch_path = epoch_path(self.paths, self.broker_id)
        self.on_fence = on_fence
        #: ``on_replaced(master, epoch)``: another replica holds the epoch (it rejoins)
        self.on_replaced = on_replaced
        self._loop = RefreshLoop(
            f"pymetaq-registry-{self.broker_id}",
            self._reconcile,
            retry_delay_s=max(0.1, zk.sync_time_ms / 1000),
        )

    # -- API ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect and register; :class:`RegistryError` if ZooKeeper does not answer within
        zk.zkConnectionTimeoutMs, :class:`RegistryConflict` if the id is taken."""
        if self._owns_client:
            try:
                self.client.start(timeout=self._connect_timeout_s)
            except Exception as e:
                self.client.close()
                raise RegistryError(
                    f"cannot connect to ZooKeeper at {self.hosts} (zk.zkConnect) within "
                    f"{self._connect_timeout_s:g} s: {e}"
                ) from e
        try:
            if self.claim:
                self.epoch = claim_as_master(self.client, self.epoch_path, self.url, self.replica)
        except Fenced as e:
            self._close_client()
            raise Replaced(str(e), e.holder, e.epoch) from e
        if self.before_register is not None:
            try:
                self.before_register(self.client)
            except Exception:
                self._close_client()
                raise
        self.client.add_listener(self._state)
        try:
            self._first_reconcile()
        except RegistryConflict:
            self.client.remove_listener(self._state)
            self._close_client()
            raise
        self._loop.start()
        log.info(
            "registered broker %d as %s in ZooKeeper %s%s",
            self.broker_id,
            self.url,
            self.hosts,
            self.paths.root or "/",
        )
        if not self._config().system.host_name and "://127." in self.url:
            log.warning(
                "broker %d is registered at the loopback address %s: clients on other "
                "machines cannot reach it; set [system] hostName to an address they can",
                self.broker_id,
                self.url,
            )

    def _first_reconcile(self) -> None:
        """Register, giving a conflicting master registration one session timeout to expire
        (a crashed previous run of this broker listening on another port)."""
        grace = negotiated_timeout_s(self.client) + 1.0
        deadline = time.monotonic() + grace
        while True:
            try:
                self._reconcile()
                return
            except RegistryConflict as e:
                if time.monotonic() >= deadline:
                    raise
                if not self._waiting_logged:
                    self._waiting_logged.add("conflict")
                    log.warning(
                        "brokerId=%d is registered as master at %s by another ZooKeeper "
                        "session; waiting up to %.1f s in case it is a crashed previous run of "
                        "this broker whose session has not expired yet",
                        self.broker_id,
                        e.holder,
                        grace,
                    )
                time.sleep(0.1)
            except Exception as e:  # a transient failure: the thread retries
                log.warning("ZooKeeper registration incomplete (%r); retrying", e)
                return

    def add_topic(self, topic: str) -> None:
        """Register ``topic`` (a pattern topic's store was just created); cheap if known."""
        if topic in self._dynamic:
            return
        with self._lock:
            self._dynamic.add(topic)
        self._loop.wake()

    def reload(self) -> None:
        """The configuration changed: register what it says now."""
        self._loop.wake()

    def suspend(self) -> None:
        """Leave ZooKeeper (delete our ephemeral nodes) until :meth:`resume`: a samsa master
        whose slave keeps failing (MetaQ's behaviour); the session stays open."""
        from kazoo.exceptions import KazooException

        with self._lock:
            self._suspended = True
        sid = session_id(self.client)
        try:
            if self.epoch is not None:  # its slave must not take over meanwhile
                mark_stopped(self.client, self.epoch_path, self.replica, self.epoch)
            for path in sorted(self._held, reverse=True):
                self._delete_if_ours(path, sid)
        except KazooException as e:
            log.warning("ZooKeeper unregistration incomplete (%r)", e)
        log.warning("broker %d left ZooKeeper until its slave answers again", self.broker_id)

    def resume(self) -> None:
        """Register again after :meth:`suspend`."""
        with self._lock:
            self._suspended = False
        self._loop.wake()
        log.info("broker %d registers in ZooKeeper again", self.broker_id)

    def registered(self) -> set[str]:
        """The ephemeral paths this broker holds now (tests, observability)."""
        with self._lock:
            return set(self._held)

    def stop(self) -> None:
        """Unregister (ephemeral nodes deleted, parent data blanked) and close the session."""
        from kazoo.exceptions import KazooException, NoNodeError

        self._loop.stop()
        self.client.remove_listener(self._state)
        sid = session_id(self.client)
        try:
            if self.epoch is not None:  # a planned stop: the slave does not take over
                mark_stopped(self.client, self.epoch_path, self.replica, self.epoch)
            for path in sorted(self._held, reverse=True):
                self._delete_if_ours(path, sid)
            if self.slave_id is None:
                self.client.set(self.paths.broker(self.broker_id), b"")
        except NoNodeError:
            pass
        except KazooException as e:
            log.warning("ZooKeeper unregistration incomplete (%r): the session close ends it", e)
        self._close_client()
        log.info("unregistered broker %d from ZooKeeper", self.broker_id)

    # -- reconciliation (registry thread, and start()) -----------------------------------------
    def _desired(self) -> dict[str, bytes]:
        cfg = self._config()
        with self._lock:
            dynamic = set(self._dynamic)
        names = {tc.name for tc in cfg.topics if not tc.is_pattern} | dynamic
        entries = []
        for name in sorted(names):
            tc = cfg.topic_config(name)
            if tc is not None:
                entries.append(
                    TopicEntry(name, tc.num_partitions, tc.accept_publish, tc.accept_subscribe)
                )
        return broker_nodes(
            self.paths, self.broker_id, self.url, cfg.checksum, entries, self.slave_id, self.tls_url
        )

    @property
    def role_path(self) -> str:
        """``brokers/ids/<id>/master``, or ``.../slave<n>`` for a slave."""
        if self.slave_id is None:
            return self.paths.broker_master(self.broker_id)
        return self.paths.broker_slave(self.broker_id, self.slave_id)

    def _state(self, state: str) -> None:
        """kazoo's state listener: a lost session unconfirms the epoch until reconciled."""
        if state == "LOST" and self.epoch is not None:
            self.on_fence(
                "its ZooKeeper session expired: not a master until it has confirmed its epoch"
            )
        self._loop.wake()

    def _reconcile(self) -> float | None:
        if self._suspended or not self.client.connected:
            return None  # the CONNECTED listener wakes us
        sid = session_id(self.client)
        if sid != self._session:
            with self._lock:
                self._session, self._held = sid, set()
        if self.epoch is not None and not self._epoch_held(sid):
            return None  # replaced: stay out (the broker refuses writes)
        master = self.role_path
        if not self._ensure(master, self.url.encode(), sid):
            return self._loop.retry_delay_s  # held by a previous session: touch nothing else
        if self.epoch is not None and not self._epoch_held(sid, unmark=True):
            return None  # replaced meanwhile
        if self.slave_id is None:  # the parent's data is the master's (MetaQ's old clients)
            self._set_parent()
        desired = self._desired()
        waiting = False
        for path, value in desired.items():
            if path != master:
                waiting |= not self._ensure(path, value, sid)
        for path in sorted(self._held - set(desired)):
            self._delete_if_ours(path, sid)
        return self._loop.retry_delay_s if waiting else None

    def _epoch_held(self, sid: int | None, *, unmark: bool = False) -> bool:
        """Confirm the epoch names this broker (``unmark``: and clear a ``stopped`` mark, once
        the master node is ours); if another broker holds it, fence this one and drop its
        nodes."""
        assert self.epoch is not None
        try:
            epoch = claim_as_master(
                self.client, self.epoch_path, self.url, self.replica, keep_stopped=not unmark
            )
        except Fenced as e:
            why = (
                f"brokerId {self.broker_id}'s master is {e.holder} since epoch {e.epoch} "
                f"(this broker at {self.url} had epoch {self.epoch}): it was replaced"
            )
            self.on_fence(why)
            log.error("fenced: %s; not registering", why)
            for path in sorted(self._held, reverse=True):
                self._delete_if_ours(path, sid)
            self.on_replaced(e.holder, e.epoch)
            return False
        if epoch != self.epoch:  # the node was removed by hand and made again
            log.warning("epoch node %s re-created: now epoch %d", self.epoch_path, epoch)
            self.epoch = epoch
        self.on_fence(None)
        return True

    def _set_parent(self) -> None:
        path = self.paths.broker(self.broker_id)
        self.client.ensure_path(path)
        data, _ = self.client.get(path)
        if data != self.url.encode():
            self.client.set(path, self.url.encode())

    def _ensure(self, path: str, value: bytes, sid: int | None) -> bool:
        """Make ``path`` an ephemeral of our session holding ``value``; False if another
        session holds it (a watch then wakes us when it goes)."""
        from kazoo.exceptions import NodeExistsError, NoNodeError

        for _ in range(3):
            if self._suspended:  # suspend() ran meanwhile: create nothing more
                return False
            try:
                self.client.create(path, value, ephemeral=True, makepath=True)
                break
            except NodeExistsError:
                try:
                    data, stat = self.client.get(path, watch=self._loop.wake)
                except NoNodeError:
                    continue
                if stat.ephemeralOwner != sid:
                    self._foreign(path, data, stat.ephemeralOwner)
                    return False
                if data != value:
                    self.client.set(path, value, version=stat.version)
                break
        else:
            return False
        with self._lock:
            self._held.add(path)
        self._waiting_logged.discard(path)
        return True

    def _foreign(self, path: str, data: bytes, owner: int) -> None:
        if path == self.role_path and data != self.url.encode():
            holder = data.decode("utf-8", "replace")
            role = "master" if self.slave_id is None else f"slave{self.slave_id}"
            raise RegistryConflict(
                f"another broker is registered with brokerId={self.broker_id} as {role} at "
                f"{holder} ({path}, ZooKeeper session 0x{owner:x}); "
                "give each broker its own brokerId, or stop the other one",
                holder,
            )
        if path not in self._waiting_logged:
            self._waiting_logged.add(path)
            log.warning(
                "%s is still held by ZooKeeper session 0x%x (a previous run of this broker?); "
                "registering it when that session expires",
                path,
                owner,
            )

    def _delete_if_ours(self, path: str, sid: int | None) -> None:
        delete_if_owned(self.client, path, sid)
        with self._lock:
            self._held.discard(path)

    def _close_client(self) -> None:
        if self._owns_client:
            try:
                self.client.stop()
            finally:
                self.client.close()


def open_registry(broker: Any) -> BrokerRegistry | None:
    """The registry for a running broker, started; None when ``zk.zkEnable=false`` (then
    kazoo is never imported)."""
    if not broker.config.zookeeper.enabled:
        return None
    slave = getattr(broker, "slave_config", None)
    registry = BrokerRegistry(
        lambda: broker.config,
        broker.host,
        broker.port,
        stored_topics=broker.store.topics(),
        slave_id=None if slave is None else slave.slave_id,
        tls_port=broker.tls_port,
        epoch=getattr(broker, "epoch", None),
        claim=getattr(broker, "samsa", None) is not None,
        replica=getattr(broker, "replica", ""),
        before_register=_recover_offsets(broker)
        if getattr(broker, "recover_offsets", False)
        else None,
        on_fence=getattr(broker, "set_fenced", lambda why: None),
        on_replaced=getattr(broker, "replaced", lambda holder, epoch: None),
    )
    registry.start()
    return registry


def _recover_offsets(broker: Any) -> Callable[[Any], None]:
    """MetaQ's recoverOffset for ``broker`` (:mod:`pymetaq.ha.recover`), as a registry hook."""
    from pymetaq.ha.recover import recover_offsets

    cfg = broker.config

    def run(client: Any) -> None:
        done = recover_offsets(
            client, ZkPaths(cfg.zookeeper.root), cfg.system.broker_id, broker.store.logs()
        )
        log.info("recoverOffset: %d consumer offset(s) mapped by msgId", len(done))

    return run
