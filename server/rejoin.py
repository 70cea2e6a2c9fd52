"""The broker's side of a replaced master rejoining its successor (:mod:`pymetaq.ha.rejoin`).

The replaced master (:func:`rejoin`): found fenced while running (its registry saw the epoch
node name another replica) or at a restart (:class:`~pymetaq.server.registry.Replaced`).  It
leaves ZooKeeper and its own slave link, keeps refusing writes, reads the new master's log
ends at its promotion (``brokers/ids/<id>/epochs/<epoch>``, waiting for them), checks that
each partition lines up with the new master's at the cut, cuts every partition there
(:meth:`~pymetaq.storage.MessageStoreManager.truncate`, which counts and logs what it
discards), becomes a gregor slave watching the new master (failover in turn) and registers
``brokers/ids/<id>/gregor`` with its log ends.  If that node goes (the master dropped it:
see below) it is made again with the ends as they are then, after closing the connections its
master's syncs came on (so no late batch lands after the ends were read).

The promoted master (:class:`Reattach`): records its log ends at promotion, and watches
``brokers/ids/<id>/gregor``.  For a node it connects an ``aligned`` :class:`SyncLink` (8-token
``bsync``: each batch stored only at the master's offset), sends what the slave lacks from its
ends on (whole records, in chunks while the gap is large, then the rest and the switch in one step on the loop: no append comes between),
from then on acknowledges a put only once the slave confirmed it, and once the slave
confirmed everything names it ``insync`` in the epoch node.  Any failure of the link detaches
the slave: puts are refused (``500 Slave is disconnected``, MetaQ's reply) until ``insync``
is cleared in ZooKeeper, then acknowledged by the master alone (Kafka's default
``min.insync.replicas=1``), and the gregor node is deleted so the slave asks again.

Thread-safety: everything runs on the broker's loop; ZooKeeper calls go to the executor; the
ZooKeeper watches' callbacks only hand their data to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from pymetaq.client.protocol import GetCommand, ValueReply
from pymetaq.client.protocol.zk import ZkPaths, meta_url, parse_meta_url
from pymetaq.client.transport.connection import BrokerConnection
from pymetaq.ha.config import SamsaConfig
from pymetaq.ha.failover import epoch_path, read_epoch, set_insync
from pymetaq.ha.rejoin import (
    Ends,
    GregorNode,
    cut_point,
    decode_ends,
    encode_ends,
    ends_of,
    ends_path,
    gregor_path,
    record_ending_at,
    whole_records,
)
from pymetaq.ha.sync import BSYNC_MAX, SyncLink
from pymetaq.server.idempotence import next_piece

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker

log = logging.getLogger("pymetaq.server")

#: the gap left for the one-step switch (sent without yielding the loop)
SWITCH_BYTES = 256 * 1024
#: how long a replaced master waits for the new master's ends before it tries again
ENDS_WAIT_S = 30.0
#: the group of a rejoining master's few ``get``s on the new master
REJOIN_GROUP = "meta-rejoin"


class RejoinError(Exception):
    """This replica cannot follow the new master as it is (the message says why)."""


# -- the replaced master ---------------------------------------------------------------------


def replaced(broker: Broker, holder: str, epoch: int) -> None:
    """(any thread) Another replica is the master at ``epoch``: rejoin it (once)."""
    loop = broker.loop
    if loop is not None:
        loop.call_soon_threadsafe(_start, broker, holder, epoch)


def _start(broker: Broker, holder: str, epoch: int) -> None:
    if broker.rejoining is not None and not broker.rejoining.done():
        return
    broker.rejoining = asyncio.get_running_loop().create_task(rejoin(broker, holder, epoch))


async def rejoin(broker: Broker, holder: str, epoch: int) -> None:
    """(loop) Leave, cut, follow (see the module doc); retried every few seconds on a
    transient failure, given up (logged, still refusing writes) when the logs do not line up."""
    from pymetaq.server.replication import start_promoter, zk_client

    loop = asyncio.get_running_loop()
    registry, broker.registry = broker.registry, None
    if registry is not None:
        await loop.run_in_executor(None, registry.stop)
    link, broker.sync_link = broker.sync_link, None
    if broker.dispatcher is not None:
        broker.dispatcher.appender.replicator = None
    if link is not None:
        await link.close()
    log.warning("rejoin: %s is the master since epoch %d: following it as its slave", holder, epoch)
    while True:
        try:
            client = await zk_client(broker)
            try:
                ends = await loop.run_in_executor(None, _wait_ends, client, broker, epoch)
                await _cut(broker, holder, ends)
            except BaseException:
                await loop.run_in_executor(None, _stop_client, client)
                raise
            break
        except RejoinError as e:
            log.error("rejoin: cannot follow %s: %s; still refusing writes", holder, e)
            return
        except Exception as e:
            log.warning("rejoin: %r; trying again", e)
            await asyncio.sleep(2.0)
    broker.gregor = True
    broker.epoch = None
    broker.fenced = None
    broker.promoter = await start_promoter(broker, client)
    broker.gregor_node = GregorAnnouncer(broker, client)
    await broker.gregor_node.announce()


async def gregor_start(broker: Broker) -> None:
    """A gregor slave with ZooKeeper starting: it watches its master (failover); but when
    the master of its brokerId is a promoted one (the epoch node tracks ``insync``) and not
    this replica, it may hold a tail that master never had (it was the master before, or its
    slave): it rejoins first, cutting at that master's ends at its promotion."""
    from pymetaq.server.replication import start_promoter, zk_client

    client = await zk_client(broker)
    zk = broker.config.zookeeper
    path = epoch_path(ZkPaths(zk.root), broker.config.system.broker_id)
    loop = asyncio.get_running_loop()
    try:
        found = await loop.run_in_executor(None, read_epoch, client, path)
    except Exception:
        await loop.run_in_executor(None, _stop_client, client)
        raise
    if found is not None and found[0].insync is not None and found[0].replica != broker.replica:
        await loop.run_in_executor(None, _stop_client, client)
        current = found[0]
        broker.gregor = False  # not before it has cut and asked to be followed
        broker.set_fenced(
            f"brokerId {broker.config.system.broker_id}'s master is {current.master} since "
            f"epoch {current.epoch}: this broker rejoins it as its slave"
        )
        broker.replaced(current.master, current.epoch)
        return
    if found is not None and found[0].insync is not None:  # it is the promoted master
        log.warning(
            "this broker is the master of brokerId %d since epoch %d (promoted before it "
            "stopped): serving as the master, not as a gregor slave",
            broker.config.system.broker_id,
            found[0].epoch,
        )
        await loop.run_in_executor(None, _stop_client, client)
        await resume_as_master(broker, found[0].epoch)
        return
    broker.promoter = await start_promoter(broker, client)


