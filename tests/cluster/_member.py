"""One consumer-group member as a process (``python -m tests.cluster._member ...``).

It runs a :class:`GroupCoordinator` and appends one JSON line per event to ``--events``:
``{"t": <time.monotonic()>, "ev": "session", "sid": .., "pwd": "<hex>"}`` on each new
session (the test expires it with the same-session-id trick), ``"ready"`` once registered,
``"assign"`` (the partitions it may deliver: ``may_deliver`` is checked) /``"revoke"``/
``"lost"`` with ``"parts": ["topic:b-p", ...]``, ``"suspended"`` when the connection drops
(delivery stops at once), ``"stopped"``.
CLOCK_MONOTONIC is system-wide on Linux, so times compare across processes.  SIGTERM leaves the
group cleanly; SIGKILL is a crash.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from pymetaq.client.cluster.group import GroupConfig, GroupCoordinator
from pymetaq.client.cluster.session import kazoo_client
from pymetaq.client.types import TopicPartition


class Events:
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed at exit
        self.lock = threading.Lock()

    def write(self, ev: str, **kw: Any) -> None:
        with self.lock:
            self.f.write(json.dumps({"t": time.monotonic(), "ev": ev, **kw}) + "\n")
            self.f.flush()


def part_names(parts: frozenset[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}:{tp.key}" for tp in parts)


def log_sessions(client: Any, events: Events) -> Callable[[str], None]:
    """Log ``suspended`` when the connection drops and ``session`` (id, password) on each new
    session; returns the listener (added to ``client``; call it once for the first session)."""
    last_sid: list[int] = [0]

    def on_state(state: str) -> None:
        if state != "CONNECTED":
            events.write("suspended")
            return
        cid = client.client_id
        if cid and cid[0] != last_sid[0]:
            last_sid[0] = cid[0]
            events.write("session", sid=cid[0], pwd=cid[1].hex())

    client.add_listener(on_state)
    return on_state


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--id", required=True)
    ap.add_argument("--topics", required=True)
    ap.add_argument("--strategy", default="DEFAULT")
    ap.add_argument("--session-timeout", type=float, default=2.0)
    ap.add_argument("--retry-ms", type=int, default=200)
    ap.add_argument("--events", required=True)
    args = ap.parse_args()
    events = Events(args.events)
    client = kazoo_client(args.hosts, session_timeout_s=args.session_timeout)
    on_state = log_sessions(client, events)  # may_deliver() turns False at "suspended"
    client.start(timeout=15)
    on_state("CONNECTED")
    cfg = GroupConfig(
        args.group,
        args.id,
        tuple(args.topics.split(",")),
        strategy=args.strategy,
        retry_delay_ms=args.retry_ms,
    )
    coord = GroupCoordinator(
        client,
        cfg,
        on_assign=lambda p: events.write(
            "assign", parts=part_names(frozenset(tp for tp in p if coord.may_deliver(tp)))
        ),
        on_revoke=lambda p: events.write("revoke", parts=part_names(p)),
        on_lost=lambda p: events.write("lost", parts=part_names(p)),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    coord.start()
    events.write("ready")
    stop.wait()
    coord.stop(15)
    client.stop()
    client.close()
    events.write("stopped")


if __name__ == "__main__":
    main()
