"""Plain-data views of one broker for the dashboard (its pages and its JSON endpoints).

Each function reads the broker's state as it is now and returns dicts and lists of plain
values (JSON-ready): :func:`overview` (the broker, its counters, its disks, its cluster and
slave status), :func:`topics` (every topic with its partitions and rates), :func:`groups`
(consumer groups with lag per partition, from :mod:`pymetaq.server.monitor.lag`).  Rates come
from a :class:`~pymetaq.server.monitor.rates.RateSampler` fed by :func:`totals`.

Thread-safety: call on the broker's event-loop thread.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from pymetaq.server.monitor.ops import NO_SLAVES
from pymetaq.server.monitor.rates import RateSampler, Totals
from pymetaq.server.replication import slaves_text
from pymetaq.server.stats import VERSION

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker
    from pymetaq.server.dispatch import Dispatcher

BROKER_KEY = "broker"


def totals(broker: Broker, dispatcher: Dispatcher) -> Totals:
    """The sampler's input: per (topic, partition) (messages in, bytes in, bytes out), and the
    broker's (puts, gets, messages)."""
    sent = dispatcher.monitor.sent
    out: Totals = {}
    for plog in broker.store.logs():
        key = (plog.topic, plog.partition)
        bytes_out = sent.get(key, (0, 0))[0]
        out[key] = (plog.message_count, plog.message_bytes, bytes_out)
    c = dispatcher.stats.counters
    out[BROKER_KEY] = (c["cmd_put"], c["cmd_get"], c["total_messages"])
    return out


def disks(broker: Broker) -> list[dict[str, Any]]:
    """Each data directory's filesystem: free and total bytes."""
    paths = {broker.config.system.data_path}
    paths.update(tc.data_path for tc in broker.config.topics if tc.data_path)
    out = []
    for path in sorted(paths):
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        out.append(
            {"path": path, "free": st.f_bavail * st.f_frsize, "size": st.f_blocks * st.f_frsize}
        )
    return out


def overview(broker: Broker, dispatcher: Dispatcher, rates: RateSampler | None) -> dict[str, Any]:
    system = broker.config.system
    stats = dispatcher.stats
    logs = broker.store.logs()
    r = rates.rate(BROKER_KEY) if rates is not None else ()
    puts, gets, msgs = r if r else (0.0, 0.0, 0.0)
    registry = broker.registry
    return {
        "broker_id": system.broker_id,
        "version": VERSION,
        "address": f"{broker.host}:{broker.port}",
        "pid": os.getpid(),
        "uptime_s": int(time.monotonic() - stats.started),
        "threads": threading.active_count(),
        "connections": stats.curr_connections,
        "max_connections": system.max_connections,
        "longpoll_waiters": dispatcher.longpoll.waiting(),
        "counters": dict(stats.counters),
        "rates": {"put": puts, "get": gets, "messages": msgs},
        "topics": len({p.topic for p in logs}),
        "partitions": len(logs),
        "closed_partitions": dispatcher.monitor.closed.count(),
        "fenced_partitions": len(broker.store.fenced),
        "lag_entries": len(dispatcher.monitor.lag),
        "config_path": broker.config.path,
        "config_checksum": broker.config.checksum,
        "data_path": system.data_path,
        "min_free_disk_bytes": system.min_free_disk_bytes,
        "disks": disks(broker),
        "zookeeper": {
            "enabled": broker.config.zookeeper.enabled,
            "connect": broker.config.zookeeper.connect if broker.config.zookeeper.enabled else "",
            "registered": sorted(registry.registered()) if registry is not None else [],
        },
        "slaves": slaves_text(broker, NO_SLAVES),
    }


def topics(
    broker: Broker, dispatcher: Dispatcher, rates: RateSampler | None
) -> list[dict[str, Any]]:
    """Every configured topic and every stored one, with partitions, sizes and rates."""
    by_topic: dict[str, list[Any]] = {}
    for plog in broker.store.logs():
        by_topic.setdefault(plog.topic, []).append(plog)
    names = set(by_topic) | {tc.name for tc in broker.config.topics if not tc.is_pattern}
    closed = dispatcher.monitor.closed
    sent = dispatcher.monitor.sent
    out = []
    for name in sorted(names):
        tc = broker.config.topic_config(name)
        parts = []
        for plog in sorted(by_topic.get(name, []), key=lambda p: p.partition):
            r = rates.rate((name, plog.partition)) if rates is not None else ()
            msg_rate, in_rate, out_rate = r if r else (0.0, 0.0, 0.0)
            parts.append(
                {
                    "partition": plog.partition,
                    "min_offset": plog.min_offset,
                    "max_offset": plog.max_offset,
                    "messages": plog.message_count,
                    "bytes": plog.message_bytes,
                    "bytes_out": sent.get((name, plog.partition), (0, 0))[0],
                    "msgs_per_s": msg_rate,
                    "in_bytes_per_s": in_rate,
                    "out_bytes_per_s": out_rate,
                    "closed": closed.is_closed(name, plog.partition),
                }
            )
        out.append(
            {
                "topic": name,
                "section": tc.name if tc is not None else None,
                "num_partitions": tc.num_partitions if tc is not None else len(parts),
                "accept_publish": tc.accept_publish if tc is not None else False,
                "accept_subscribe": tc.accept_subscribe if tc is not None else False,
                "stat": tc.stat if tc is not None else False,
                "size": sum(p["max_offset"] - p["min_offset"] for p in parts),
                "messages": sum(p["messages"] for p in parts),
                "msgs_per_s": sum(p["msgs_per_s"] for p in parts),
                "in_bytes_per_s": sum(p["in_bytes_per_s"] for p in parts),
                "out_bytes_per_s": sum(p["out_bytes_per_s"] for p in parts),
                "partitions": parts,
            }
        )
    return out


def groups(broker: Broker, dispatcher: Dispatcher) -> list[dict[str, Any]]:
    """Consumer groups seen by gets, each with its lag per (topic, partition)."""
    rows = dispatcher.monitor.lag_rows(broker.store.logs())
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(r.group, []).append(
            {
                "topic": r.topic,
                "partition": r.partition,
                "fetch_offset": r.fetch_offset,
                "max_offset": r.max_offset,
                "lag_bytes": r.lag_bytes,
                "lag_seconds": r.lag_seconds,
                "idle_seconds": r.idle_seconds,
                "fetches": r.fetches,
            }
        )
    return [
        {
            "group": g,
            "lag_bytes": sum(p["lag_bytes"] for p in parts),
            "lag_seconds": max((p["lag_seconds"] or 0.0 for p in parts), default=0.0),
            "partitions": parts,
        }
        for g, parts in by_group.items()
    ]
