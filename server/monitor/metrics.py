"""The broker's Prometheus metrics: one custom collector that reads the broker's state at scrape
time (``prometheus_client``), so the put path pays nothing for them.

| metric                                               | type      | labels                 |
|------------------------------------------------------|-----------|------------------------|
| ``pymetaq_build_info``                               | gauge     | version, broker_id     |
| ``pymetaq_start_time_seconds``                       | gauge     |                        |
| ``pymetaq_connections`` / ``_max``                   | gauge     |                        |
| ``pymetaq_longpoll_waiters``                         | gauge     |                        |
| ``pymetaq_requests_total``                           | counter   | command (put/get/offset)|
| ``pymetaq_put_failed_total``, ``pymetaq_get_miss_total`` | counter |                      |
| ``pymetaq_protocol_errors_total``                    | counter   |                        |
| ``pymetaq_transactions_total``                       | counter   | event (begin, xa_begin, |
|                                                      |           | commit, rollback)      |
| ``pymetaq_messages_total``                           | counter   | (acknowledged puts)    |
| ``pymetaq_partition_messages_in_total``              | counter   | topic, partition       |
| ``pymetaq_partition_bytes_in_total``                 | counter   | topic, partition       |
| ``pymetaq_partition_bytes_out_total``                | counter   | topic, partition       |
| ``pymetaq_partition_fetches_total``                  | counter   | topic, partition       |
| ``pymetaq_partition_log_start_offset`` / ``_end_``   | gauge     | topic, partition       |
| ``pymetaq_partition_closed``                         | gauge     | topic, partition (1 = closed) |
| ``pymetaq_consumer_fetch_offset``                    | gauge     | group, topic, partition |
| ``pymetaq_consumer_lag_bytes``                       | gauge     | group, topic, partition |
| ``pymetaq_consumer_lag_seconds``                     | gauge     | group, topic, partition |
| ``pymetaq_consumer_last_fetch_timestamp_seconds``    | gauge     | group, topic, partition |
| ``pymetaq_lag_entries`` / ``_evicted_total``         | gauge/counter |                    |
| ``pymetaq_fsync_duration_seconds``                   | histogram |                        |
| ``pymetaq_group_commit_batch_bytes`` / ``_messages`` | histogram |                        |
| ``pymetaq_retention_runs_total``                     | counter   |                        |
| ``pymetaq_retention_removed_segments_total`` / ``_bytes_total`` | counter | action    |
| ``pymetaq_retention_unconsumed_segments_total``      | counter   | topic, group           |
| ``pymetaq_retention_unconsumed_bytes_total`` / ``_messages_total`` | counter | topic, group |
| ``pymetaq_disk_free_bytes`` / ``_size_bytes``        | gauge     | path                   |
| ``pymetaq_min_free_disk_bytes``                      | gauge     |                        |

The ``retention_unconsumed`` counters (``deletePolicy=consumed``): segments the
``maxRetention`` cap removed before a named group had consumed them, per group (one segment
counts once for each group that had not passed its end), and the bytes and messages of those
segments that group had not consumed (from its committed offset, or the whole segment).  The
groups a topic's policy names are exported at 0 from the start (``*`` groups appear with their
first loss).

Messages *out* are not counted: a get reply is a slice of the log sent with ``sendfile`` and
never parsed, so the broker knows the bytes it sent, not how many records they held (Kafka
has no messages-out metric for the same reason).  Counters since process start (storage's
per-log counts since the log was opened); Prometheus's ``rate()`` handles the restart.
Process metrics (CPU, memory, descriptors) come from ``prometheus_client``'s own collectors.

Thread-safety: ``collect`` runs on the broker's loop thread (the HTTP handler's).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pymetaq.server.monitor import views
from pymetaq.server.stats import VERSION
from pymetaq.storage.config import parse_delete_policy
from pymetaq.storage.metrics import HistogramSnapshot

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker
    from pymetaq.server.dispatch import Dispatcher

PART = ["topic", "partition"]
GROUP = ["group", "topic", "partition"]


def registry_for(broker: Broker, dispatcher: Dispatcher) -> CollectorRegistry:
    """A registry of its own (several brokers may share a process): the broker's collector and
    the process's."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker, dispatcher))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def _histogram(name: str, doc: str, snap: HistogramSnapshot) -> HistogramMetricFamily:
    buckets = [("+Inf" if b == float("inf") else repr(b), float(n)) for b, n in snap.cumulative()]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=snap.total)


