"""Partition assignment for consumer groups: pure functions of (members, partitions, owners).

Every member of a group computes the whole group's assignment for a topic from the same
inputs read from ZooKeeper and claims its own share, so the functions must be deterministic
and must agree with MetaQ's Java ones bit for bit (a mixed group of MetaQ and pymetaq
consumers then agrees).  Inputs are MetaQ's strings: consumer ids (``<group>_<id>``) and
partition names (``"<brokerId>-<partition>"``); each function sorts them itself.

- :data:`DEFAULT` (MetaQ ``DefaultLoadBalanceStrategy``): consumers and partitions sorted as
  Java strings (so ``"0-10"`` sorts before ``"0-2"``); consumer *i* of *C* over *P* partitions
  takes ``P//C`` (+1 if ``i < P%C``) consecutive partitions starting at
  ``P//C*i + min(i, P%C)``.  Consumers beyond *P* get nothing.
- :data:`CONSIST` (MetaQ ``ConsisHashStrategy``): a ketama ring with 160 points per consumer:
  for ``i`` in 0..39 the MD5 of ``"<consumerId>-<i>"`` gives four points, the little-endian
  uint32s at bytes 0, 4, 8, 12.  Points are inserted consumer by consumer in sorted order, so
  on a collision the later consumer wins (Java's ``TreeMap.put``).  A partition goes to the
  point at or after ``ketama(partition)`` (little-endian uint32 of the first four MD5 bytes of
  its UTF-8 name), wrapping to the first point.
- :data:`STICKY` (pymetaq): balanced like DEFAULT (every member gets ``P//C`` or ``P//C+1``)
  and moves as few partitions as possible.  It also reads the current owners: each member
  keeps its owned partitions up to its quota, the ``P%C`` larger quotas go first to members
  that already own at least ``P//C+1``, and the partitions nobody keeps are dealt out in sorted
  order to the members short of their quota, in sorted member order.  The result does not
  change while a hand-off is in progress (members releasing partitions beyond their quota,
  members claiming partitions dealt to them), so members that read the owners at different
  moments of one rebalance still compute the same assignment (tested).  Owners that are not
  current members count as nobody.  A pymetaq-only strategy: do not mix it with MetaQ clients.

Thread-safety: pure functions and immutable singletons.
"""

from __future__ import annotations

import hashlib
import struct
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pymetaq.client.protocol.zk import java_sort_key, java_utf8

#: points per consumer on MetaQ's ketama ring (``ConsisHashStrategy.NUM_REPS``).
KETAMA_POINTS = 160

Assignment = dict[str, tuple[str, ...]]


class Assignor(Protocol):
    """Computes one topic's assignment: member -> its partitions (every member is a key)."""

    @property
    def name(self) -> str: ...

    @property
    def uses_owners(self) -> bool:
        """True if :meth:`assign` reads ``owners`` (the coordinator then reads owner nodes)."""
        ...

    def assign(
        self, members: Sequence[str], partitions: Sequence[str], owners: Mapping[str, str]
    ) -> Assignment: ...


def java_sorted(items: Sequence[str]) -> list[str]:
    """Distinct items in Java ``String.compareTo`` order."""
    return sorted(set(items), key=java_sort_key)


# --------------------------------------------------------------------------- DEFAULT


def range_assign(members: Sequence[str], partitions: Sequence[str]) -> Assignment:
    """MetaQ's DEFAULT strategy (see the module docstring)."""
    cons, parts = java_sorted(members), java_sorted(partitions)
    out: Assignment = {m: () for m in cons}
    if not cons:
        return out
    per, extra = divmod(len(parts), len(cons))
    for i, m in enumerate(cons):
        start = per * i + min(i, extra)
        out[m] = tuple(parts[start : start + per + (1 if i < extra else 0)])
    return out


# --------------------------------------------------------------------------- CONSIST


def ketama_hash(key: str) -> int:
    """xmemcached's ``HashAlgorithm.KETAMA_HASH``: the first 4 MD5 bytes, little-endian."""
    return int(struct.unpack_from("<I", hashlib.md5(java_utf8(key)).digest())[0])


