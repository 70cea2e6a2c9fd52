"""A consumer-group member as a process: a real ``Consumer("zk://...", group)`` in listener
mode (``python -m tests.cluster._consumer ...``), the fenced hand-off wired in as users get it.

It appends one JSON line per event to ``--events`` (flushed at once, so a SIGKILL loses at
most the line being written); times are ``time.monotonic()`` (CLOCK_MONOTONIC is system-wide
on Linux, so they compare across processes):

* ``join`` just before ``consumer.start()`` (it connects and joins the group), ``ready`` once
  it returned; ``session`` (``sid``, ``pwd`` hex) on each new ZooKeeper session (the test
  expires it with the same-session-id trick);
* ``assign`` (``parts``) *before* the consumer's hand-off code takes the partitions (so every
  delivery of them comes after it); ``revoked`` / ``lost`` (``parts``) *after* the consumer
  gave them up (its hand-off returned: nothing of them is delivered any more);
  ``suspended`` when the connection drops (the consumer's own listener fences everything
  then, in whatever order kazoo calls the two; its ``lost`` follows);
* ``d``: one delivery, ``p`` partition key, ``o`` offset, ``s`` the message's sequence number
  (its value), ``t0``/``t1`` when the listener call began and ended;
* ``stopped`` after a clean ``close()`` (SIGTERM).

The hooks wrap :class:`pymetaq.client.consumer.membership.Membership`'s callbacks in this
process only (observation; the consumer's behaviour is unchanged).
"""

from __future__ import annotations

import argparse
import signal
import threading
import time

from pymetaq.client.consumer import Consumer
from pymetaq.client.consumer.membership import Membership
from pymetaq.client.types import Message, TopicPartition
from tests.cluster._member import Events, log_sessions, part_names


def observe(events: Events) -> None:
    """Log the hand-off around Membership's callbacks (see the module docstring)."""
    on_assign, on_revoke, on_lost = (
        Membership._on_assign,
        Membership._on_revoke,
        Membership._on_lost,
    )

    def assign(self: Membership, parts: frozenset[TopicPartition]) -> None:
        events.write("assign", parts=part_names(parts))
        on_assign(self, parts)

    def revoke(self: Membership, parts: frozenset[TopicPartition]) -> None:
        on_revoke(self, parts)
        events.write("revoked", parts=part_names(parts))

    def lost(self: Membership, parts: frozenset[TopicPartition]) -> None:
        on_lost(self, parts)
        events.write("lost", parts=part_names(parts))

    Membership._on_assign = assign  # type: ignore[method-assign]
    Membership._on_revoke = revoke  # type: ignore[method-assign]
    Membership._on_lost = lost  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--session-ms", type=int, default=2000)
    ap.add_argument("--sync-ms", type=int, default=200)
    ap.add_argument("--commit-s", type=float, default=0.5)
    ap.add_argument("--events", required=True)
    args = ap.parse_args()
    events = Events(args.events)
    observe(events)

    def deliver(m: Message) -> None:
        t0 = time.monotonic()
        events.write("d", p=m.partition_key, o=m.offset, s=int(m.value), t0=t0, t1=time.monotonic())

    consumer = Consumer(
        args.servers,
        args.group,
        consumer_id=args.name,
        zk_session_timeout_ms=args.session_ms,
        zk_sync_time_ms=args.sync_ms,
        commit_interval_s=args.commit_s,
        long_poll_ms=200,
        max_delay_fetch_ms=200,
        fetch_runner_count=4,
        recover_dir=args.events + ".recover",
    )
    consumer.subscribe(args.topic, deliver)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    events.write("join")
    consumer.start()
    membership = consumer.membership
    assert membership is not None
    log_sessions(membership.zk, events)("CONNECTED")  # after the consumer's own listener
    events.write("ready")
    stop.wait()
    consumer.close()
    events.write("stopped")


if __name__ == "__main__":
    main()
