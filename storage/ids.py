"""Broker-assigned message ids, MetaQ's IdWorker layout.

| bits   | field                                       |
|--------|---------------------------------------------|
| 63..22 | milliseconds since 1303895660503 (MetaQ)    |
| 21..12 | broker id (0..1023)                         |
| 11..0  | sequence within the millisecond (0..4095)   |

Unlike MetaQ (which fails when the clock goes back) the worker keeps a logical clock that never
goes below the last id it issued or was seeded with, so ids are strictly increasing per broker
even if the wall clock steps back; when the 4096 sequence numbers of a millisecond are used up,
the logical clock moves to the next millisecond.  ``reserve(n)`` returns the first of ``n``
consecutive ids, all within one millisecond, so a batch never carries into the broker-id bits
(hence ``n <= 4096``).

Thread-safe: one lock around the state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

EPOCH_MS = 1303895660503
BROKER_BITS = 10
SEQ_BITS = 12
MAX_BROKER_ID = (1 << BROKER_BITS) - 1
SEQ_LIMIT = 1 << SEQ_BITS  # 4096 ids per millisecond
TIME_SHIFT = BROKER_BITS + SEQ_BITS  # 22


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def id_time_ms(msg_id: int) -> int:
    """The epoch milliseconds encoded in an id."""
    return (msg_id >> TIME_SHIFT) + EPOCH_MS


class IdWorker:
    """Issues strictly increasing ids for one broker; ``clock`` returns epoch milliseconds."""

    def __init__(self, broker_id: int, clock: Callable[[], int] = _wall_ms) -> None:
        if not 0 <= broker_id <= MAX_BROKER_ID:
            raise ValueError(f"broker id {broker_id} outside 0..{MAX_BROKER_ID}")
        self.broker_id = broker_id
        self._clock = clock
        self._lock = threading.Lock()
        self._last_ms = -1  # logical milliseconds since EPOCH_MS
        self._next_seq = 0

    def observe(self, msg_id: int) -> None:
        """Make every future id greater than ``msg_id`` (seed from the logs at open)."""
        if msg_id <= 0:
            return
        floor_ms = (msg_id >> TIME_SHIFT) + 1
        with self._lock:
            if floor_ms > self._last_ms:
                self._last_ms, self._next_seq = floor_ms, 0

    def reserve(self, n: int = 1) -> int:
        """The first of ``n`` consecutive ids (``1 <= n <= 4096``)."""
        if not 1 <= n <= SEQ_LIMIT:
            raise ValueError(f"can reserve 1..{SEQ_LIMIT} ids at once, not {n}")
        now = self._clock() - EPOCH_MS
        with self._lock:
            if now > self._last_ms:
                self._last_ms, self._next_seq = now, 0
            elif self._next_seq + n > SEQ_LIMIT:
                self._last_ms, self._next_seq = self._last_ms + 1, 0
            seq = self._next_seq
            self._next_seq = seq + n
            return (self._last_ms << TIME_SHIFT) | (self.broker_id << SEQ_BITS) | seq

    # -- batch stamping: the caller validates and stamps under ``lock`` in one pass --------

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def open_locked(self) -> tuple[int, int]:
        """(first id, room left in this millisecond); call with :attr:`lock` held."""
        now = self._clock() - EPOCH_MS
        if now > self._last_ms:
            self._last_ms, self._next_seq = now, 0
        elif self._next_seq >= SEQ_LIMIT:
            self._last_ms, self._next_seq = self._last_ms + 1, 0
        return self._base() | self._next_seq, SEQ_LIMIT - self._next_seq

    def skip_ms_locked(self) -> int:
        """Move the logical clock to the next millisecond; return its first id."""
        self._last_ms, self._next_seq = self._last_ms + 1, 0
        return self._base()

    def commit_locked(self, n: int) -> None:
        """Consume ``n`` ids from the position returned by the last open/skip."""
        self._next_seq += n

    def _base(self) -> int:
        return (self._last_ms << TIME_SHIFT) | (self.broker_id << SEQ_BITS)

    def next_id(self) -> int:
        return self.reserve(1)

    def high_water(self) -> int:
        """An id >= every id issued or observed so far (0 if none)."""
        with self._lock:
            if self._last_ms < 0:
                return 0
            return (self._last_ms << TIME_SHIFT) | ((1 << TIME_SHIFT) - 1)

    @property
    def last_ms(self) -> int:
        """The logical clock (ms since MetaQ's epoch) of the last issued or observed id."""
        return self._last_ms
