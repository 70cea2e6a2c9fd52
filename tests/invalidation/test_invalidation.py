"""Broadcast config invalidation keeps its promises.

* Five subscriber processes (``tests/invalidation/_subscriber.py``: a ``ConfigCache`` serving
  random keys), random ``invalidate``/``publish_config`` events, subscribers SIGKILLed and
  restarted mid-run (seeded): every subscriber sees every event published after it first
  registered (a restarted one catches up on what it missed), and no ``get`` ever returns a
  value older than the last event the subscriber had applied before it.
* A subscriber away longer than retention reloads everything instead of serving its snapshot.
* Unit: the event format; a load that races an invalidation is not cached.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from pymetaq.client.invalidation import ConfigCache, ConfigPublisher
from pymetaq.client.invalidation.event import decode, encode, make_event
from pymetaq.client.types import TopicPartition
from tests._broker import BrokerProcess
from tests._helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.crash]

SUBSCRIBERS = 5
KEYS = 12


class Publisher(threading.Thread):
    """Bumps a random key's version in the database, then invalidates it or publishes the
    new version, at ``rate`` per second; records (id, key, version, time before the send)."""

    def __init__(self, servers: str, topic: str, db: Path, rng: random.Random, rate: float) -> None:
        super().__init__(daemon=True)
        self.pub = ConfigPublisher(servers, topic)
        self.con = sqlite3.connect(db, check_same_thread=False, timeout=30)
        self.rng, self.rate = rng, rate
        self.version = dict.fromkeys((f"k{i}" for i in range(KEYS)), 0)
        self.sent: list[tuple[str, str, int, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            key = self.rng.choice(sorted(self.version))
            self.version[key] += 1
            v = self.version[key]
            with self.con:
                self.con.execute("UPDATE config SET version = ? WHERE key = ?", (v, key))
            eid = f"e{n}"
            t = time.time()
            if self.rng.random() < 0.5:
                self.pub.invalidate(key, event_id=eid)
            else:
                self.pub.publish_config(key, v, event_id=eid)
            self.sent.append((eid, key, v, t))
            n += 1
            self.stop.wait(self.rng.expovariate(self.rate))
        self.pub.close()


class Subscriber:
    def __init__(self, name: str, servers: str, topic: str, work: Path, db: Path) -> None:
        self.name = name
        self.log = work / f"{name}.log"
        self.argv = [sys.executable, "-m", "tests.invalidation._subscriber", servers, topic,
                     str(work / f"state-{name}"), name, str(db), str(self.log), str(KEYS)]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        with open(f"{self.log}.err", "ab") as err:
            self.proc = subprocess.Popen(self.argv, stderr=err)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def ready_count(self) -> int:
        return sum(1 for line in self.lines() if line.startswith("ready "))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:  # where is it stuck? (the stacks go to .log.err)
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            self.kill()
            code = None
        assert code == 0, self.log.with_suffix(".log.err").read_text()[-6000:]


def restarted(s: Subscriber, ready_before: int) -> bool:
    return s.ready_count() > ready_before


def check_subscriber(s: Subscriber, sent: list[tuple[str, str, int, float]]) -> int:
    """Coverage and no stale serve for one subscriber's log; the number of gets checked."""
    info = {eid: (key, v, t) for eid, key, v, t in sent}
    lines = s.lines()
    first_ready = float(next(x for x in lines if x.startswith("ready ")).split()[1])
    received = {x.split()[1] for x in lines if x.startswith("E ")}
    due = {eid for eid, _k, _v, t in sent if t > first_ready}
    missing = due - received
    assert not missing, f"{s.name} never saw {len(missing)} events, e.g. {sorted(missing)[:5]}"
    floor: dict[str, int] = {}
    served = 0
    for x in lines:
        if x.startswith("E "):
            key, v, _t = info[x.split()[1]]
            floor[key] = max(floor.get(key, 0), v)
        elif x.startswith("S "):
            _s, key, value = x.split()
            assert value != "None" and int(value) >= floor.get(key, 0), (
                f"{s.name} served {key}={value} after applying version {floor.get(key)}"
            )
            served += 1
    return served


