"""Automatic failover of a synchronous pair through ZooKeeper (pymetaq, beyond MetaQ): the epoch.

One persistent node per brokerId, ``brokers/ids/<id>/epoch`` (under ``zk.zkRoot``), holds
JSON ``{"epoch": <n>, "master": "meta://host:port", "replica": "<id>", "stopped": <bool>}``:
which broker may be the master of that id, and since which promotion (MetaQ's clients read
only the ``master`` and ``slave<n>`` children, so they ignore it).  A broker is known by its
*replica id*, a random id kept in ``<dataPath>/.replica_id`` (:func:`replica_id`): its data,
not its address, is what was or was not replicated, and a restart may change its port.

- a samsa master starting with ZooKeeper (:func:`claim_as_master`) creates epoch 1 naming
  itself, or finds itself named (and clears ``stopped``, updates its address); a node naming
  another replica means this one was replaced: :class:`Fenced`, it must not serve as master;
- while it runs, its registration is made only while the node still names it (claimed again
  whenever it reconciles, e.g. after its ZooKeeper session changed): a master that lost its
  session is not a master until it has confirmed that, and one that was replaced stays out;
- a clean stop marks ``stopped`` (:func:`mark_stopped`) before the master's nodes go, so its
  slave does not take over for a planned restart; so does a master leaving ZooKeeper because
  its slave keeps failing (MetaQ's unregistration), until it registers again;
- its gregor slave, with ZooKeeper configured, watches ``brokers/ids/<id>/master``
  (:class:`Promoter`): when the master it saw registered is gone (its session ended: a crash,
  a hang, a partition) and the epoch node still names it, not stopped, the slave writes epoch
  n+1 naming itself with a conditional set (the node's version: of two contenders exactly one
  wins) and becomes the master.  A node that names an in-sync slave (``insync``, set by a
  promoted master once a replaced master rejoined it: :mod:`pymetaq.ha.rejoin`) lets only
  that slave take over; a promoted master writes ``insync: ""`` (none yet).

The slave may be promoted whenever its master is gone: the master acknowledges a put only
once the slave confirmed it (:mod:`pymetaq.ha.sync`), so the slave holds every acknowledged
message.  The old master cannot acknowledge anything after that either: the promoted broker
refuses its ``sync``/``bsync``.

Thread-safety: the functions are blocking ZooKeeper calls for any one thread; a
:class:`Promoter` works on its own thread and calls ``on_promote`` from it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pymetaq.client.cluster.session import RefreshLoop
from pymetaq.client.protocol.zk import ZkPaths

log = logging.getLogger("pymetaq.ha")


class Fenced(Exception):
    """This broker is not (or no longer) the master its brokerId's epoch names."""

    retriable = False

    def __init__(self, message: str, holder: str, epoch: int) -> None:
        super().__init__(message)
        self.holder = holder  # the master the epoch names
        self.epoch = epoch


@dataclass(frozen=True)
class Epoch:
    """The value of ``brokers/ids/<id>/epoch``."""

    epoch: int
    master: str
    replica: str
    stopped: bool = False
    #: the replica id of the slave that holds everything the master acknowledged (it alone
    #: may be promoted); "" none; None: not tracked (a samsa master's own pair: MetaQ's
    #: pair acknowledges only with its slave, so its slave may always take over)
    insync: str | None = None

    def encode(self) -> bytes:
        doc: dict[str, object] = {
            "epoch": self.epoch,
            "master": self.master,
            "replica": self.replica,
            "stopped": self.stopped,
        }
        if self.insync is not None:
            doc["insync"] = self.insync
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Epoch:
        """The node's value; ValueError if it is not one (someone wrote something else)."""
        try:
            doc = json.loads(raw)
            epoch, master, replica = doc["epoch"], doc["master"], doc["replica"]
            stopped = doc.get("stopped", False)
            insync = doc.get("insync")
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"not an epoch node value: {raw[:200]!r}") from e
        if not isinstance(epoch, int) or epoch < 1 or not isinstance(master, str):
            raise ValueError(f"not an epoch node value: {raw[:200]!r}")
        if insync is not None and not isinstance(insync, str):
            raise ValueError(f"not an epoch node value: {raw[:200]!r}")
        return cls(epoch, master, str(replica), bool(stopped), insync)


REPLICA_ID_FILE = ".replica_id"