async def resume_as_master(broker: Broker, epoch: int) -> None:
    """A promoted master started again: register as the master at its epoch (its promotion's
    ends and the consumer offsets were recorded and mapped when it was promoted)."""
    from pymetaq.server.registry import open_registry

    broker.gregor = False
    broker.epoch = epoch
    loop = asyncio.get_running_loop()
    broker.registry = await loop.run_in_executor(None, open_registry, broker)
    broker.reattach = Reattach(broker, broker.registry.client)


def _stop_client(client: Any) -> None:
    client.stop()
    client.close()


def _wait_ends(client: Any, broker: Broker, epoch: int) -> Ends:
    """The new master's log ends at ``epoch`` (blocking; it writes them before registering)."""
    from kazoo.exceptions import NoNodeError

    zk = broker.config.zookeeper
    path = ends_path(ZkPaths(zk.root), broker.config.system.broker_id, epoch)
    event = threading.Event()
    while True:
        try:
            raw, _ = client.get(path)
        except NoNodeError:
            if client.exists(path, watch=lambda _e: event.set()) is None:
                if not event.wait(ENDS_WAIT_S):  # bounded: the caller tries again
                    raise TimeoutError(f"{path} did not appear within {ENDS_WAIT_S:g} s") from None
                event.clear()
            continue
        try:
            return decode_ends(json.loads(raw))
        except ValueError as e:
            raise RejoinError(f"{path}: {e}") from e


