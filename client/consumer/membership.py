"""A consumer's seat in its ZooKeeper group: the fenced hand-off wired into the engine.

A ``Consumer``/``AsyncConsumer`` created with ``servers="zk://..."`` and a group gets a
:class:`Membership`.  ``join()`` (from the engine's ``open()``) registers the member through a
:class:`~pymetaq.client.cluster.group.GroupCoordinator`, whose callbacks run on the
coordinator's thread and drive the engine on its own event loop:

* **revoke** (the partition goes to another member): *fence* the partitions (nothing more is
  delivered from them), let the face *quiesce* them (listener mode: wait until no worker is
  inside them; poll mode: wait until the application is back from the last ``poll()``, up to
  ``max_poll_interval_ms``), cancel their fetches, **commit** their positions, then drop them —
  all before the coordinator deletes the owner nodes;
* **assign**: load each partition's committed offset (or the initial position) and start
  fetching it.  A partition this member still remembers (lost with its session, then given
  back) continues at ``max(its own position, the committed offset)``;
* **lost** (the ZooKeeper connection dropped, the session may be gone): the moment kazoo
  reports it, every partition is fenced (kazoo's connection thread sets a flag; workers check
  it before each message); then the partitions are quiesced and *parked* without a commit
  (ZooKeeper may be unreachable), their positions kept for a re-assignment.

Broadcast consumers (``broadcast=True``) join under their per-instance group (MetaQ renames it
the same way) with no owner nodes: every partition is theirs.

Thread-safety: ``join``/``leave`` from one thread at a time (not the engine's loop);
``may_deliver`` from any thread; the callbacks run on the coordinator's thread, the state
listener on kazoo's connection thread (it only sets flags).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from pymetaq.client.cluster.group import GroupConfig, GroupCoordinator, make_consumer_id
from pymetaq.client.consumer.config import ConsumerConfig
from pymetaq.client.consumer.engine import ConsumerEngine
from pymetaq.client.consumer.state import PartitionState
from pymetaq.client.errors import ClientClosed
from pymetaq.client.types import TopicPartition

log = logging.getLogger("pymetaq.client.consumer")

T = TypeVar("T")
Partitions = frozenset[TopicPartition]


class Membership:
    """One consumer's membership of a ZooKeeper group (see the module docstring)."""

    def __init__(
        self,
        engine: ConsumerEngine,
        zk: Any,
        *,
        root: str,
        group: str,
        config: ConsumerConfig,
        quiesce: Callable[[Partitions], None],
        assigned: Callable[[list[PartitionState]], None],
        follow: Callable[[str], None],
    ) -> None:
        """``quiesce(parts)`` (the face) returns once nothing of ``parts`` — fenced already —
        is being delivered; ``assigned(states)`` starts delivering new partitions (both on the
        coordinator's thread); ``follow(topic)`` makes the broker set learn the addresses of
        the topic's brokers."""
        self.engine = engine
        self.zk = zk
        self.root = root
        self.group = group
        self.config = config
        self._quiesce = quiesce
        self._assigned = assigned
        self._follow = follow
        self.consumer_id = make_consumer_id(group, config.consumer_id)
        self.coordinator: GroupCoordinator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the engine's side ----------------------------------------------------------------------
    def join(self) -> None:
        """Register in the group and start rebalancing (blocking: call it off the engine's
        loop, which must keep running — the callbacks need it)."""
        self._loop = self._engine_loop()
        for topic in self.engine.topics:
            self._follow(topic)
        gc = GroupConfig(
            self.group,
            self.consumer_id,
            tuple(self.engine.topics),
            strategy=self.config.strategy,
            broadcast=self.config.broadcast,
            retry_delay_ms=self.config.zk_sync_time_ms,
            root=self.root,
        )
        coord = GroupCoordinator(
            self.zk, gc, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self.coordinator = coord
        coord.start()
        # after the coordinator's own listener: when ours runs, may_deliver() is False already,
        # so a partition _acquire() adds meanwhile is fenced by one or the other
        self.zk.add_listener(self._on_state)
        log.info("%s joined group %s (strategy %s)", self.consumer_id, self.group, gc.assignor.name)

    def _engine_loop(self) -> asyncio.AbstractEventLoop:
        loop = self.engine.loop
        if loop is None:
            raise RuntimeError("the engine's loop is not known: join() comes from open()")
        return loop

    def leave(self, timeout_s: float = 30.0) -> None:
        """Leave the group: unregister, revoke (commit) everything, release the owner nodes."""
        coord = self.coordinator
        if coord is None:
            return
        try:
            coord.stop(timeout_s)
        finally:
            self.zk.remove_listener(self._on_state)

    def may_deliver(self, tp: TopicPartition) -> bool:
        coord = self.coordinator
        return coord is not None and coord.may_deliver(tp)

    # -- kazoo's connection thread ----------------------------------------------------------------
    def _on_state(self, state: str) -> None:
        if state != "CONNECTED":  # stop delivering at once; on_lost follows
            for st in list(self.engine.states.values()):
                st.fenced = True

    # -- the coordinator's thread -------------------------------------------------------------
    def _on_assign(self, parts: Partitions) -> None:
        states = self._run(self._acquire(parts))
        if states:
            self._assigned(states)

    def _on_revoke(self, parts: Partitions) -> None:
        self._fence(parts)
        self._quiesce(parts)
        self._run(self._release(parts, commit=True))

    def _on_lost(self, parts: Partitions) -> None:
        self._fence(parts)
        self._quiesce(parts)
        self._run(self._release(parts, commit=False))

    def _fence(self, parts: Partitions) -> None:
        for tp in parts:
            st = self.engine.states.get(tp)
            if st is not None:
                st.fenced = True

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            raise ClientClosed("the consumer's loop is closed")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # -- the engine's loop ----------------------------------------------------------------------
    async def _acquire(self, parts: Partitions) -> list[PartitionState]:
        """Position and add ``parts``; all or nothing (the coordinator retries a failure)."""
        engine = self.engine
        added: list[PartitionState] = []
        try:
            for tp in sorted(parts):
                cur = engine.states.get(tp)
                if cur is not None and not cur.fenced:
                    continue  # delivering it already
                remembered = engine.parked.pop(tp, None) or cur
                st = await engine.position_for(tp)
                if remembered is not None and remembered.position > st.position:
                    committed = st.committed
                    st = PartitionState(
                        tp,
                        remembered.position,
                        self.config.fetch_max_size,
                        last_msg_id=remembered.last_msg_id,
                    )
                    st.committed = committed
                engine.ledger.forget(tp)  # a poll result from before is delivered again
                engine.states[tp] = st
                added.append(st)
                if not self.may_deliver(tp):  # the session dropped meanwhile
                    st.fenced = True
        except BaseException:
            for st in added:
                st.fenced = True
                if engine.states.get(st.tp) is st:
                    del engine.states[st.tp]
            raise
        engine.notify_assigned()
        return added

    async def _release(self, parts: Partitions, *, commit: bool) -> None:
        """Stop fetching ``parts``; with ``commit``, write their positions, then drop them;
        else park them (their positions are kept for a re-assignment)."""
        engine = self.engine
        tps = sorted(tp for tp in parts if tp in engine.states)
        for tp in tps:
            engine.states[tp].fenced = True
        await engine.cancel_fetches(tps)
        if commit:
            wait = self.config.max_poll_interval_ms / 1000.0
            if not await engine.ledger.wait(tps, wait):
                log.warning(
                    "%s: the application did not poll again within max_poll_interval_ms=%s; "
                    "releasing %s anyway (the messages of its last poll will be delivered "
                    "again by their next owner)",
                    self.consumer_id,
                    self.config.max_poll_interval_ms,
                    ", ".join(map(str, tps)),
                )
            if self.config.enable_auto_commit:
                try:
                    await asyncio.to_thread(engine.commit_now, tps)
                except Exception as e:  # the hand-off goes on: the next owner starts earlier
                    log.error(
                        "%s: committing %s before release failed: %r", self.consumer_id, tps, e
                    )
        for tp in tps:
            st = engine.states.pop(tp)
            if commit:
                engine.ledger.forget(tp)
                engine.parked.pop(tp, None)
            else:
                st.buffer, st.index = [], 0  # only the position is kept (fetched again)
                engine.parked[tp] = st