def replica_id(data_path: str) -> str:
    """This broker's replica id: read from ``<data_path>/.replica_id``, made on first use
    (written to a temporary file, fsynced and renamed)."""
    path = os.path.join(data_path, REPLICA_ID_FILE)
    try:
        with open(path, encoding="ascii") as f:
            found = f.read().strip()
        if found:
            return found
    except FileNotFoundError:
        pass
    made = uuid.uuid4().hex
    os.makedirs(data_path, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(made + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return made


def epoch_path(paths: ZkPaths, broker_id: int) -> str:
    return f"{paths.broker(broker_id)}/epoch"


def read_epoch(client: Any, path: str) -> tuple[Epoch, int] | None:
    """(value, node version), or None when there is no node."""
    from kazoo.exceptions import NoNodeError

    try:
        raw, stat = client.get(path)
    except NoNodeError:
        return None
    return Epoch.decode(raw), stat.version


def claim_as_master(
    client: Any, path: str, url: str, replica: str, *, keep_stopped: bool = False
) -> int:
    """A samsa master (``replica`` at ``url``) starting: its epoch (see the module doc);
    :class:`Fenced` when the node names another replica.  ``keep_stopped``: a ``stopped``
    mark stays (the caller clears it by claiming again once its master node exists, so its
    slave never finds the mark gone and the master node absent)."""
    from kazoo.exceptions import BadVersionError, NodeExistsError

    while True:
        found = read_epoch(client, path)
        if found is None:
            try:
                client.create(path, Epoch(1, url, replica).encode(), makepath=True)
                return 1
            except NodeExistsError:
                continue
        current, version = found
        if current.replica != replica:
            raise Fenced(
                f"the master of this brokerId is {current.master} since epoch {current.epoch} "
                f"(an automatic failover; {path} in ZooKeeper): this broker at {url} is no "
                "longer its master",
                current.master,
                current.epoch,
            )
        if (keep_stopped or not current.stopped) and current.master == url:
            return current.epoch
        try:
            claimed = dataclasses.replace(current, master=url, stopped=False)
            client.set(path, claimed.encode(), version=version)
            return current.epoch
        except BadVersionError:
            continue


def mark_stopped(client: Any, path: str, replica: str, epoch: int) -> None:
    """A clean stop: ``stopped`` set if the node still names us (else left alone)."""
    from kazoo.exceptions import BadVersionError

    found = read_epoch(client, path)
    if found is None or found[0].replica != replica or found[0].epoch != epoch:
        return
    stopped = dataclasses.replace(found[0], stopped=True)
    try:
        client.set(path, stopped.encode(), version=found[1])
    except BadVersionError:
        pass  # changed meanwhile: a promotion; nothing of ours to mark


def set_insync(client: Any, path: str, replica: str, epoch: int, slave: str) -> bool:
    """The master (``replica`` at ``epoch``) names its in-sync slave (``""``: none); False if
    the node no longer names it (replaced meanwhile)."""
    from kazoo.exceptions import BadVersionError

    while True:
        found = read_epoch(client, path)
        if found is None or found[0].replica != replica or found[0].epoch != epoch:
            return False
        if found[0].insync == slave:
            return True
        try:
            client.set(path, dataclasses.replace(found[0], insync=slave).encode(), version=found[1])
            return True
        except BadVersionError:
            continue


class Promoter:
    """A gregor slave's watch on its master's registration (see the module doc)."""

    def __init__(
        self,
        client: Any,
        paths: ZkPaths,
        broker_id: int,
        url: str,
        replica: str,
        on_promote: Callable[[int], None],
        *,
        retry_delay_s: float = 0.2,
    ) -> None:
        self.client = client
        self.url = url
        self.replica = replica
        self.master_path = paths.broker_master(broker_id)
        self.epoch_path = epoch_path(paths, broker_id)
        self.on_promote = on_promote
        self.seen: str | None = None  # the master last seen registered
        self.epoch: int | None = None  # ours, once promoted
        self._loop = RefreshLoop(
            f"pymetaq-promoter-{broker_id}", self._check, retry_delay_s=retry_delay_s
        )

    def start(self) -> None:
        self.client.add_listener(self._loop.wake)
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
        self.client.remove_listener(self._loop.wake)

    def _check(self) -> float | None:
        from kazoo.exceptions import NoNodeError

        if self.epoch is not None or not self.client.connected:
            return None
        try:
            data, _ = self.client.get(self.master_path, watch=self._loop.wake)
        except NoNodeError:
            if self.client.exists(self.master_path, watch=self._loop.wake) is not None:
                return 0.0  # created meanwhile: read it
        else:
            master = data.decode("utf-8", "replace")
            if master != self.url:
                self.seen = master
            return None
        if self.seen is None:
            return None  # no master seen yet: nothing to take over from
        return self._promote(self.seen)

    def _promote(self, master: str) -> float | None:
        from kazoo.exceptions import BadVersionError

        found = read_epoch(self.client, self.epoch_path)
        if found is None:
            return None  # the master never claimed an epoch: not a pair under failover
        current, version = found
        if current.master != master or current.stopped:
            if current.stopped:
                log.info("failover: the master %s stopped cleanly: not taking over", master)
            return None
        if current.insync is not None and current.insync != self.replica:
            log.warning(
                "failover: the master %s is gone, but this broker is not its in-sync slave "
                "(it may lack acknowledged messages): not taking over",
                master,
            )
            return None
        if self.client.exists(self.master_path, watch=self._loop.wake) is not None:
            return None  # registered again meanwhile (it makes its node before it unmarks)
        try:
            self.client.set(
                self.epoch_path,
                Epoch(current.epoch + 1, self.url, self.replica, insync="").encode(),
                version=version,
            )
        except BadVersionError:
            return self._loop.retry_delay_s  # changed meanwhile: look again
        self.epoch = current.epoch + 1
        log.warning(
            "failover: the master %s is gone; this broker %s is the master (epoch %d)",
            master,
            self.url,
            self.epoch,
        )
        self.on_promote(self.epoch)
        return None