async def _cut(broker: Broker, holder: str, ends: Ends) -> None:
    """Check every partition lines up with ``holder`` at its cut, then cut them all."""
    store, dispatcher = broker.store, broker.dispatcher
    cuts = {(p.topic, p.partition): cut_point(p, ends) for p in store.logs()}
    host, port = parse_meta_url(holder)
    conn = await BrokerConnection.open(host, port)
    try:
        for plog in store.logs():
            cut = cuts[(plog.topic, plog.partition)]
            if cut > plog.min_offset:
                await _check_lines_up(conn, plog, cut)
    finally:
        conn.close()
    if dispatcher is not None:
        dispatcher.longpoll.expire_all()  # waiting gets hold the logs about to be reopened
    for (topic, part), cut in sorted(cuts.items()):
        report = store.truncate(topic, part, cut)
        log.info(
            "rejoin: %s-%d cut at %d (the new master's end at its promotion): %d record(s), "
            "%d byte(s) it never received discarded",
            topic,
            part,
            cut,
            report.records,
            report.bytes,
        )
    if dispatcher is not None:
        dispatcher.invalidate_logs()


async def _check_lines_up(conn: BrokerConnection, plog: Any, cut: int) -> None:
    found = await asyncio.get_running_loop().run_in_executor(None, record_ending_at, plog, cut)
    where = f"{plog.topic}-{plog.partition}"
    if found is None:
        raise RejoinError(
            f"{where}: {cut} is not a record boundary here: the two logs do not line up "
            "(remove this broker's data directory and start it with -Fgregor)"
        )
    offset, record = found
    cmd = GetCommand(plog.topic, REJOIN_GROUP, plog.partition, offset, max(len(record), 64))
    reply = await conn.request(cmd, 30.0)
    if not isinstance(reply, ValueReply) or bytes(reply.data[: len(record)]) != record:
        raise RejoinError(
            f"{where}: the record ending at {cut} differs from the new master's: the two logs "
            "do not line up (remove this broker's data directory and start it with -Fgregor)"
        )


class GregorAnnouncer:
    """Keeps ``brokers/ids/<id>/gregor`` present with this slave's current log ends."""

    def __init__(self, broker: Broker, client: Any) -> None:
        self.broker = broker
        self.client = client
        zk = broker.config.zookeeper
        self.path = gregor_path(ZkPaths(zk.root), broker.config.system.broker_id)
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self._busy = False

    async def announce(self) -> None:
        """(loop) Drop the connections syncs came on, read the ends, make the node."""
        if self.closed or self._busy:
            return
        self._busy = True
        try:
            dispatcher = self.broker.dispatcher
            if dispatcher is not None:
                for conn in list(dispatcher.sync_peers):
                    if conn.transport is not None:
                        conn.transport.abort()
                dispatcher.sync_peers.clear()
            await asyncio.sleep(0)  # whatever they had delivered is appended by now
            url = meta_url(_advertised(self.broker), self.broker.port)
            node = GregorNode(url, self.broker.replica, ends_of(self.broker.store.logs()))
            await self.loop.run_in_executor(None, self._make, node.encode())
        finally:
            self._busy = False

    def _make(self, value: bytes) -> None:
        from kazoo.exceptions import NodeExistsError

        try:
            self.client.create(self.path, value, ephemeral=True, makepath=True)
        except NodeExistsError:
            self.client.set(self.path, value)
        self.client.DataWatch(self.path, self._changed)
        log.info("rejoin: asked the master to follow it (%s)", self.path)

    def _changed(self, data: bytes | None, _stat: Any) -> bool | None:
        if self.closed:
            return False  # kazoo: stop watching
        if data is None and self.broker.gregor:
            asyncio.run_coroutine_threadsafe(self.announce(), self.loop)
            return False  # announce() sets a new watch
        return None

    def close(self) -> None:
        self.closed = True

    def withdraw(self) -> None:
        """(executor) Stop announcing and delete the node (this broker was promoted)."""
        from kazoo.exceptions import NoNodeError

        self.closed = True
        with contextlib.suppress(NoNodeError):
            self.client.delete(self.path)