@pytest.mark.parametrize(
    ("seconds", "restarts"), [(6, 2), pytest.param(16, 6, marks=pytest.mark.slow)]
)
def test_five_subscribers_see_every_event_and_never_serve_stale(
    tmp_path: Path, seed: int, seconds: float, restarts: int
) -> None:
    rng = random.Random(seed)
    db = tmp_path / "config.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE config (key text PRIMARY KEY, version integer NOT NULL)")
        con.executemany("INSERT INTO config VALUES (?, 0)", [(f"k{i}",) for i in range(KEYS)])
    with BrokerProcess.start(tmp_path / "b", topics={"app-config": {"numPartitions": 2}}) as broker:
        servers = f"meta://{broker.host}:{broker.port}"
        subs = [
            Subscriber(f"s{i}", servers, "app-config", tmp_path, db) for i in range(SUBSCRIBERS)
        ]
        try:
            for s in subs:
                s.start()
            wait_for(lambda: all(s.ready_count() for s in subs), 120, "subscribers ready")
            pub = Publisher(servers, "app-config", db, rng, rate=150)
            pub.start()
            pause = threading.Event()
            kill_at = sorted(rng.uniform(0.5, seconds - 1.5) for _ in range(restarts))
            t0 = time.monotonic()
            for at in kill_at:
                pause.wait(max(0.0, t0 + at - time.monotonic()))
                victim = rng.choice(subs)
                if victim.proc is not None and victim.proc.poll() is None:
                    victim.kill()
                    pause.wait(rng.uniform(0.1, 1.0))  # events are missed meanwhile
                    n = victim.ready_count()
                    victim.start()
                    victim.restarts += 1
                    wait_for(partial(restarted, victim, n), 120, "restarted subscriber")
            pause.wait(max(0.0, t0 + seconds - time.monotonic()))
            pub.stop.set()
            pub.join(30)
            ids = {eid for eid, *_ in pub.sent}

            def caught_up() -> bool:
                return all(
                    ids <= {x.split()[1] for x in s.lines() if x.startswith("E ")} for s in subs
                )

            wait_for(caught_up, 60, "every subscriber saw every event")
            for s in subs:
                s.terminate()
        finally:
            for s in subs:
                if s.proc is not None and s.proc.poll() is None:
                    s.kill()
    served = [check_subscriber(s, pub.sent) for s in subs]
    print(f"{len(pub.sent)} events; restarts {[s.restarts for s in subs]}; gets checked {served}")
    assert sum(s.restarts for s in subs) == restarts
    assert all(n > 0 for n in served)


def test_away_longer_than_retention_reloads_everything(tmp_path: Path) -> None:
    db = {"a": 1, "b": 1}
    system = {"maxSegmentSize": 4096, "deletePolicy": "delete,1s", "deleteWhen": "every 1s"}
    with BrokerProcess.start(tmp_path / "b", system=system, topics={"cfg": {}}) as broker:
        servers = f"meta://{broker.host}:{broker.port}"
        state = tmp_path / "state"
        with ConfigCache(servers, "cfg", db.get, state_dir=state, instance_id="app1") as cache:
            assert cache.get("a") == 1
            with ConfigPublisher(servers, "cfg") as pub:
                pub.publish_config("b", 2)
            wait_for(lambda: cache.peek("b") == 2, 30, "the first event")
            assert cache.stats["reloads"] == 1  # a new instance: started from "now"
        with ConfigCache(servers, "cfg", db.get, state_dir=state, instance_id="app1") as cache:
            assert cache.stats["restored"] == 1 and cache.peek("b") == 2  # resumed
        tp = TopicPartition("cfg", 0, 0)
        with ConfigPublisher(servers, "cfg") as pub:  # while app1 is away: roll segments
            for i in range(150):  # ~120 bytes each: 4 segments of 4 KiB
                pub.publish_config("b", 100 + i)
            db["a"], db["b"] = 7, 7  # and the source of truth changes
            from pymetaq.client import Consumer

            with Consumer(servers, None) as c:
                c.subscribe("cfg")
                committed = (state / "offsets.json").read_text()

                def retention_ran() -> bool:
                    first = c.beginning_offsets([tp])[tp]
                    return first >= 4096  # the first segment (app1's offset is in it) is gone

                wait_for(retention_ran, 60, "retention deleted the old segments")
                assert c.end_offsets([tp])[tp] > c.beginning_offsets([tp])[tp]
        with ConfigCache(servers, "cfg", db.get, state_dir=state, instance_id="app1") as cache:
            assert cache.stats["restored"] == 0 and cache.stats["reloads"] == 1
            assert cache.peek("b") is None  # the snapshot (b=2) was dropped, not served
            assert cache.get("a") == 7 and cache.get("b") == 7
        assert committed


def test_event_format_and_a_load_raced_by_an_invalidation_is_not_cached() -> None:
    e = make_event("set", "k", {"x": [1, "é"]}, "id1")
    assert decode(encode(e)) == e
    assert decode(encode(make_event("invalidate", "k"))).value is None
    for bad in (b"{}", b'{"v":1,"op":"drop","key":"k","id":"1","ts":1}', b"x"):
        with pytest.raises(ValueError):
            decode(bad)
    with pytest.raises(ValueError):
        make_event("set", "", 1)

    cache = ConfigCache("meta://127.0.0.1:1", "t", lambda k: None)
    versions = iter([1, 2, 3])

    def racing_loader(key: str) -> int:
        v = next(versions)
        if v == 1:  # an invalidation is applied while the first load runs
            cache._apply(make_event("invalidate", key))
        return v

    cache.loader = racing_loader
    cache._ready.set()
    assert cache.get("k") == 2  # the raced load (1) was thrown away, loaded again
    assert cache.peek("k") == 2 and cache.stats["loads"] == 2
