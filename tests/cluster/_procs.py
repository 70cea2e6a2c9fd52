"""Group members as real processes (``tests/cluster/_member.py``) and the checks on their
history: who delivered which partition when, and what ZooKeeper says now.

Used by ``test_group_processes.py`` and ``bench/rebalance.py``.
"""

from __future__ import annotations

import itertools
import json
import math
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Self

from pymetaq.client.protocol.zk import ZkPaths

ROOT = Path(__file__).resolve().parents[2]
P = ZkPaths()


class ChildMember:
    """A group member process (``python -m <module> ...``); its events file (one JSON line per
    event, ``"ready"`` once started, ``"session"`` per ZooKeeper session) is its record."""

    def __init__(self, cid: str, workdir: Path, name: str, module: str, args: list[str]) -> None:
        self.cid = cid
        self.events_path = workdir / f"{name}.events"
        self.log_path = workdir / f"{name}.log"
        self.args = [sys.executable, "-m", module, *args, "--events", str(self.events_path)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.died_at: float | None = None  # monotonic time the process was reaped
        self.killed = False

    def start(self, timeout: float = 60.0) -> Self:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout
        while not any(e["ev"] == "ready" for e in self.events()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.cid} did not start:\n{self.log_path.read_text()}")
            time.sleep(0.02)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def events(self) -> list[dict[str, Any]]:
        try:
            lines = self.events_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.endswith("}")]

    def session(self) -> tuple[int, bytes]:
        last = [e for e in self.events() if e["ev"] == "session"][-1]
        return int(last["sid"]), bytes.fromhex(last["pwd"])

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.died_at = time.monotonic()
        return code

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.died_at = time.monotonic()  # no delivery can happen after the reaping
        self.killed = True

    def cleanup(self) -> None:
        if self.alive:
            self.kill()


class MemberProcess(ChildMember):
    """One coordinator-only member (``tests/cluster/_member.py``)."""

    def __init__(
        self,
        hosts: str,
        group: str,
        name: str,
        topics: str,
        workdir: Path,
        *,
        strategy: str = "DEFAULT",
        session_timeout_s: float = 2.0,
        retry_ms: int = 200,
    ) -> None:
        cid = f"{group}_{name}"
        super().__init__(cid, workdir, name, "tests.cluster._member", [
            *("--hosts", hosts, "--group", group, "--id", cid, "--topics", topics),
            *("--strategy", strategy, "--session-timeout", str(session_timeout_s)),
            *("--retry-ms", str(retry_ms)),
        ])  # fmt: skip

    def held(self) -> set[str]:
        """Partitions this member is delivering now, by its own account."""
        held: set[str] = set()
        for e in self.events():
            if e["ev"] == "assign":
                held |= set(e["parts"])
            elif e["ev"] in ("revoke", "lost"):
                held -= set(e["parts"])
            elif e["ev"] == "suspended":
                held.clear()
        return held

    def intervals(self) -> list[tuple[str, float, float]]:
        """(partition, from, to) for every delivery period; a period still open ends at the
        process's death (SIGKILL) or at infinity (still running)."""
        out, start = [], {}
        for e in self.events():
            if e["ev"] == "suspended":
                out += [(p, t, e["t"]) for p, t in start.items()]
                start.clear()
            for p in e.get("parts", ()):
                if e["ev"] == "assign":
                    start[p] = e["t"]
                elif p in start:
                    out.append((p, start.pop(p), e["t"]))
        end = self.died_at if self.died_at is not None else math.inf
        out += [(p, t, end) for p, t in start.items()]
        return out


def overlaps(members: list[MemberProcess]) -> list[str]:
    """Every moment two members delivered the same partition (should be none)."""
    by_part: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for m in members:
        for p, t0, t1 in m.intervals():
            by_part[p].append((t0, t1, m.cid))
    bad = []
    for p, spans in by_part.items():
        spans.sort()
        for (a0, a1, am), (b0, b1, bm) in itertools.pairwise(spans):
            if b0 < a1:
                bad.append(f"{p}: {am} [{a0:.3f}, {a1:.3f}] overlaps {bm} [{b0:.3f}, {b1:.3f}]")
    return bad


