"""The consumer-group coordinator: MetaQ's ZooKeeper group protocol with a fenced hand-off.

A :class:`GroupCoordinator` registers ``consumers/<group>/ids/<consumerId>`` (ephemeral, the
topics joined by ``,``), follows the group's members and each topic's ``topics-sub`` entries,
computes the group's assignment with an injected assignor (:mod:`.assignors`) and moves its own
share through owner nodes ``consumers/<group>/owners/<topic>/<brokerId>-<partition>``
(ephemeral, value = consumerId).  One round, on the coordinator's thread:

1. read the members (re-arming the watch on ``ids``) and each topic's partitions (watches on
   ``topics-sub/<topic>`` and its entries); with a sticky assignor also the owners;
2. **revoke** what is held but no longer assigned: ``on_revoke(partitions)`` returns only once
   the consumer has stopped fetching them and committed their offsets; then the owner nodes
   are deleted;
3. **claim** what is assigned but not held: create the owner node; if it exists and belongs
   to another session, arm a watch on it and retry when it goes (or after
   ``retry_delay_ms``, MetaQ's zkSyncTimeMs) — a partition is never taken before its previous
   owner let it go or lost its session;
4. ``on_assign(partitions)`` with what was claimed (the consumer loads committed offsets).
   It may be called more than once in a rebalance, as partitions become free.  A callback
   cannot be atomic with a connection loss: deliver a partition only while
   :meth:`GroupCoordinator.may_deliver` says so (it turns False the moment the connection
   drops), and expect ``on_lost`` to follow.

Rounds run when the members, the ``topics-sub`` entries or the session change; changes that
arrive during a round coalesce into one more round.  Revocation is incremental: partitions that
stay with this member are never interrupted.

Session trouble: the moment kazoo reports the connection SUSPENDED (the session may expire on
the server while we cannot hear it) or LOST, :meth:`may_deliver` turns False for everything and
the thread calls ``on_lost(partitions)`` (default ``on_revoke``): stop delivering at once;
committing may be impossible now.  After a reconnect within the same session the owner nodes
are still ours and are handed back through ``on_assign``; after a new session the member
registers again and rebalances from scratch.

Broadcast (``broadcast=True``): every partition is this member's, no owner node is created.

:meth:`stop` leaves cleanly: delete the ids node (the others start rebalancing), revoke
everything, delete the owner nodes.

Thread-safety: :meth:`may_deliver`, :attr:`assignment` and :meth:`stats` from any thread;
callbacks run on the coordinator's thread, one at a time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pymetaq.client.cluster.assignors import Assignor, get_assignor
from pymetaq.client.cluster.discovery import TopicView, read_topic
from pymetaq.client.cluster.errors import ClusterUnavailable, MembershipConflict
from pymetaq.client.cluster.session import (
    RefreshLoop,
    delete_if_owned,
    negotiated_timeout_s,
    session_id,
)
from pymetaq.client.protocol.zk import (
    DEFAULT_ROOT,
    ZkPaths,
    check_group,
    check_name,
    decode_topics,
    encode_topics,
    parse_partition_name,
)
from pymetaq.client.types import TopicPartition

log = logging.getLogger("pymetaq.cluster")


Partitions = frozenset[TopicPartition]
Callback = Callable[[Partitions], None]


def make_consumer_id(group: str, name: str | None = None) -> str:
    """MetaQ's consumer id: ``<group>_<name>``, default name ``<ip>-<pid>-<random>``."""
    if name is None:
        try:
            ip = socket.gethostbyname(socket.gethostname())
        except OSError:
            ip = "127.0.0.1"
        name = f"{ip}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    return check_name("consumer id", f"{group}_{name}")


