"""The consumer engine: owned partitions, initial positions, fetch rounds, poll, commits.

One engine serves both faces: :class:`~pymetaq.client.consumer.AsyncConsumer` runs it on the
application's event loop, :class:`~pymetaq.client.consumer.Consumer` on its own
``LoopThread`` (listener workers call :meth:`ConsumerEngine.fetch_ahead` through it).

* ``open()`` learns the subscribed topics' partitions and, without a ZooKeeper group, owns
  all of them; ``assign(partitions)`` is the manual seam (it commits released partitions
  first, as MetaQ does before a rebalance).  With a ZooKeeper group (``membership`` set by
  the face, :mod:`pymetaq.client.consumer.membership`) ``open()`` joins the group instead and
  partitions come and go through the group's fenced hand-off: a partition being revoked or
  whose session is in trouble is *fenced* (``PartitionState.fenced``: nothing more is
  delivered from it), a lost one is *parked* (kept in :attr:`ConsumerEngine.parked`, its
  position still counting messages the application already had).
* ``fetch_ahead(state)`` (both modes) is a fetch round with read-ahead: when it buffers
  messages it sends the next ``get`` at once (``prefetch``: the raw reply, no state touched),
  and the next ``fetch_ahead`` applies that reply (or drops it if the partition was seeked
  meanwhile). At most one reply is read ahead per partition.
* ``fetch_round(state)`` is one MetaQ fetch step for one partition: ``get`` (long-poll by
  default), scan, then 301 → jump, 404 → backoff (``delay += max/10``), a record too big →
  double the max size, a bad CRC → ``offset`` query and restart at the segment start, skipping
  records already delivered.
* ``poll()`` (Kafka-like): messages returned by one ``poll`` count as consumed at the next
  ``poll()`` or ``commit()``. One fetch round per partition stays in flight between polls,
  and after a round buffers messages the next ``get`` is sent at once (read-ahead).
  Memory per partition: the batch the caller holds, one buffered reply and one raw reply
  ahead, each at most ``fetch_max_size_cap`` bytes.
* ``commit_now()`` writes changed positions (``OffsetEntry(topic, "<b>-<p>", next_offset,
  last msg id)``) with ``store.commit`` — a seeked partition with ``store.reset`` — in a
  worker thread.

Thread-safety: call the async methods on the engine's loop only. ``commit_now`` and the
position snapshot may run in any thread (they read ints that the loop/workers write).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from pymetaq.client.consumer.batch import Messages, id_at, make_message, next_offset_at, offset_at
from pymetaq.client.consumer.config import (
    UNGROUPED_GROUP,
    ConsumerConfig,
    InitialPosition,
)
from pymetaq.client.consumer.ledger import Partly, PollLedger
from pymetaq.client.consumer.recover import RejectPolicy
from pymetaq.client.consumer.scan import scan
from pymetaq.client.consumer.state import PartitionState, Step, apply_scan, backoff
from pymetaq.client.consumer.transport import (
    END_OFFSET,
    ConsumerTransport,
    FetchStatus,
    Prefetched,
)
from pymetaq.client.errors import (
    MetaClientError,
    NoCommittedOffset,
    NotAssigned,
    UndecodableRecord,
)
from pymetaq.client.types import Message, TopicPartition
from pymetaq.offsets import OffsetEntry, OffsetStore
from pymetaq.storage.record import HEADER_SIZE

log = logging.getLogger("pymetaq.client.consumer")

#: per partition: (offset of the first unprocessed message, id of the last processed or None)

#: steps after which a fetch round continues at once (no result for the caller yet).
_AGAIN = (Step.GROW, Step.SKIPPED, Step.RESYNC)


class GroupSeat(Protocol):
    """What the engine asks of its ZooKeeper group membership."""

    def join(self) -> None:
        """Register and start rebalancing (blocking; called in a worker thread)."""

    def may_deliver(self, tp: TopicPartition) -> bool: ...


def offset_entry(message: Message) -> OffsetEntry:
    """The offset to commit once ``message`` is processed (e.g. with ``commit_in``)."""
    return OffsetEntry(message.topic, message.partition_key, message.next_offset, message.id)


class ConsumerEngine:
    """Fetch and position logic shared by the sync and async consumers (see module doc)."""

    def __init__(
        self,
        transport: ConsumerTransport,
        group: str | None,
        store: OffsetStore | None,
        config: ConsumerConfig,
        reject_policy: RejectPolicy,
    ) -> None:
        self.transport = transport
        self.group = group  # effective group (broadcast-renamed) or None (ungrouped)
        self.store = store
        self.config = config
        #: where undecodable records go (and, in listener mode, messages whose listener
        #: keeps failing)
        self.reject_policy = reject_policy
        self.topics: list[str] = []
        self.states: dict[TopicPartition, PartitionState] = {}
        self.counters = {
            "fetches": 0,
            "messages": 0,
            "empty": 0,
            "moved": 0,
            "errors": 0,
            "crc_errors": 0,
            "grown": 0,
            "commits": 0,
            "undecodable": 0,
        }
        #: what the last poll() returned, until it counts as consumed
        self.ledger = PollLedger()
        self._tasks: dict[TopicPartition, asyncio.Task[Step]] = {}
        # read-ahead: the raw reply of the get after the buffered one (one per partition)
        self._ahead: dict[TopicPartition, asyncio.Task[Prefetched]] = {}
        self._rr = 0  # poll round-robin start
        self.opened = False
        #: a ZooKeeper group's membership (the face sets it), else None
        self.membership: GroupSeat | None = None
        #: the loop the engine runs on (known from ``open()``)
        self.loop: asyncio.AbstractEventLoop | None = None
        #: partitions lost with their session: their state, until they are assigned again
        self.parked: dict[TopicPartition, PartitionState] = {}
        self._assigned = asyncio.Event()  # partitions were added (poll stops waiting)

    @property
    def wire_group(self) -> str:
        return self.group if self.group is not None else UNGROUPED_GROUP

    # ---------------------------------------------------------------- assignment

    async def open(self) -> None:
        """Connect; join the ZooKeeper group, or own every partition of the subscribed
        topics (no group)."""
        if self.opened:
            return
        self.loop = asyncio.get_running_loop()
        await self.transport.start()
        if self.membership is not None:
            await asyncio.to_thread(self.membership.join)
            self.opened = True
            return
        tps: list[TopicPartition] = []
        for topic in self.topics:
            tps.extend(await self.transport.partitions(topic))
        await self.assign(tps)
        self.opened = True

    def notify_assigned(self) -> None:
        """(loop) Partitions were added: a waiting poll starts fetching them at once."""
        self._assigned.set()

    async def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Own exactly ``partitions``: commit and drop the others, position the new ones."""
        wanted = sorted(set(partitions))
        released = [tp for tp in self.states if tp not in wanted]
        if released:
            await self.cancel_fetches(released)
            if self.config.enable_auto_commit:
                await asyncio.to_thread(self.commit_now, released)
            for tp in released:
                del self.states[tp]
                self.ledger.forget(tp)
        for tp in wanted:
            if tp not in self.states:
                self.states[tp] = await self.position_for(tp)

    async def position_for(self, tp: TopicPartition) -> PartitionState:
        """The state of a newly owned partition: committed offset, else the initial scheme."""
        entry = None
        if self.group is not None and self.store is not None:
            entry = await asyncio.to_thread(self.store.load, self.group, tp.topic, tp.key)
        size = self.config.fetch_max_size
        if entry is not None:
            st = PartitionState(tp, entry.offset, size, last_msg_id=entry.msg_id)
            st.committed = entry.offset
            return st
        scheme = self.config.initial_position
        if scheme is InitialPosition.AUTO:
            scheme = InitialPosition.EARLIEST if self.group is not None else InitialPosition.LATEST
        if scheme is InitialPosition.NONE:
            raise NoCommittedOffset(self.group or "", tp)
        target = 0 if scheme is InitialPosition.EARLIEST else END_OFFSET
        try:
            offset = await self.transport.nearest_offset(tp, self.wire_group, target)
        except MetaClientError as e:
            if self.membership is None or scheme is not InitialPosition.EARLIEST:
                raise
            # a group member takes the partition anyway, at 0 as MetaQ does (the broker
            # answers 301 with the first offset once it is reachable)
            log.info("%s: cannot ask for the first offset (%s); starting at 0", tp, e)
            offset = 0
        log.info(
            "%s: no committed offset for group %s, starting at %s (%s)",
            tp,
            self.group,
            offset,
            scheme.value,
        )
        st = PartitionState(tp, offset, size)
        st.committed = offset  # nothing to write until the partition makes progress
        return st

    def state(self, tp: TopicPartition) -> PartitionState:
        st = self.states.get(tp)
        if st is None:
            raise NotAssigned(tp)
        return st

    async def bound(self, tp: TopicPartition, end: bool) -> int:
        """The partition's first (``end=False``) or end (``end=True``) offset."""
        return int(
            await self.transport.nearest_offset(tp, self.wire_group, END_OFFSET if end else 0)
        )

    # ---------------------------------------------------------------- fetching

    async def fetch_round(self, st: PartitionState, prefetched: Prefetched | None = None) -> Step:
        """Fetch until messages are buffered or the partition should back off.

        ``prefetched`` (listener mode) is a reply fetched while the previous buffer was being
        delivered; it is used if it still matches the partition's offset and generation.
        """
        while True:
            st.apply_pending_seek()
            pre, prefetched = prefetched, None
            if pre is not None and (
                pre.offset != st.fetch_offset or pre.generation != st.generation
            ):
                pre = None  # stale: seeked, or the offset moved meanwhile
            step = await self._fetch_once(st, pre)
            if step not in _AGAIN:
                return step

    async def prefetch(self, st: PartitionState) -> Prefetched:
        """The raw reply of the next ``get`` (no state is touched: the caller may still be
        processing the buffer); :meth:`fetch_round` applies it later."""
        offset, gen, wait = st.fetch_offset, st.generation, self.config.long_poll_ms
        started = time.monotonic()
        reply = await self.transport.fetch(st.tp, self.wire_group, offset, st.max_size, wait)
        return Prefetched(offset, gen, started, reply)

    async def _fetch_once(self, st: PartitionState, pre: Prefetched | None = None) -> Step:
        cfg, tp, gen = self.config, st.tp, st.generation
        wait = cfg.long_poll_ms
        if pre is None:
            started = time.monotonic()
            offset = st.fetch_offset
            reply = await self.transport.fetch(tp, self.wire_group, offset, st.max_size, wait)
        else:
            started, offset, reply = pre.started, pre.offset, pre.reply
        self.counters["fetches"] += 1
        if gen != st.generation:
            return Step.SKIPPED  # seeked meanwhile: drop this reply
        if reply.status is FetchStatus.DATA:
            return await self._on_data(st, offset, reply.data)
        if reply.status is FetchStatus.NO_DATA:
            self.counters["empty"] += 1
            if st.check_end:
                st.check_end = False
                try:
                    end = await self.transport.nearest_offset(tp, self.wire_group, END_OFFSET)
                except Exception as e:
                    log.warning("%s: end offset query failed: %s", tp, e)
                    st.check_end, end = True, offset
                if offset > end and gen == st.generation:
                    return self._moved(st, offset, end)
            waited_ms = (time.monotonic() - started) * 1000
            if wait and waited_ms >= wait / 2:
                st.delay_ms = 0.0  # the broker held the request: fetch again at once
            else:
                st.delay_ms = backoff(st.delay_ms, cfg.max_delay_fetch_ms)
            return Step.EMPTY
        if reply.status is FetchStatus.MOVED:
            return self._moved(st, offset, reply.new_offset)
        self.counters["errors"] += 1
        st.delay_ms = backoff(st.delay_ms, cfg.max_delay_fetch_ms)
        log.warning("%s: fetch at %s failed: %s", tp, offset, reply.error)
        return Step.EMPTY

    async def _on_data(self, st: PartitionState, offset: int, data: bytes) -> Step:
        cfg, tp = self.config, st.tp
        sc = scan(data, tp, offset, verify=cfg.verify_crc, max_record=cfg.fetch_max_size_cap)
        if sc.corrupt_at >= 0:
            self.counters["crc_errors"] += 1
            log.warning("%s: corrupt record at %s: %s", tp, sc.corrupt_at, sc.reason)
        step = apply_scan(st, sc, len(data), cfg)
        if step is Step.PROGRESS:
            self.counters["messages"] += len(st.buffer)
        elif step is Step.GROW:
            self.counters["grown"] += 1
            log.info(
                "%s: record at %s needs %s bytes, max size now %s",
                tp,
                offset,
                sc.need,
                st.max_size,
            )
        elif step is Step.TOO_LARGE:
            log.error(
                "%s: record at %s needs %s bytes, above the cap %s (or the broker's "
                "transfer size): stuck",
                tp,
                offset,
                sc.need,
                cfg.fetch_max_size_cap,
            )
        elif step is Step.RESYNC:
            return await self._resync(st, sc.corrupt_at, sc.reason)
        elif step is Step.UNDECODABLE:
            assert sc.undecodable is not None
            return await self._reject_undecodable(st, sc.undecodable)
        return step

    async def _reject_undecodable(self, st: PartitionState, bad: UndecodableRecord) -> Step:
        """Hand a CRC-valid but undecodable record to the reject policy and move past it
        (counted in ``counters["undecodable"]``); if the policy fails, keep it and retry
        after the backoff (never dropped silently)."""
        tp = st.tp
        data = bad.record[HEADER_SIZE:]
        message = make_message(
            tp.topic, tp.partition, bad.offset, bad.msg_id, data, bad.next_offset, tp.broker_id
        )
        try:
            await asyncio.to_thread(self.reject_policy.reject, message, bad)
        except Exception as e:
            log.error("%s: rejecting the undecodable record at %s failed: %r", tp, bad.offset, e)
            st.delay_ms = float(self.config.max_delay_fetch_ms)
            return Step.EMPTY
        self.counters["undecodable"] += 1
        log.error(
            "%s: record at %s is undecodable (%s); handed to the reject policy, moving on",
            tp,
            bad.offset,
            bad.reason,
        )
        st.skip(bad.offset, bad.next_offset, bad.msg_id)
        return Step.SKIPPED

    def _moved(self, st: PartitionState, offset: int, new_offset: int) -> Step:
        self.counters["moved"] += 1
        log.warning("%s: offset %s out of range, moving to %s", st.tp, offset, new_offset)
        st.fetch_offset = new_offset
        if st.buffered == 0:
            st.position = new_offset
            st.reset_pending = True  # the broker's word: may move the committed offset back
        st.delay_ms = 0.0
        return Step.GROW  # fetch again at once

    async def _resync(self, st: PartitionState, bad: int, reason: str) -> Step:
        """MetaQ: a corrupt record -> ``offset`` query, restart at the segment start."""
        repeated = st.last_corrupt == bad
        st.last_corrupt = bad
        try:
            start = await self.transport.nearest_offset(st.tp, self.wire_group, bad)
        except Exception as e:
            log.warning("%s: offset query after corrupt record failed: %s", st.tp, e)
            st.delay_ms = backoff(st.delay_ms, self.config.max_delay_fetch_ms)
            return Step.EMPTY
        st.fetch_offset = start
        st.resync_floor = bad
        if repeated:
            log.error(
                "%s: record at %s is corrupt again (%s); retrying from %s after %s ms",
                st.tp,
                bad,
                reason,
                start,
                self.config.max_delay_fetch_ms,
            )
            st.delay_ms = float(self.config.max_delay_fetch_ms)
            return Step.EMPTY
        log.warning(
            "%s: corrupt record at %s (%s); restarting at segment start %s",
            st.tp,
            bad,
            reason,
            start,
        )
        return Step.RESYNC

    # ---------------------------------------------------------------- poll mode

    def claim(self) -> None:
        """The caller received the last poll's messages (see :mod:`.ledger`)."""
        self.ledger.claim()

    def rewind_unclaimed(self) -> None:
        """The caller never received the last poll's messages: fetch them again."""
        self.ledger.rewind(self.states.get)

    def mark_returned_consumed(self, partly: Partly | None = None, *, final: bool = True) -> None:
        """Poll semantics: what the previous poll returned now counts as consumed (also for
        a parked partition: its position is kept for a re-assignment); for a partition in
        ``partly`` only up to where the caller stopped (see :meth:`PollLedger.mark_consumed`)."""
        self.ledger.mark_consumed(
            lambda tp: self.states.get(tp) or self.parked.get(tp), partly, final=final
        )

    def rewind_partly(self, partly: Partly) -> None:
        """The caller stopped part-way through the last poll's messages and polls again: what
        it processed is consumed, the rest is fetched again (a seek to its first message)."""
        self.mark_returned_consumed(partly)
        for tp, (first, _last) in partly.items():
            st = self.states.get(tp)
            if st is not None:
                st.request_seek(first)

    async def poll(self, timeout_s: float, max_records: int = 0) -> Messages:
        """Return buffered or newly fetched messages; ``[]`` after ``timeout_s``.

        The caller then calls :meth:`claim` (it has them) or :meth:`rewind_unclaimed`.
        """
        self.rewind_unclaimed()  # a result nobody claimed (should not happen)
        self.mark_returned_consumed()
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            for st in self.states.values():
                if st.apply_pending_seek():
                    await self.cancel_fetches([st.tp])
            self._reap()
            out = self._drain(max_records or (1 << 62))
            self._start_fetches()
            if out:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out
            waiters: list[asyncio.Future[Any]] = list(self._tasks.values())
            if self.membership is not None:  # a rebalance may add partitions meanwhile
                self._assigned.clear()
                waiters.append(asyncio.ensure_future(self._assigned.wait()))
            if not waiters:
                return out
            await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if self.membership is not None:
                waiters[-1].cancel()
            self._reap()

    def _drain(self, limit: int) -> Messages:
        parts: list[Sequence[Message]] = []
        count = 0
        states = list(self.states.values())
        n = len(states)
        for i in range(n):
            st = states[(self._rr + i) % n]
            if st.buffered == 0 or st.tp in self._tasks or st.fenced:
                continue
            take = st.buffer[st.index : st.index + limit - count]
            st.index += len(take)
            parts.append(take)
            count += len(take)
            last = len(take) - 1
            # a partly returned buffer resumes at the next message (an lz4 batch's inner
            # messages share their record's offset: the record is then redelivered)
            if st.index < len(st.buffer):
                pos = offset_at(st.buffer, st.index)
            else:
                pos = next_offset_at(take, last)
            self.ledger.note(st.tp, pos, id_at(take, last), offset_at(take, 0))
            if count >= limit:
                self._rr = (self._rr + i + 1) % n
                break
        return Messages(parts)

    def _start_fetches(self) -> None:
        """Keep one fetch in flight for every partition whose buffer is empty."""
        self._reap()
        for st in self.states.values():
            if st.buffered == 0 and st.tp not in self._tasks and not st.fenced:
                self._tasks[st.tp] = asyncio.ensure_future(self._delayed_round(st))

    async def _delayed_round(self, st: PartitionState) -> Step:
        return await self.fetch_ahead(st, sleep=True)

    async def fetch_ahead(self, st: PartitionState, *, sleep: bool = False) -> Step:
        """A fetch round that starts from the partition's read-ahead reply (if any) and, when
        it buffers messages, sends the next ``get`` at once: the reply arrives while the caller
        processes this buffer. ``sleep``: wait ``st.delay_ms`` first (poll mode's backoff)."""
        ahead = self._ahead.pop(st.tp, None)
        prefetched = None
        if ahead is not None:
            try:
                prefetched = await ahead
            except Exception as e:  # the round below fetches again, without the read-ahead
                log.warning("%s: read-ahead fetch failed: %r", st.tp, e)
        elif sleep and st.delay_ms > 0:
            await asyncio.sleep(st.delay_ms / 1000)
        step = await self.fetch_round(st, prefetched)
        if step is Step.PROGRESS and st.tp in self.states:
            self._ahead[st.tp] = asyncio.ensure_future(self.prefetch(st))
        return step

    def _reap(self) -> None:
        for tp, task in list(self._tasks.items()):
            if task.done():
                del self._tasks[tp]
                if not task.cancelled() and task.exception() is not None:
                    log.warning("%s: fetch task failed: %r", tp, task.exception())

    async def cancel_fetches(self, tps: Iterable[TopicPartition] | None = None) -> None:
        which = list(tps) if tps is not None else [*self._tasks, *self._ahead]
        tasks: list[asyncio.Future[Any]] = [
            running.pop(tp)
            for running in (self._tasks, self._ahead)
            for tp in which
            if tp in running
        ]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception as e:  # a fetch that failed before it was cancelled
                log.warning("cancelled fetch had failed: %r", e)

    # ---------------------------------------------------------------- commits

    def entry(self, st: PartitionState) -> OffsetEntry:
        return OffsetEntry(st.tp.topic, st.tp.key, st.position, st.last_msg_id)

    def commit_now(self, tps: Iterable[TopicPartition] | None = None) -> int:
        """Write changed positions to the store (blocking); returns how many were written."""
        if self.group is None or self.store is None:
            return 0
        states = [
            self.states[tp]
            for tp in (tps if tps is not None else list(self.states))
            if tp in self.states
        ]
        plain: list[tuple[PartitionState, OffsetEntry]] = []
        resets: list[tuple[PartitionState, OffsetEntry]] = []
        for st in states:
            seek = st.pending_seek
            if seek is not None:  # requested, not applied yet: where the partition goes on
                if seek != st.committed:
                    resets.append((st, OffsetEntry(st.tp.topic, st.tp.key, seek, -1)))
                continue
            e = self.entry(st)
            if st.reset_pending:
                resets.append((st, e))
            elif e.offset != st.committed:
                plain.append((st, e))
        if resets:
            self.store.reset(self.group, [e for _, e in resets])
        if plain:
            self.store.commit(self.group, [e for _, e in plain])
        for st, e in resets:
            st.committed = e.offset
            if st.pending_seek is None and st.position == e.offset:  # else reset again later
                st.reset_pending = False
        for st, e in plain:
            st.committed = e.offset
        if resets or plain:
            self.counters["commits"] += 1
        return len(resets) + len(plain)

    async def shutdown(self) -> None:
        """Cancel fetches and close the connections."""
        await self.cancel_fetches()
        self.transport.close()
