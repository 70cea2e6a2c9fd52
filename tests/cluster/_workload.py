"""A cluster under load for the tests and ``bench/cluster.py``: consumer-group members as
processes (``tests/cluster/_consumer.py``), a producer thread, and the checks on what happened.

* :class:`ConsumerMember` — one member process and its events file (see ``_consumer.py``):
  what it holds by its own account, its sessions, its deliveries.
* :class:`LoadProducer` — a ``zk://`` producer thread sending sequence numbers, paced, keeping
  the acknowledged ones (and every failure).
* :func:`check_history` — over all members: every delivery happened while its member held the
  partition; no two members processed one partition at the same time (each holding period's
  *span*, from its first delivery's start to its last delivery's end, overlaps no other
  member's span of that partition); every acknowledged message was delivered; every message
  delivered twice (the same partition and offset) was first delivered by a member that died
  or lost its session afterwards, before committing it — counted.
* :func:`group_settled` — ZooKeeper's owner nodes hold the DEFAULT assignment of the current
  ``topics-sub`` partitions over the live members, and each member holds exactly its share.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymetaq.client.cluster.assignors import get_assignor
from pymetaq.client.producer.sync import Producer
from pymetaq.client.protocol.zk import ZkPaths, decode_topic_broker, parse_broker_node
from tests.cluster._procs import ChildMember

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Delivery:
    member: str
    part: str  # "<brokerId>-<partition>"
    offset: int
    seq: int
    t0: float
    t1: float


class ConsumerMember(ChildMember):
    """One consumer process of group ``group`` (consumer id ``<group>_<name>``)."""

    def __init__(
        self,
        servers: str,
        group: str,
        name: str,
        topic: str,
        workdir: Path,
        *,
        session_ms: int = 2000,
        sync_ms: int = 200,
    ) -> None:
        super().__init__(f"{group}_{name}", workdir, name, "tests.cluster._consumer", [
            *("--servers", servers, "--group", group, "--name", name, "--topic", topic),
            *("--session-ms", str(session_ms), "--sync-ms", str(sync_ms)),
        ])  # fmt: skip
        self.topic = topic

    def held(self) -> set[str]:
        """``topic:b-p`` this member holds now, by its own account."""
        held: set[str] = set()
        for e in self.events():
            if e["ev"] == "assign":
                held |= set(e["parts"])
            elif e["ev"] in ("revoked", "lost"):
                held -= set(e["parts"])
            elif e["ev"] == "suspended":
                held.clear()
        return held

    def deliveries(self, events: list[dict[str, Any]] | None = None) -> list[Delivery]:
        return [
            Delivery(self.cid, e["p"], e["o"], e["s"], e["t0"], e["t1"])
            for e in (events if events is not None else self.events())
            if e["ev"] == "d"
        ]

    def periods(self, events: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
        """(partition key, from, to): while this member held it by its own account, from
        ``assign`` to the ``revoked``/``lost`` logged once the hand-off returned (nothing of the
        partition is delivered after that); a period still open ends at the process's death
        (or never).  ``suspended`` does not end one: the fence it sets cannot be atomic with a
        worker that just checked it, so one delivery may begin after it, before the ``lost``
        that always follows (the coordinator calls ``on_lost`` at once)."""
        out: list[tuple[str, float, float]] = []
        start: dict[str, float] = {}
        for e in events:
            if e["ev"] == "assign":
                for p in e["parts"]:
                    start.setdefault(p.split(":", 1)[1], e["t"])
            elif e["ev"] in ("revoked", "lost"):
                for p in e["parts"]:
                    key = p.split(":", 1)[1]
                    if key in start:
                        out.append((key, start.pop(key), e["t"]))
        end = self.died_at if self.died_at is not None else math.inf
        return out + [(k, t, end) for k, t in start.items()]

    def troubles(self, events: list[dict[str, Any]]) -> list[float]:
        """When this member lost (or may have lost) its session: its uncommitted work may be
        delivered again by the next owner."""
        out = [e["t"] for e in events if e["ev"] == "suspended"]
        return out + ([self.died_at] if self.killed and self.died_at is not None else [])


class LoadProducer:
    """A thread sending ``str(seq)`` to ``topic`` through ``servers`` every ``interval_s``
    (round robin, one message per ``send``); keeps the acknowledged sequence numbers."""

    def __init__(
        self, servers: str, topic: str, *, interval_s: float = 0.002, **config: Any
    ) -> None:
        self.producer = Producer(servers, **config)
        self.topic = topic
        self.interval_s = interval_s
        self.acked: dict[int, tuple[str, int]] = {}  # seq -> (partition key, offset)
        self.failed: list[tuple[int, str]] = []
        self.latencies: list[tuple[float, float]] = []  # (sent at, seconds to the ack)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-producer", daemon=True)

    def start(self) -> LoadProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            seq += 1
            t0 = time.monotonic()
            r = self.producer.send(self.topic, str(seq).encode())
            self.latencies.append((t0, time.monotonic() - t0))
            if r.success:
                self.acked[seq] = (r.partition_key, r.offset)
            else:
                self.failed.append((seq, repr(r.error)))
            self._stop.wait(self.interval_s)

    def acked_count(self) -> int:
        return len(self.acked)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.producer.close()


@dataclass
class History:
    """What :func:`check_history` found (every list should be empty)."""

    outside: list[str] = field(default_factory=list)  # delivered while not holding
    overlaps: list[str] = field(default_factory=list)  # two members at once
    lost: list[int] = field(default_factory=list)  # acknowledged, never delivered
    unexplained: list[str] = field(default_factory=list)  # redelivered without a cause
    duplicates: int = 0  # (partition, offset) delivered again after a member died
    deliveries: int = 0
    spans: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)


def _explained(
    prev: Delivery,
    again: Delivery,
    troubles: list[float],
    periods: list[tuple[str, float, float]],
) -> bool:
    """Is delivering ``prev`` again (``again``) explained by ``prev``'s member losing (or
    perhaps losing) its session? Yes when the trouble came between the two deliveries, or
    earlier in the period in which the member held the partition and delivered ``prev``: the
    fence a suspension sets cannot be atomic with a worker that just checked it, so one
    delivery may begin after the suspension, before the ``lost`` that ends the period
    (:meth:`ConsumerMember.periods`), and its offset is never committed."""
    if any(prev.t0 <= t <= again.t0 for t in troubles):
        return True
    for part, start, end in periods:
        if part == prev.part and start <= prev.t0 <= end:
            return any(start <= t <= prev.t0 for t in troubles)
    return False


def check_history(members: list[ConsumerMember], acked: dict[int, tuple[str, int]]) -> History:
    h = History()
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    everything: list[Delivery] = []
    troubles: dict[str, list[float]] = {}
    member_periods: dict[str, list[tuple[str, float, float]]] = {}
    for m in members:
        events = m.events()
        ds = m.deliveries(events)
        everything += ds
        troubles[m.cid] = m.troubles(events)
        by_part: dict[str, list[Delivery]] = defaultdict(list)
        for d in ds:
            by_part[d.part].append(d)
        periods = member_periods[m.cid] = m.periods(events)
        for d in ds:
            if not any(p == d.part and t0 <= d.t0 <= t1 for p, t0, t1 in periods):
                h.outside.append(f"{m.cid} delivered {d.part}@{d.offset} at {d.t0:.3f}")
        for part, t0, t1 in periods:
            inside = [d for d in by_part[part] if t0 <= d.t0 <= t1]
            if inside:
                spans[part].append((min(d.t0 for d in inside), max(d.t1 for d in inside), m.cid))
    for part, ss in spans.items():
        ss.sort()
        end, owner = -math.inf, ""
        for s0, s1, cid in ss:
            if s0 < end and cid != owner:
                h.overlaps.append(f"{part}: {cid} from {s0:.3f} while {owner} until {end:.3f}")
            if s1 > end:
                end, owner = s1, cid
    h.spans = dict(spans)
    h.deliveries = len(everything)
    delivered = {d.seq for d in everything}
    h.lost = sorted(s for s in acked if s not in delivered)
    first: dict[tuple[str, int], Delivery] = {}
    for d in sorted(everything, key=lambda d: d.t0):
        key = (d.part, d.offset)
        prev = first.get(key)
        if prev is None:
            first[key] = d
            continue
        h.duplicates += 1
        if not _explained(prev, d, troubles[prev.member], member_periods.get(prev.member, [])):
            h.unexplained.append(
                f"{d.part}@{d.offset}: {prev.member} at {prev.t0:.3f}, again {d.member} at "
                f"{d.t0:.3f}"
            )
        first[key] = d
    return h


def partitions(zk: Any, paths: ZkPaths, topic: str) -> list[str]:
    """The ``topics-sub`` partitions of ``topic`` as a consumer reads them."""
    from kazoo.exceptions import NoNodeError

    out: list[str] = []
    base = paths.topic_sub(topic)
    try:
        children = zk.get_children(base)
    except NoNodeError:
        return out
    for name in children:
        try:
            node = parse_broker_node(name)
            n = decode_topic_broker(zk.get(f"{base}/{name}")[0]).num_parts
        except (ValueError, NoNodeError):
            continue
        out += [f"{node.broker_id}-{p}" for p in range(n)]
    return out


def owners(zk: Any, paths: ZkPaths, group: str, topic: str) -> dict[str, str]:
    from kazoo.exceptions import NoNodeError

    out: dict[str, str] = {}
    try:
        names = zk.get_children(paths.owners(group, topic))
    except NoNodeError:
        return out
    for name in names:
        try:
            out[name] = zk.get(paths.owner(group, topic, name))[0].decode()
        except NoNodeError:
            pass
    return out


def group_settled(
    zk: Any, paths: ZkPaths, group: str, topic: str, live: list[ConsumerMember]
) -> bool:
    """The DEFAULT assignment is in place: owner nodes and every member's own account."""
    parts = partitions(zk, paths, topic)
    expect = get_assignor("DEFAULT").assign([m.cid for m in live], parts, {})
    own = owners(zk, paths, group, topic)
    if own != {p: m for m, ps in expect.items() for p in ps}:
        return False
    return all(m.held() == {f"{topic}:{p}" for p in expect[m.cid]} for m in live)