def _advertised(broker: Broker) -> str:
    from pymetaq.server.registry import advertised_host

    return advertised_host(broker.host)


# -- the promoted master ---------------------------------------------------------------------


def record_promotion(broker: Broker, client: Any, epoch: int) -> None:
    """(executor) Write the log ends the broker had when it was promoted (``broker.
    promoted_ends``, taken on the loop) as ``brokers/ids/<id>/epochs/<epoch>``."""
    zk = broker.config.zookeeper
    path = ends_path(ZkPaths(zk.root), broker.config.system.broker_id, epoch)
    value = json.dumps(encode_ends(broker.promoted_ends), separators=(",", ":")).encode()
    from kazoo.exceptions import NodeExistsError

    try:
        client.create(path, value, makepath=True)
    except NodeExistsError:
        client.set(path, value)


class Reattach:
    """A promoted master taking a rejoining replica as its synchronous slave."""

    def __init__(self, broker: Broker, client: Any) -> None:
        self.broker = broker
        self.client = client
        self.loop = asyncio.get_running_loop()
        zk = broker.config.zookeeper
        bid = broker.config.system.broker_id
        self.path = gregor_path(ZkPaths(zk.root), bid)
        self.epoch_path = epoch_path(ZkPaths(zk.root), bid)
        self.node: GregorNode | None = None
        self.link: SyncLink | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        client.DataWatch(self.path, self._changed)

    def _changed(self, data: bytes | None, _stat: Any) -> bool | None:
        if self.closed:
            return False
        self.loop.call_soon_threadsafe(self._node, data)
        return None

    def _node(self, data: bytes | None) -> None:
        if self.closed:
            return
        node = None
        if data is not None:
            try:
                node = GregorNode.decode(data)
            except ValueError as e:
                log.error("rejoin: %s: %s", self.path, e)
        if node is not None and node.replica == self.broker.replica:
            node = None  # its own, from when it was the slave (deleted at its promotion)
        if node == self.node:
            return
        self.node = node
        if self.task is not None:
            self.task.cancel()
        self.task = self.loop.create_task(self._follow(node))

    async def _follow(self, node: GregorNode | None) -> None:
        await self._detach("its slave asked again" if node is not None else "its slave left")
        if node is None:
            return
        try:
            await self._attach(node)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.error("rejoin: cannot take %s as the slave: %s", node.url, e)
            await self._detach(str(e))

    async def _attach(self, node: GregorNode) -> None:
        host, port = parse_meta_url(node.url)
        cfg = SamsaConfig(host, port, failure_threshold=1)
        link = self.link = SyncLink(cfg, on_unhealthy=self._unhealthy, aligned=True)
        link.start()
        async with asyncio.timeout(30.0):
            await link.detected.wait()
        if not link.batched:
            raise RejoinError(f"{node.url} is not a pymetaq broker (no bsync)")
        sent = self._starts(node)
        while sum(self._gap(sent).values()) > SWITCH_BYTES:
            for key in self._gap(sent):
                await self._push(link, key, sent)
        futures = []
        self._starts(node, sent)  # the switch: no await from here to the replicator
        for key in self._gap(sent):
            while (fut := self._push_now(link, key, sent)) is not None:
                futures.append(fut)
        self.broker.sync_link = link
        if self.broker.dispatcher is not None:
            self.broker.dispatcher.appender.replicator = link
        log.info("rejoin: %s follows this master; sending it %d batch(es)", node.url, len(futures))
        for fut in futures:
            await fut
        epoch = self.broker.epoch
        assert epoch is not None
        args = (self.client, self.epoch_path, self.broker.replica, epoch, node.replica)
        if await self.loop.run_in_executor(None, set_insync, *args):
            log.warning("rejoin: %s holds everything: it is the in-sync slave", node.url)

    def _starts(
        self, node: GregorNode, sent: dict[tuple[str, int], int] | None = None
    ) -> dict[tuple[str, int], int]:
        """Where the slave's log ends, per partition of ours (RejoinError if it cannot
        continue one: it is ahead, or behind what retention kept); ``sent``: the partitions
        already being sent (a partition created meanwhile is added)."""
        sent = {} if sent is None else sent
        for plog in self.broker.store.logs():
            key = (plog.topic, plog.partition)
            if key in sent:
                continue
            start = node.ends.get(key, 0)
            if not plog.min_offset <= start <= plog.write_offset:
                raise RejoinError(
                    f"{plog.topic}-{plog.partition}: the slave ends at {start}, this log holds "
                    f"{plog.min_offset}..{plog.write_offset}"
                )
            sent[key] = start
        for key, end in node.ends.items():
            if key not in sent and end:
                raise RejoinError(f"{key[0]}-{key[1]}: the slave has data this broker lacks")
        return sent

    def _gap(self, sent: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        store = self.broker.store
        out = {}
        for key, start in sent.items():
            plog = store.get_log(*key, create=False)
            if plog is not None and plog.write_offset > start:
                out[key] = plog.write_offset - start
        return out

    async def _push(
        self, link: SyncLink, key: tuple[str, int], sent: dict[tuple[str, int], int]
    ) -> None:
        fut = self._push_now(link, key, sent)
        if fut is not None:
            await fut

    def _push_now(
        self, link: SyncLink, key: tuple[str, int], sent: dict[tuple[str, int], int]
    ) -> asyncio.Future[None] | None:
        plog = self.broker.store.get_log(*key, create=False)
        start = sent[key]
        if plog is None or start >= plog.write_offset:
            return None
        data = plog.read_written(start, BSYNC_MAX)
        if not (n := whole_records(data)):
            raise RejoinError(f"{key[0]}-{key[1]}: no whole record at {start}")
        dispatcher = self.broker.dispatcher  # an idempotent batch goes alone, with its producer
        idem = dispatcher.appender.idempotence.known(plog) if dispatcher else None
        n, producer = next_piece(idem, start, n, BSYNC_MAX)
        sent[key] = start + n
        return link.replicate(key[0], key[1], data[:n], start, producer)

    def _unhealthy(self) -> None:
        if self.link is not None and not self.closed:
            self.loop.create_task(self._detach("the link to the slave failed"))

    async def _detach(self, why: str) -> None:
        link, self.link = self.link, None
        if link is None:
            return
        await link.close()  # puts now get 500 "Slave is disconnected" until the next lines
        epoch = self.broker.epoch
        if epoch is not None:
            args = (self.client, self.epoch_path, self.broker.replica, epoch, "")
            with contextlib.suppress(Exception):
                await self.loop.run_in_executor(None, set_insync, *args)
        if self.broker.sync_link is link:
            self.broker.sync_link = None
            if self.broker.dispatcher is not None:
                self.broker.dispatcher.appender.replicator = None
        log.warning("rejoin: the slave is detached (%s): acknowledging alone", why)
        if why != "its slave asked again" and self.node is not None:
            self.node = None
            with contextlib.suppress(Exception):
                await self.loop.run_in_executor(None, self._drop_node)

    def _drop_node(self) -> None:
        from kazoo.exceptions import NoNodeError

        with contextlib.suppress(NoNodeError):
            self.client.delete(self.path)

    async def close(self) -> None:
        self.closed = True
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        link, self.link = self.link, None
        if link is not None:
            await link.close()