@dataclass(frozen=True)
class GroupConfig:
    """What a member needs: who it is, what it reads, how the group divides the work."""

    group: str
    consumer_id: str
    topics: tuple[str, ...]
    strategy: str | Assignor = "DEFAULT"
    broadcast: bool = False
    retry_delay_ms: int = 5000  # MetaQ's zkSyncTimeMs: claim retry and failure backoff
    root: str = DEFAULT_ROOT
    assignor: Assignor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_group(self.group)
        check_name("consumer id", self.consumer_id)
        if not self.topics:
            raise ValueError("a group member needs at least one topic")
        for t in self.topics:
            check_name("topic", t)
            if "," in t:
                raise ValueError(f"topic {t!r}: ',' separates topics in the ids node")
        if self.retry_delay_ms <= 0:
            raise ValueError(f"retry_delay_ms must be > 0, got {self.retry_delay_ms}")
        object.__setattr__(self, "topics", tuple(dict.fromkeys(self.topics)))
        object.__setattr__(self, "assignor", get_assignor(self.strategy))


class GroupCoordinator:
    """One member of a consumer group (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        config: GroupConfig,
        *,
        on_assign: Callback,
        on_revoke: Callback,
        on_lost: Callback | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.paths = ZkPaths(config.root)
        self.on_assign, self.on_revoke = on_assign, on_revoke
        self.on_lost = on_lost or on_revoke
        self.me = config.consumer_id
        self._lock = threading.Lock()
        self._held: Partitions = frozenset()  # delivered: between on_assign and on_revoke
        self._live = False
        self._interrupted = False  # set by the state listener; consumed by the thread
        self._nodes: set[TopicPartition] = set()  # owner nodes created in this session
        self._session: int | None = None  # the session our ids node belongs to
        self._target: Partitions = frozenset()
        self._pending: Partitions = frozenset()
        self._views: dict[str, TopicView] = {}
        self._leaving = False
        self._done = False  # the last round completed
        self._left = threading.Event()
        self.rounds = 0
        self.last_change = time.monotonic()
        self._loop = RefreshLoop(
            f"pymetaq-group-{config.group}", self._refresh, retry_delay_s=self._retry_s
        )

    @property
    def _retry_s(self) -> float:
        return self.config.retry_delay_ms / 1000.0

    # -- API ----------------------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> GroupCoordinator:
        """Register in the group, then rebalance on the coordinator's thread.

        A consumer id left by a crashed process of ours (a session not yet expired) is waited
        for, up to ``timeout`` (default: the session timeout + 2 s); an id held by a live
        session raises :class:`MembershipConflict`; no ZooKeeper connection raises
        :class:`ClusterUnavailable`."""
        from kazoo.exceptions import KazooException

        self.client.add_listener(self._on_state)
        wait = negotiated_timeout_s(self.client) + 2.0 if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            try:
                self._register(session_id(self.client))
                break
            except MembershipConflict:
                if time.monotonic() >= deadline:
                    self.client.remove_listener(self._on_state)
                    raise
                time.sleep(min(0.2, self._retry_s))
            except KazooException as e:
                self.client.remove_listener(self._on_state)
                raise ClusterUnavailable(
                    f"cannot register {self.me!r} in group {self.config.group!r}: {e!r}"
                ) from e
        self._loop.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Leave the group: ids node, then on_revoke(everything), then the owner nodes."""
        self._leaving = True
        self._loop.wake()
        if self._loop.alive:
            self._left.wait(timeout)
        self._loop.stop(timeout)
        self.client.remove_listener(self._on_state)

    @property
    def assignment(self) -> Partitions:
        """The partitions this member may deliver (after on_assign, until on_revoke/on_lost)."""
        return self._held if self._live else frozenset()

    def may_deliver(self, tp: TopicPartition) -> bool:
        """True while ``tp`` is this member's and the session is healthy (cheap; check it
        before delivering each batch)."""
        return self._live and tp in self._held

    def view(self, topic: str) -> TopicView | None:
        """The last ``topics-sub`` view of ``topic`` (broker addresses for fetching)."""
        return self._views.get(topic)

    def settled(self) -> bool:
        """True when the last round completed with every assigned partition held, nothing
        waiting to be claimed and no change noticed since (tests, monitoring)."""
        return self._done and self._live and not self._loop.woken and self._held == self._target

    def stats(self) -> dict[str, Any]:
        return {
            "consumer_id": self.me,
            "rounds": self.rounds,
            "held": sorted(self._held),
            "target": sorted(self._target),
            "pending": sorted(self._pending),
            "live": self._live,
        }

    # -- state listener (kazoo's connection thread: never block here) -------------------------
    def _on_state(self, state: str) -> None:
        if state != "CONNECTED":
            with self._lock:
                self._live = False
                self._interrupted = True
        self._loop.wake()

    # -- the round ----------------------------------------------------------------------------
    def _refresh(self) -> float | None:
        if self._leaving:
            self._leave()
            return None
        self.rounds += 1
        self._done = False
        with self._lock:
            lost = self._held if self._interrupted else frozenset()
            if self._interrupted:
                self._held, self._interrupted = frozenset(), False
            self._live = bool(self.client.connected)
        if lost:
            log.warning(
                "%s: ZooKeeper session interrupted, stop delivering %s", self.me, _fmt(lost)
            )
            self._call(self.on_lost, lost)
        if not self._live:
            return None  # the CONNECTED listener wakes us
        sid = session_id(self.client)
        self._register(sid)
        target = self._compute_target()
        if target is None:
            return self._retry_s
        self._target = target
        self._release(target, sid)
        delay = self._claim_all(target, sid)
        self._done = delay is None
        return delay

    def _compute_target(self) -> Partitions | None:
        members = self._members()
        if self.me not in members:
            return None  # our own registration is not visible yet: read again shortly
        target: set[TopicPartition] = set()
        for topic in self.config.topics:
            view = read_topic(
                self.client, self.paths, topic, "sub", self._loop.wake, require_address=False
            )
            self._views[topic] = view
            names = view.partition_names
            if self.config.broadcast:
                mine: tuple[str, ...] = tuple(names)
            else:
                subscribed = [m for m, ts in members.items() if topic in ts]
                owners = self._owners(topic) if self.config.assignor.uses_owners else {}
                mine = self.config.assignor.assign(subscribed, names, owners).get(self.me, ())
            target.update(TopicPartition(topic, *parse_partition_name(p)) for p in mine)
        return frozenset(target)

    def _release(self, target: Partitions, sid: int | None) -> None:
        drop = self._held - target
        if drop:
            with self._lock:
                self._held = self._held - drop
            log.info("%s: revoking %s", self.me, _fmt(drop))
            self._call(self.on_revoke, drop)
        for tp in sorted(self._nodes - target):
            self._delete_owner(tp, sid)

    def _claim_all(self, target: Partitions, sid: int | None) -> float | None:
        claimed, pending = [], []
        for tp in sorted(target - self._held):
            if self.config.broadcast or self._claim(tp, sid):
                claimed.append(tp)
            else:
                pending.append(tp)
        self._pending = frozenset(pending)
        if claimed:
            got = frozenset(claimed)
            with self._lock:
                if not self._interrupted:
                    self._held = self._held | got
            if self._held >= got:
                log.info("%s: assigned %s", self.me, _fmt(got))
                self.last_change = time.monotonic()
                if not self._call(self.on_assign, got):
                    with self._lock:
                        self._held = self._held - got
                    for tp in got:
                        self._delete_owner(tp, sid)
                    return self._retry_s
        if pending:
            log.info("%s: waiting for %s to be released", self.me, _fmt(frozenset(pending)))
            return self._retry_s
        return None

    # -- ZooKeeper operations -----------------------------------------------------------------
    def _register(self, sid: int | None) -> None:
        from kazoo.exceptions import NodeExistsError

        path = self.paths.consumer_id(self.config.group, self.me)
        if self._session == sid and sid is not None:
            stat = self.client.exists(path)
            if stat is not None and stat.ephemeralOwner == sid:
                return
        try:
            self.client.create(
                path, encode_topics(self.config.topics), ephemeral=True, makepath=True
            )
        except NodeExistsError:
            stat = self.client.exists(path)
            if stat is not None and stat.ephemeralOwner != sid:
                raise MembershipConflict(
                    f"consumer id {self.me!r} is already registered in group "
                    f"{self.config.group!r} by another ZooKeeper session ({path}); "
                    "give each consumer process its own consumer id"
                ) from None
            if stat is None:
                return self._register(sid)
        if self._session != sid:
            self._session, self._nodes = sid, set()

    def _members(self) -> dict[str, tuple[str, ...]]:
        from kazoo.exceptions import NoNodeError

        base = self.paths.consumer_ids(self.config.group)
        out: dict[str, tuple[str, ...]] = {}
        try:
            ids = self.client.get_children(base, watch=self._loop.wake)
        except NoNodeError:
            self.client.exists(base, watch=self._loop.wake)
            return out
        for cid in ids:
            try:
                raw, _ = self.client.get(f"{base}/{cid}")
            except NoNodeError:
                continue  # left meanwhile: its deletion fires the watch again
            out[cid] = decode_topics(raw)
        return out

    def _owners(self, topic: str) -> dict[str, str]:
        from kazoo.exceptions import NoNodeError

        base = self.paths.owners(self.config.group, topic)
        try:
            names = self.client.get_children(base)
        except NoNodeError:
            return {}
        out: dict[str, str] = {}
        for name in names:
            try:
                raw, _ = self.client.get(f"{base}/{name}")
            except NoNodeError:
                continue
            out[name] = bytes(raw).decode("utf-8", "replace")
        return out

    def _claim(self, tp: TopicPartition, sid: int | None) -> bool:
        from kazoo.exceptions import NodeExistsError

        path = self.paths.owner(self.config.group, tp.topic, tp.key)
        for _ in range(3):
            try:
                self.client.create(path, self.me.encode(), ephemeral=True, makepath=True)
                self._nodes.add(tp)
                return True
            except NodeExistsError:
                stat = self.client.exists(path, watch=self._loop.wake)
                if stat is None:
                    continue  # released between create and exists: try again
                if stat.ephemeralOwner == sid:  # ours (a create whose reply was lost)
                    self._nodes.add(tp)
                    return True
                return False
        return False

    def _delete_owner(self, tp: TopicPartition, sid: int | None) -> None:
        delete_if_owned(self.client, self.paths.owner(self.config.group, tp.topic, tp.key), sid)
        self._nodes.discard(tp)

    def _leave(self) -> None:
        from kazoo.exceptions import KazooException

        sid = session_id(self.client)
        try:
            path = self.paths.consumer_id(self.config.group, self.me)
            stat = self.client.exists(path)
            if stat is not None and stat.ephemeralOwner == sid:
                self.client.delete(path)
        except KazooException as e:
            log.warning("%s: could not delete %s on leave: %r", self.me, self.me, e)
        with self._lock:
            held, self._held, self._live = self._held, frozenset(), False
        if held:
            self._call(self.on_revoke, held)
        for tp in sorted(self._nodes):
            try:
                self._delete_owner(tp, sid)
            except KazooException as e:
                log.warning("%s: could not release %s on leave: %r", self.me, tp, e)
        self._left.set()

    def _call(self, cb: Callback, parts: Partitions) -> bool:
        try:
            cb(parts)
            return True
        except Exception:
            log.exception("%s: callback %s failed for %s", self.me, cb, _fmt(parts))
            return False


def _fmt(parts: Partitions) -> str:
    return ", ".join(f"{tp.topic}:{tp.key}" for tp in sorted(parts))
