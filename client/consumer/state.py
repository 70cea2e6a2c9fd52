"""One owned partition's state and MetaQ's fetch rules as pure functions.

:class:`PartitionState` is everything the consumer knows about one partition, and
:func:`apply_scan` / :func:`backoff` / :func:`grown_size` are MetaQ's fetch rules: empty →
``delay += max/10`` up to max, progress resets it; a record that does not fit doubles the max
size up to the cap and shrinks back when replies are small again.

Thread-safety: pure functions are thread-safe; a ``PartitionState`` is owned by one worker at a
time (the consumer guarantees it).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from pymetaq.client.consumer.batch import id_at, next_offset_at, offset_at
from pymetaq.client.consumer.config import ConsumerConfig
from pymetaq.client.consumer.scan import Scan
from pymetaq.client.types import Message, TopicPartition


@dataclass(eq=False)
class PartitionState:
    """One owned partition: positions, buffered messages, backoff, retry and resync state.

    ``fetch_offset`` is where the next ``get`` starts; ``position`` is the consumed position
    (the offset to commit: the next byte after the last processed message); ``committed`` the
    last offset written to the store.
    """

    tp: TopicPartition
    fetch_offset: int
    max_size: int
    position: int = -1
    last_msg_id: int = -1
    committed: int = -1
    delay_ms: float = 0.0
    buffer: Sequence[Message] = field(default_factory=list)
    index: int = 0  # next buffered message to deliver
    attempts: int = 0  # failed listener attempts of buffer[index]
    resync_floor: int = -1  # after a CRC resync, skip records below this offset
    last_corrupt: int = -1
    crc_errors: int = 0
    reset_pending: bool = False  # a seek: commit with reset (may move backwards)
    generation: int = 0  # bumped by a seek request: results of older fetches are dropped
    pending_seek: int | None = None
    #: after a seek or a load: on the first empty reply, check the offset is not beyond the
    #: end (a MetaQ broker answers 404, not 301, there unless updateConsumerOffsets is on)
    check_end: bool = True
    #: rejected undecodable records not yet passed by the position: offset -> (the offset
    #: after it, its id); the position jumps over them once it reaches them
    skips: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: ZooKeeper groups: the partition is being revoked or the session is in trouble — deliver
    #: nothing more from it (set from any thread; workers check it before each message)
    fenced: bool = False

    def __post_init__(self) -> None:
        if self.position < 0:
            self.position = self.fetch_offset

    @property
    def buffered(self) -> int:
        return len(self.buffer) - self.index

    def request_seek(self, offset: int) -> None:
        """Ask for a seek (any thread); the owner applies it at its next safe point."""
        self.pending_seek = offset
        self.generation += 1

    def apply_pending_seek(self) -> bool:
        """Apply a requested seek (owner only); True if one was applied."""
        offset = self.pending_seek
        if offset is None:
            return False
        self.pending_seek = None
        self.fetch_offset = self.position = offset
        self.buffer, self.index, self.attempts = [], 0, 0
        self.resync_floor = self.last_corrupt = -1
        self.delay_ms = 0.0
        self.reset_pending = True
        self.check_end = True
        self.skips.clear()
        return True

    def advance(self, position: int, last_msg_id: int) -> None:
        """Move the consumed position (and past any rejected record that starts there)."""
        skips = self.skips
        while skips and position in skips:
            position, last_msg_id = skips.pop(position)
        self.position, self.last_msg_id = position, last_msg_id

    def skip(self, offset: int, next_offset: int, msg_id: int) -> None:
        """The record at ``offset`` was rejected: fetch on after it, and count it consumed once
        everything before it is (at once if the position is already there)."""
        self.fetch_offset = next_offset
        self.skips[offset] = (next_offset, msg_id)
        self.advance(self.position, self.last_msg_id)

    def consume_head(self) -> None:
        """Mark ``buffer[index]`` processed and advance (see :meth:`consumed_through`)."""
        self.consumed_through(self.index)

    def consumed_through(self, k: int) -> None:
        """Mark ``buffer[:k + 1]`` processed: the index moves to ``k + 1``.

        The position moves past message ``k``, except inside an lz4 batch (its inner messages
        share one record): there it stays at the record until the batch's last message.
        """
        buf = self.buffer
        self.index = k + 1
        self.attempts = 0
        here = offset_at(buf, k)
        inside = k + 1 < len(buf) and offset_at(buf, k + 1) == here
        position = here if inside else next_offset_at(buf, k)
        if self.skips:
            self.advance(position, id_at(buf, k))
        else:
            self.position, self.last_msg_id = position, id_at(buf, k)


def backoff(delay_ms: float, max_delay_ms: int) -> float:
    """MetaQ's empty-fetch backoff: ``delay += max/10``, capped at max."""
    return min(delay_ms + max_delay_ms / 10, float(max_delay_ms))


def grown_size(max_size: int, need: int, cap: int) -> int:
    """Double ``max_size`` until ``need`` fits, capped at ``cap``."""
    size = max_size
    while size < need and size < cap:
        size *= 2
    return min(size, cap)


class Step(enum.Enum):
    """What one fetch led to (the caller schedules the partition accordingly)."""

    PROGRESS = "progress"  # messages buffered
    EMPTY = "empty"  # nothing new: back off
    GROW = "grow"  # a record did not fit: refetch at once with a bigger max size
    TOO_LARGE = "too_large"  # a record exceeds the cap: stuck, back off at max
    RESYNC = "resync"  # corrupt record: ask the broker for the segment start
    SKIPPED = "skipped"  # records below the resync floor were dropped; refetch at once
    UNDECODABLE = "undecodable"  # the first record is CRC-valid but undecodable: reject it


def apply_scan(st: PartitionState, sc: Scan, fetched: int, config: ConsumerConfig) -> Step:
    """Fold one scanned reply into the partition's state (pure logic, no I/O)."""
    msgs = sc.messages
    floor = st.resync_floor
    if floor >= 0 and msgs:
        kept = [m for m in msgs if m.offset >= floor]
        if not kept:
            st.fetch_offset = sc.next_offset
            return Step.SKIPPED
        msgs = kept
        st.resync_floor = -1
    if sc.corrupt_at >= 0 and not msgs:
        st.crc_errors += 1
        st.fetch_offset = sc.corrupt_at
        return Step.RESYNC
    if sc.undecodable is not None and not msgs:
        return Step.UNDECODABLE  # the caller hands it to the reject policy, then st.skip()
    if msgs:
        st.buffer, st.index, st.attempts = msgs, 0, 0
        st.fetch_offset = sc.next_offset
        st.delay_ms = 0.0
        st.last_corrupt = -1
        if st.max_size > config.fetch_max_size and fetched < st.max_size // 2:
            st.max_size = max(st.max_size // 2, config.fetch_max_size)
        return Step.PROGRESS
    if sc.need > 0:
        if sc.need > config.fetch_max_size_cap or st.max_size >= config.fetch_max_size_cap:
            st.delay_ms = float(config.max_delay_fetch_ms)
            return Step.TOO_LARGE
        st.max_size = grown_size(st.max_size, sc.need, config.fetch_max_size_cap)
        return Step.GROW
    st.delay_ms = backoff(st.delay_ms, config.max_delay_fetch_ms)
    return Step.EMPTY
