"""Poll mode's ledger: what the last ``poll()`` returned, and when it counts as consumed.

Messages returned by one ``poll()`` count as consumed at the next ``poll()``, ``commit()`` or
``close()`` (Kafka's rule): :meth:`PollLedger.note` records a result as *unclaimed* (on its way
to the caller), :meth:`claim` once the caller has it (*returned*), :meth:`mark_consumed`
advances each partition's position past it, :meth:`rewind` fetches an unclaimed result again
(the caller never got it).  A ZooKeeper group's revoke waits with :meth:`wait` until the
application is done with the partitions it gives up.

Thread-safety: the engine's loop, except :meth:`claim` (the sync face calls it on the caller's
thread right after the poll returned: it only moves entries between two dicts, and a
partition is in one of them throughout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeAlias

from pymetaq.client.consumer.state import PartitionState
from pymetaq.client.types import TopicPartition

Lookup = Callable[[TopicPartition], PartitionState | None]
#: partitions the caller stopped part-way through (an iteration): the offset of the first
#: unprocessed message, the id of the last processed one (None: none processed)
Partly: TypeAlias = Mapping[TopicPartition, tuple[int, int | None]]


class PollLedger:
    """The last poll's result per partition (see the module docstring)."""

    def __init__(self) -> None:
        #: claimed by the caller: (position after it, last msg id)
        self.returned: dict[TopicPartition, tuple[int, int]] = {}
        #: on its way to the caller: (position after it, last msg id, first offset)
        self.unclaimed: dict[TopicPartition, tuple[int, int, int]] = {}
        self._consumed = asyncio.Event()  # binds to the loop on first use

    def note(self, tp: TopicPartition, pos: int, msg_id: int, first: int) -> None:
        self.unclaimed[tp] = (pos, msg_id, first)

    def claim(self) -> None:
        """The caller received the last poll's messages: they count as consumed at the next
        poll()/commit()."""
        for tp, (pos, mid, _first) in self.unclaimed.items():
            self.returned[tp] = (pos, mid)
        self.unclaimed = {}

    def rewind(self, lookup: Lookup) -> None:
        """The caller never received the last poll's messages: fetch them again."""
        for tp, (_pos, _mid, first) in self.unclaimed.items():
            st = lookup(tp)
            if st is not None:
                st.request_seek(first)
        self.unclaimed = {}
        self._consumed.set()

    def mark_consumed(
        self, lookup: Lookup, partly: Partly | None = None, *, final: bool = True
    ) -> None:
        """What the previous poll returned now counts as consumed; for a partition in
        ``partly`` only up to where the caller stopped — and, unless ``final``, the rest still
        counts at the next poll (``commit()`` in the middle of an iteration that goes on)."""
        held = {tp: self.returned.pop(tp) for tp in partly or () if tp in self.returned}
        for tp, (first, last_id) in (partly or {}).items():
            st = lookup(tp)
            if st is not None and last_id is not None and st.pending_seek is None:
                st.advance(first, last_id)
        for tp, (pos, mid) in self.returned.items():
            st = lookup(tp)
            if st is not None and st.pending_seek is None:
                st.advance(pos, mid)
        self.returned = {} if final else held
        self._consumed.set()

    def holds(self, tps: Iterable[TopicPartition]) -> bool:
        """Does the application hold messages of ``tps`` from its last poll?"""
        return any(tp in self.returned or tp in self.unclaimed for tp in tps)

    async def wait(self, tps: Sequence[TopicPartition], timeout_s: float) -> bool:
        """Wait until the application is done with the last poll's messages of ``tps`` (its
        next poll, commit or close); False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while self.holds(tps):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._consumed.clear()
            try:
                await asyncio.wait_for(self._consumed.wait(), left)
            except TimeoutError:
                return not self.holds(tps)
        return True

    def forget(self, tp: TopicPartition) -> None:
        """Drop what the last poll returned of ``tp`` (it will be delivered again)."""
        self.returned.pop(tp, None)
        self.unclaimed.pop(tp, None)