class BrokerCollector(Collector):
    """Everything about one broker, read when scraped."""

    def __init__(self, broker: Broker, dispatcher: Dispatcher) -> None:
        self.broker = broker
        self.dispatcher = dispatcher
        self._started_wall = time.time() - (time.monotonic() - dispatcher.stats.started)

    def collect(self) -> Iterator[Metric]:
        yield from self._broker()
        yield from self._partitions()
        yield from self._lag()
        yield from self._storage()

    def _broker(self) -> Iterator[Metric]:
        d, system = self.dispatcher, self.broker.config.system
        c = d.stats.counters
        info = GaugeMetricFamily(
            "pymetaq_build_info", "pymetaq version and broker id", labels=["version", "broker_id"]
        )
        info.add_metric([VERSION, str(system.broker_id)], 1)
        yield info
        yield GaugeMetricFamily(
            "pymetaq_start_time_seconds", "when the broker started (epoch)", self._started_wall
        )
        yield GaugeMetricFamily(
            "pymetaq_connections", "open client connections", d.stats.curr_connections
        )
        yield GaugeMetricFamily("pymetaq_connections_max", "maxConnections", system.max_connections)
        yield GaugeMetricFamily(
            "pymetaq_longpoll_waiters", "long-poll gets waiting for data", d.longpoll.waiting()
        )
        requests = CounterMetricFamily(
            "pymetaq_requests", "requests by command", labels=["command"]
        )
        for command in ("put", "get", "offset"):
            requests.add_metric([command], c[f"cmd_{command}"])
        yield requests
        yield CounterMetricFamily(
            "pymetaq_put_failed", "puts answered with an error", c["put_failed"]
        )
        yield CounterMetricFamily(
            "pymetaq_get_miss", "gets answered 404 or 301 (no data there)", c["get_miss"]
        )
        yield CounterMetricFamily(
            "pymetaq_protocol_errors", "malformed requests", d.monitor.protocol_errors
        )
        tx = CounterMetricFamily("pymetaq_transactions", "transaction events", labels=["event"])
        for event in ("begin", "xa_begin", "commit", "rollback"):
            tx.add_metric([event], c.get(f"tx_{event}", 0))
        yield tx
        yield CounterMetricFamily(
            "pymetaq_messages", "messages stored and acknowledged", c["total_messages"]
        )

    def _partitions(self) -> Iterator[Metric]:
        m_in = CounterMetricFamily(
            "pymetaq_partition_messages_in", "messages appended", labels=PART
        )
        b_in = CounterMetricFamily("pymetaq_partition_bytes_in", "bytes appended", labels=PART)
        b_out = CounterMetricFamily(
            "pymetaq_partition_bytes_out", "bytes sent by gets", labels=PART
        )
        fetches = CounterMetricFamily(
            "pymetaq_partition_fetches", "get replies carrying data", labels=PART
        )
        start = GaugeMetricFamily("pymetaq_partition_log_start_offset", "first offset", labels=PART)
        end = GaugeMetricFamily(
            "pymetaq_partition_log_end_offset", "durable end (what gets can read)", labels=PART
        )
        closed = GaugeMetricFamily(
            "pymetaq_partition_closed", "1 while closed for publishing (admin close)", labels=PART
        )
        sent, closed_set = self.dispatcher.monitor.sent, self.dispatcher.monitor.closed
        for plog in self.broker.store.logs():
            labels = [plog.topic, str(plog.partition)]
            out_bytes, out_fetches = sent.get((plog.topic, plog.partition), (0, 0))
            m_in.add_metric(labels, plog.message_count)
            b_in.add_metric(labels, plog.message_bytes)
            b_out.add_metric(labels, out_bytes)
            fetches.add_metric(labels, out_fetches)
            start.add_metric(labels, plog.min_offset)
            end.add_metric(labels, plog.max_offset)
            closed.add_metric(labels, 1 if closed_set.is_closed(plog.topic, plog.partition) else 0)
        yield from (m_in, b_in, b_out, fetches, start, end, closed)

    def _lag(self) -> Iterator[Metric]:
        monitor = self.dispatcher.monitor
        pos = GaugeMetricFamily(
            "pymetaq_consumer_fetch_offset", "offset of the group's latest get", labels=GROUP
        )
        lag_b = GaugeMetricFamily(
            "pymetaq_consumer_lag_bytes", "durable end minus the group's fetch offset", labels=GROUP
        )
        lag_s = GaugeMetricFamily(
            "pymetaq_consumer_lag_seconds",
            "age of the first message the group has not fetched (0 when caught up)",
            labels=GROUP,
        )
        last = GaugeMetricFamily(
            "pymetaq_consumer_last_fetch_timestamp_seconds",
            "time of the group's latest get",
            labels=GROUP,
        )
        for r in monitor.lag_rows(self.broker.store.logs()):
            labels = [r.group, r.topic, str(r.partition)]
            pos.add_metric(labels, r.fetch_offset)
            lag_b.add_metric(labels, r.lag_bytes)
            if r.lag_seconds is not None:
                lag_s.add_metric(labels, r.lag_seconds)
            last.add_metric(labels, r.last_fetch)
        yield from (pos, lag_b, lag_s, last)
        yield GaugeMetricFamily(
            "pymetaq_lag_entries", "tracked (group, topic, partition)", len(monitor.lag)
        )
        yield CounterMetricFamily(
            "pymetaq_lag_entries_evicted",
            "positions forgotten at maxLagEntries",
            monitor.lag.evicted,
        )

    def _named_groups(self) -> set[tuple[str, str]]:
        """(topic, group) of every named group of a ``consumed`` policy: each configured topic
        and each open log (pattern topics)."""
        config = self.broker.config
        topics = {tc.name for tc in config.topics if not tc.is_pattern}
        topics |= {plog.topic for plog in self.broker.store.logs()}
        out: set[tuple[str, str]] = set()
        for topic in topics:
            tc = config.topic_config(topic)
            if tc is not None and tc.retains_until_consumed:
                groups = parse_delete_policy(tc.delete_policy).groups or ()
                out.update((topic, g) for g in groups)
        return out

    def _storage(self) -> Iterator[Metric]:
        snap = self.broker.store.metrics.snapshot()
        yield _histogram(
            "pymetaq_fsync_duration_seconds",
            "time to make one fsync round durable",
            snap.fsync_seconds,
        )
        yield _histogram(
            "pymetaq_group_commit_batch_bytes",
            "bytes made durable by one fsync round",
            snap.batch_bytes,
        )
        yield _histogram(
            "pymetaq_group_commit_batch_messages",
            "messages made durable by one fsync round",
            snap.batch_messages,
        )
        yield CounterMetricFamily("pymetaq_retention_runs", "retention runs", snap.retention_runs)
        segs = CounterMetricFamily(
            "pymetaq_retention_removed_segments", "segments removed by retention", labels=["action"]
        )
        nbytes = CounterMetricFamily(
            "pymetaq_retention_removed_bytes", "bytes removed by retention", labels=["action"]
        )
        for action in ("deleted", "archived", "compressed"):
            n, b = snap.retention_removed.get(action, (0, 0))
            segs.add_metric([action], n)
            nbytes.add_metric([action], b)
        yield from (segs, nbytes)
        yield from _unconsumed(snap.unconsumed_removed, self._named_groups())
        free = GaugeMetricFamily(
            "pymetaq_disk_free_bytes", "free bytes for the broker", labels=["path"]
        )
        size = GaugeMetricFamily("pymetaq_disk_size_bytes", "filesystem size", labels=["path"])
        for disk in views.disks(self.broker):
            free.add_metric([disk["path"]], disk["free"])
            size.add_metric([disk["path"]], disk["size"])
        yield from (free, size)
        yield GaugeMetricFamily(
            "pymetaq_min_free_disk_bytes",
            "minFreeDiskBytes: puts are refused below it",
            self.broker.config.system.min_free_disk_bytes,
        )


def _unconsumed(
    lost: dict[tuple[str, str], tuple[int, int, int]], named: set[tuple[str, str]]
) -> Iterator[Metric]:
    """What ``maxRetention`` removed before a named group consumed it, per (topic, group);
    ``named`` (topic, group) pairs are exported at 0 until they lose something, so that
    ``increase()`` sees the first loss."""
    lost = {**dict.fromkeys(named, (0, 0, 0)), **lost}
    what = "removed by maxRetention before the group consumed them"
    families = [
        CounterMetricFamily(
            f"pymetaq_retention_unconsumed_{unit}", f"{unit} {what}", labels=["topic", "group"]
        )
        for unit in ("segments", "bytes", "messages")
    ]
    for (topic, group), values in sorted(lost.items()):
        for family, value in zip(families, values):
            family.add_metric([topic, group], value)
    yield from families
