"""Broker-wide bounds on what unauthenticated clients can make the broker hold.

- :class:`BodyBudget` - request bodies being received, across every connection.  A body up to
  ``FREE_BODY_BYTES`` needs nothing (every connection may hold that much); a larger one is
  *reserved* at its declared length before the connection reads on, and released when the
  frame is complete or the connection closes.  A connection that cannot get its reservation
  stops reading until one is free (first come, first served), so the bytes buffered for bodies
  stay below ``maxBufferedBodyBytes`` plus ``FREE_BODY_BYTES`` per connection, and a
  connection holding a reservation can always finish its body (no deadlock between large
  senders).  One reservation is always granted when nothing else is reserved, whatever its size.
- :class:`ConnectionCounts` - connections per source IP (``maxConnectionsPerIp``), next to the
  broker-wide ``maxConnections``.
- :class:`AutoCreated` - the partitions of topics that matched a ``[topic=...*...]`` pattern
  (``maxAutoCreatedPartitions``): each holds descriptors and a mapped segment, and any client
  can invent topic names.
- :class:`Throttled` - a log line at most once per interval per key (an attack must not turn
  into a flood of log lines).
- :func:`descriptor_shortfall` - whether RLIMIT_NOFILE can hold what the limits allow.
- :class:`MemoryReturn` - hands freed body memory back to the OS after large bodies were
  released (glibc keeps freed heap memory otherwise: measured, 16 half-sent 16 MiB bodies left
  the broker's RSS ~30 MB above its base after their connections closed; ``malloc_trim`` brings
  it back to within a few MB).

Thread-safety: used by the broker's event-loop thread only.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import resource
import time
from collections.abc import Callable, Iterable
from typing import Protocol

#: a body up to this size is received without a reservation
FREE_BODY_BYTES = 64 * 1024


class BudgetClient(Protocol):
    """A connection waiting for a reservation: told when it got one."""

    def budget_granted(self) -> None: ...


class BodyBudget:
    """Reservations of body bytes (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.released = 0  # bytes of reservations given back (MemoryReturn reads and resets it)
        self._held: dict[BudgetClient, int] = {}
        self._waiting: collections.OrderedDict[BudgetClient, int] = collections.OrderedDict()

    def reserve(self, client: BudgetClient, nbytes: int) -> bool:
        """Reserve ``nbytes`` for ``client``'s body; False = queued, ``budget_granted`` later."""
        if client in self._held:
            return True
        if not self._waiting and (self.used == 0 or self.used + nbytes <= self.limit):
            self._held[client] = nbytes
            self.used += nbytes
            return True
        self._waiting[client] = nbytes
        return False

    def held(self, client: BudgetClient) -> int:
        """The bytes reserved for ``client`` (0 if none)."""
        return self._held.get(client, 0)

    def release(self, client: BudgetClient) -> None:
        """Give back ``client``'s reservation (or its place in the queue); grant waiters."""
        self._waiting.pop(client, None)
        nbytes = self._held.pop(client, None)
        if nbytes is None:
            return
        self.used -= nbytes
        self.released += nbytes
        while self._waiting:
            waiter, want = next(iter(self._waiting.items()))
            if self.used and self.used + want > self.limit:
                break
            del self._waiting[waiter]
            self._held[waiter] = want
            self.used += want
            waiter.budget_granted()

    @property
    def waiting(self) -> int:
        return len(self._waiting)


class ConnectionCounts:
    """Open connections per source IP."""

    def __init__(self, per_ip: int) -> None:
        self.per_ip = per_ip
        self._counts: collections.Counter[str] = collections.Counter()

    def admit(self, ip: str) -> bool:
        if self._counts[ip] >= self.per_ip:
            return False
        self._counts[ip] += 1
        return True

    def release(self, ip: str) -> None:
        self._counts[ip] -= 1
        if self._counts[ip] <= 0:
            del self._counts[ip]

    def count(self, ip: str) -> int:
        return self._counts[ip]


class AutoCreated:
    """The partitions created for pattern-matched topics, against ``maxAutoCreatedPartitions``."""

    def __init__(self, limit: int, existing: Iterable[tuple[str, int]] = ()) -> None:
        self.limit = limit
        self._keys: set[tuple[str, int]] = set(existing)

    def reset(self, existing: Iterable[tuple[str, int]]) -> None:
        self._keys = set(existing)

    def admit(self, topic: str, partition: int) -> bool:
        """Count a new pattern partition; False when the cap is reached (nothing counted)."""
        key = (topic, partition)
        if key in self._keys:
            return True
        if len(self._keys) >= self.limit:
            return False
        self._keys.add(key)
        return True

    def forget(self, topic: str, partition: int) -> None:
        """The partition could not be created after all."""
        self._keys.discard((topic, partition))

    def __len__(self) -> int:
        return len(self._keys)


class Throttled:
    """``log(key, level, msg, *args)`` at most once per ``interval_s`` per key, with a count of
    the lines suppressed since the last one."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._interval, self._clock = logger, interval_s, clock
        self._last: dict[str, float] = {}
        self._suppressed: collections.Counter[str] = collections.Counter()

    def log(self, key: str, level: int, msg: str, *args: object) -> None:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] += 1
            return
        self._last[key] = now
        dropped = self._suppressed.pop(key, 0)
        if dropped:
            msg += f" (and {dropped} more like it in the last {self._interval:g} s)"
        self._log.log(level, msg, *args)


#: descriptors a broker needs besides connections and partitions (listener, logs, flusher...)
FD_RESERVE = 64


def descriptor_shortfall(max_connections: int, max_partitions: int) -> str | None:
    """A warning if the process's descriptor limit is below what ``max_connections``
    connections and ``max_partitions`` open partitions (two descriptors each: the segment and
    its map) may need; None if it fits.  Running short is survivable (EMFILE is answered 500
    and the broker keeps serving) but is better fixed with ``ulimit -n``."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + 2 * max_partitions + FD_RESERVE
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    return (
        f"RLIMIT_NOFILE is {soft} but maxConnections={max_connections} and "
        f"{max_partitions} partitions may need {need} descriptors: raise it (ulimit -n) or "
        "lower the limits"
    )


class MemoryReturn:
    """``maybe_trim(budget)``: after at least ``threshold`` bytes of large bodies were released,
    ask the C allocator to return free memory to the OS (glibc ``malloc_trim``; a no-op where
    there is none).  Called from the dispatcher's once-a-second sweep, so its cost (a walk of
    the allocator's free lists, well under a millisecond here) is paid at most once a second."""

    def __init__(self, threshold: int = 16 << 20) -> None:
        self.threshold = threshold
        self._trim: Callable[[int], int] | None
        try:  # the process's own symbols include the C library's
            self._trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):  # not glibc: nothing to trim with
            self._trim = None

    def maybe_trim(self, budget: BodyBudget) -> bool:
        if budget.released < self.threshold:
            return False
        budget.released = 0
        if self._trim is None:
            return False
        self._trim(0)
        return True
