"""The broker's counters and MetaQ's ``stats`` replies (``StatsManager``/``MetaStatLog``).

Every body has MetaQ's shape: ``STATS\\r\\n`` + ``key value\\r\\n`` lines + ``END\\r\\n``
(``stats config`` is the raw server.ini instead).  Items:

| item          | lines                                                                      |
|---------------|----------------------------------------------------------------------------|
| (empty)       | pid broker_id port uptime version slave curr_connections threads cmd_put   |
|               | cmd_get cmd_offset tx_begin tx_xa_begin tx_commit tx_rollback get_miss     |
|               | put_failed total_messages topics config_checksum                           |
| ``topics``    | ``<topic> partitions N message_count N message_bytes N accept_publish B    |
|               | accept_subscribe B``; a configured topic with no store: ``<topic> *Empty*`` |
| ``offsets``   | ``<topic> part <p> min_offset <n> max_offset <n>``                         |
| ``realtime``  | realtime_{put,get,offset,get_miss,put_failed,message_size} <stat>          |
| ``<topic>``   | topic, resultCode (0 ok, 1 unknown, 2 configured but no data), partitions, |
|               | message_count, bytes, topic_realtime_{put,get,offset,get_miss,...} <stat>  |
| ``transactions`` | pymetaq: one line per open transaction (answered by the dispatcher from |
|               | :mod:`pymetaq.server.transaction.handler`)                                 |
| ``help``      | the item list                                                             |
| ``reset``     | ``reset ok`` (counters and realtime stats back to zero)                    |

A realtime stat is ``Count=c,Value=v,Value/Count=r,Count/Duration=r,Duration=s``; it is kept
only for topics with ``stat=true`` and resets itself every 30 minutes, as in MetaQ.  Its key is
a topic that exists (or, for a miss on a name that has no store, the name of the ``[topic=...]``
section it matched: the dispatcher decides), so invented topic names never grow the map.

Counters are bumped once per request (a batch put is one ``cmd_put``; ``total_messages`` and
``realtime_message_size`` add the batch's count and bytes), so the cost is per batch.

Thread-safety: not thread-safe; owned and used by the broker's event-loop thread only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pymetaq.server.config import BrokerConfig

VERSION = "pymetaq-0.1.0 (MetaQ 1.4 protocol)"
REALTIME_ITEMS = ("put", "get", "offset", "get_miss", "put_failed", "message_size")
REALTIME_RESET_S = 30 * 60
HELP_ITEMS = (
    "(empty)",
    "topics",
    "offsets",
    "realtime",
    "transactions",
    "<topic>",
    "config",
    "reset",
    "help",
)
COUNTERS = (
    "cmd_put",
    "cmd_get",
    "cmd_offset",
    "tx_begin",
    "tx_xa_begin",
    "tx_commit",
    "tx_rollback",
    "get_miss",
    "put_failed",
    "total_messages",
)


@dataclass(frozen=True)
class PartitionInfo:
    """What stats needs to know about one partition log."""

    topic: str
    partition: int
    min_offset: int
    max_offset: int
    message_count: int
    message_bytes: int


class Realtime:
    """MetaQ's realtime stat: a count and a value summed since the last reset."""

    __slots__ = ("count", "value")

    def __init__(self) -> None:
        self.count = 0
        self.value = 0

    def describe(self, duration_s: float) -> str:
        d = max(duration_s, 1e-9)
        ratio = self.value / self.count if self.count else 0.0
        return (
            f"Count={self.count},Value={self.value},Value/Count={ratio:.2f},"
            f"Count/Duration={self.count / d:.2f},Duration={int(duration_s)}"
        )