def owners(zk: Any, group: str, topic: str) -> dict[str, str]:
    from kazoo.exceptions import NoNodeError

    out = {}
    try:
        names = zk.get_children(P.owners(group, topic))
    except NoNodeError:
        return out
    for name in names:
        try:
            out[name] = zk.get(P.owner(group, topic, name))[0].decode()
        except NoNodeError:
            pass
    return out


def members(zk: Any, group: str) -> set[str]:
    from kazoo.exceptions import NoNodeError

    try:
        return set(zk.get_children(P.consumer_ids(group)))
    except NoNodeError:
        return set()


def settled(
    zk: Any,
    group: str,
    topic: str,
    live: list[MemberProcess],
    partitions: list[str],
    expect: dict[str, tuple[str, ...]] | None,
) -> bool:
    """ZooKeeper and every live member agree on a complete, balanced (or exact) assignment."""
    if members(zk, group) != {m.cid for m in live}:
        return False
    own = owners(zk, group, topic)
    if sorted(own) != sorted(partitions):
        return False
    if expect is not None:
        if own != {p: m for m, ps in expect.items() for p in ps}:
            return False
    else:  # balanced
        counts = sorted(sum(1 for o in own.values() if o == m.cid) for m in live)
        if counts and counts[-1] - counts[0] > 1:
            return False
    return all(m.held() == {f"{topic}:{p}" for p, o in own.items() if o == m.cid} for m in live)


class OwnerHistory:
    """Reads every owner node of ``group``/``topic`` in a loop (its own kazoo client and thread)
    and keeps each read as (partition, owner or None, sent, received): the value was true at
    some moment inside [sent, received]."""

    def __init__(self, hosts: str, group: str, topic: str) -> None:
        from tests.cluster.conftest import new_client

        self.client = new_client(hosts, session_timeout_s=10.0)
        self.group, self.topic = group, topic
        self.reads: list[tuple[str, str | None, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="owner-history", daemon=True)

    def start(self) -> OwnerHistory:
        self._thread.start()
        return self

    def _run(self) -> None:
        from kazoo.exceptions import KazooException, NoNodeError

        base = P.owners(self.group, self.topic)
        known: set[str] = set()
        while not self._stop.is_set():
            try:
                known |= set(self.client.get_children(base))
            except NoNodeError:
                pass
            except KazooException:
                self._stop.wait(0.05)
                continue
            for part in sorted(known):
                t0 = time.monotonic()
                try:
                    owner: str | None = self.client.get(f"{base}/{part}")[0].decode()
                except NoNodeError:
                    owner = None
                except KazooException:
                    continue
                self.reads.append((part, owner, t0, time.monotonic()))
            self._stop.wait(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.stop()
        self.client.close()

    def handoffs(self) -> int:
        """How many times a partition was seen owned by a different member than before."""
        last: dict[str, str] = {}
        n = 0
        for part, owner, _, _ in self.reads:
            if owner is not None:
                if part in last and last[part] != owner:
                    n += 1
                last[part] = owner
        return n

    def violations(self, members: list[MemberProcess]) -> tuple[list[str], list[str]]:
        """(reads showing partition p owned by *another member* entirely inside a period in
        which a member was delivering p — fencing says never —, reads showing p owned by
        *nobody* during such a period).  The second can happen: when a session is expired
        from outside, the server deletes the member's nodes and the member learns it from its
        dropped connection an instant later (longer if the process is not scheduled)."""
        periods: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
        for m in members:
            for p, t0, t1 in m.intervals():
                periods[p.split(":", 1)[1]].append((t0, t1, m.cid))
        bad, unowned = [], []
        for part, owner, sent, received in self.reads:
            for t0, t1, cid in periods.get(part, ()):
                if owner != cid and t0 < sent and received < t1:
                    note = f"{part}: owner {owner} read at {sent:.3f} while {cid} delivered"
                    (unowned if owner is None else bad).append(note)
        return bad, unowned