def ketama_points(consumer: str) -> list[int]:
    """The 160 ring points of one consumer, in MetaQ's insertion order."""
    points: list[int] = []
    for i in range(KETAMA_POINTS // 4):
        digest = hashlib.md5(java_utf8(f"{consumer}-{i}")).digest()
        points.extend(struct.unpack("<4I", digest))
    return points


def ketama_ring(members: Sequence[str]) -> tuple[list[int], list[str]]:
    """Sorted ring points and the consumer at each (a later consumer wins a collision)."""
    ring: dict[int, str] = {}
    for m in java_sorted(members):
        for p in ketama_points(m):
            ring[p] = m
    keys = sorted(ring)
    return keys, [ring[k] for k in keys]


def ketama_assign(members: Sequence[str], partitions: Sequence[str]) -> Assignment:
    """MetaQ's CONSIST strategy (see the module docstring)."""
    cons = java_sorted(members)
    out: dict[str, list[str]] = {m: [] for m in cons}
    if not cons:
        return {}
    keys, owners = ketama_ring(cons)
    for part in java_sorted(partitions):
        i = bisect_left(keys, ketama_hash(part))
        out[owners[i if i < len(keys) else 0]].append(part)
    return {m: tuple(ps) for m, ps in out.items()}


# --------------------------------------------------------------------------- STICKY


def sticky_assign(
    members: Sequence[str], partitions: Sequence[str], owners: Mapping[str, str]
) -> Assignment:
    """Balanced, fewest moves, stable during a hand-off (see the module docstring)."""
    cons, parts = java_sorted(members), java_sorted(partitions)
    if not cons:
        return {}
    per, extra = divmod(len(parts), len(cons))
    member_set = set(cons)
    owned: dict[str, list[str]] = {m: [] for m in cons}
    for p in parts:  # sorted, so each owned list is sorted too
        o = owners.get(p)
        if o in member_set:
            owned[o].append(p)
    # The `extra` larger quotas: members already holding >= per+1 first, then sorted order.
    # Holding >= per+1 cannot start or stop during a hand-off, so neither can this choice.
    ranked = sorted(cons, key=lambda m: (len(owned[m]) <= per, java_sort_key(m)))
    quota = {m: per + (1 if i < extra else 0) for i, m in enumerate(ranked)}
    keep = {m: owned[m][: quota[m]] for m in cons}
    kept = {p for ps in keep.values() for p in ps}
    free = iter([p for p in parts if p not in kept])
    out: Assignment = {}
    for m in cons:
        need = quota[m] - len(keep[m])
        out[m] = tuple(sorted([*keep[m], *(next(free) for _ in range(need))], key=java_sort_key))
    return out


# --------------------------------------------------------------------------- the strategies


@dataclass(frozen=True)
class Strategy:
    """An :class:`Assignor` made of a name and an assignment function."""

    name: str
    uses_owners: bool
    fn: Callable[[Sequence[str], Sequence[str], Mapping[str, str]], Assignment]

    def assign(
        self, members: Sequence[str], partitions: Sequence[str], owners: Mapping[str, str]
    ) -> Assignment:
        return self.fn(members, partitions, owners)


DEFAULT: Assignor = Strategy("DEFAULT", False, lambda m, p, _o: range_assign(m, p))
CONSIST: Assignor = Strategy("CONSIST", False, lambda m, p, _o: ketama_assign(m, p))
STICKY: Assignor = Strategy("STICKY", True, sticky_assign)
ASSIGNORS: dict[str, Assignor] = {a.name: a for a in (DEFAULT, CONSIST, STICKY)}


def get_assignor(name: str | Assignor) -> Assignor:
    """``"DEFAULT"`` | ``"CONSIST"`` | ``"STICKY"`` (any case), or an Assignor as is."""
    if not isinstance(name, str):
        return name
    try:
        return ASSIGNORS[name.strip().upper()]
    except KeyError:
        raise ValueError(
            f"unknown assignment strategy {name!r} (choose from {', '.join(ASSIGNORS)})"
        ) from None