class Stats:
    """Counters plus the renderer of every ``stats`` item."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self.started = clock()
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.curr_connections = 0
        self._realtime: dict[tuple[str, str], Realtime] = {}
        self._realtime_since = clock()

    # -- recording (event-loop thread) -------------------------------------------------------
    def realtime(self, item: str, topic: str, value: int = 1, count: int = 1) -> None:
        """Add ``count`` events of ``item`` (``put``, ``get`` ...) totalling ``value``."""
        now = self._clock()
        if now - self._realtime_since >= REALTIME_RESET_S:
            self._realtime.clear()
            self._realtime_since = now
        key = (item, topic)
        stat = self._realtime.get(key)
        if stat is None:
            stat = self._realtime[key] = Realtime()
        stat.count += count
        stat.value += value

    def realtime_keys(self) -> set[tuple[str, str]]:
        """The (item, topic) pairs that have a realtime stat (tests, diagnostics)."""
        return set(self._realtime)

    def reset(self) -> None:
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._realtime.clear()
        self._realtime_since = self._clock()

    # -- rendering ---------------------------------------------------------------------------
    def render(
        self,
        item: str,
        config: BrokerConfig,
        port: int,
        partitions: Sequence[PartitionInfo],
    ) -> bytes:
        """The reply body of ``stats <item>``."""
        item = item.strip()
        if item == "config":
            return str(config.text).encode("utf-8")
        if item == "reset":
            self.reset()
            lines = ["reset ok"]
        elif item == "help":
            lines = [f"{name}" for name in HELP_ITEMS]
        elif item == "":
            lines = self._general(config, port, partitions)
        elif item == "topics":
            lines = self._topics(config, partitions)
        elif item == "offsets":
            lines = [
                f"{p.topic} part {p.partition} min_offset {p.min_offset} max_offset {p.max_offset}"
                for p in sorted(partitions, key=lambda p: (p.topic, p.partition))
            ]
        elif item == "realtime":
            lines = [
                f"realtime_{name} {self._sum(name, None).describe(self._duration())}"
                for name in REALTIME_ITEMS
            ]
        else:
            lines = self._topic(item, config, partitions)
        return ("STATS\r\n" + "".join(line + "\r\n" for line in lines) + "END\r\n").encode()

    def _duration(self) -> float:
        return self._clock() - self._realtime_since

    def _sum(self, name: str, topic: str | None) -> Realtime:
        total = Realtime()
        for (item, t), stat in self._realtime.items():
            if item == name and (topic is None or t == topic):
                total.count += stat.count
                total.value += stat.value
        return total

    def _general(
        self, config: BrokerConfig, port: int, partitions: Sequence[PartitionInfo]
    ) -> list[str]:
        c = self.counters
        topics = {p.topic for p in partitions}
        pairs: list[tuple[str, object]] = [
            ("pid", os.getpid()),
            ("broker_id", config.system.broker_id),
            ("port", port),
            ("uptime", int(self._clock() - self.started)),
            ("version", VERSION),
            ("slave", "false"),
            ("curr_connections", self.curr_connections),
            ("threads", threading.active_count()),
            *((name, c[name]) for name in COUNTERS[:-1]),
            ("total_messages", c["total_messages"]),
            ("topics", len(topics)),
            ("config_checksum", config.checksum),
        ]
        return [f"{k} {v}" for k, v in pairs]

    def _topics(self, config: BrokerConfig, partitions: Sequence[PartitionInfo]) -> list[str]:
        lines = []
        by_topic = _group(partitions)
        for topic in sorted(by_topic):
            parts = by_topic[topic]
            tc = config.topic_config(topic)
            pub = tc.accept_publish if tc else False
            sub = tc.accept_subscribe if tc else False
            lines.append(
                f"{topic} partitions {tc.num_partitions if tc else len(parts)} "
                f"message_count {sum(p.message_count for p in parts)} "
                f"message_bytes {sum(p.message_bytes for p in parts)} "
                f"accept_publish {str(pub).lower()} accept_subscribe {str(sub).lower()}"
            )
        for tc in config.topics:
            if not tc.is_pattern and tc.name not in by_topic:
                lines.append(f"{tc.name} *Empty*")
        return lines

    def _topic(
        self, topic: str, config: BrokerConfig, partitions: Sequence[PartitionInfo]
    ) -> list[str]:
        parts = _group(partitions).get(topic, [])
        tc = config.topic_config(topic)
        code = 0 if parts else (2 if tc is not None else 1)
        lines = [
            f"topic {topic}",
            f"resultCode {code}",
            f"partitions {tc.num_partitions if tc is not None else 0}",
            f"message_count {sum(p.message_count for p in parts)}",
            f"bytes {sum(p.message_bytes for p in parts)}",
        ]
        duration = self._duration()
        lines += [
            f"topic_realtime_{name} {self._sum(name, topic).describe(duration)}"
            for name in REALTIME_ITEMS
        ]
        return lines


def _group(partitions: Sequence[PartitionInfo]) -> dict[str, list[PartitionInfo]]:
    out: dict[str, list[PartitionInfo]] = {}
    for p in partitions:
        out.setdefault(p.topic, []).append(p)
    return out
