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
| ``<topic>``   | the name, resultCode (0 ok, 1 unknown, 2 configured, no data), partitions, |
|               | message_count, bytes, topic_realtime_{put,get,offset,get_miss,...} <stat>  |
| ``help``      | ``<item> <what it returns>`` per item, MetaQ's wording (``*EMPTY*`` = the  |
|               | general item)                                                              |
| ``reset``     | ``reset ok``: the realtime stats back to zero (MetaQ: counters are kept)   |
| extra items   | registered by other parts of the broker (:meth:`Stats.add_item`): ``lag``, |
|               | ``transactions`` (one line per open transaction), ``replication``         |
|               | (:mod:`pymetaq.server.replication`)                                       |

A realtime stat is MetaQ's ``Count=c,Value=v,Value/Count=r,Count/Duration=r,Duration=s``:
numbers as Java's ``DecimalFormat("#.##")`` prints them (``5``, ``1.25``), ``invalid`` for a
ratio over zero, ``Duration`` whole seconds since the last reset.  An item nothing has been
recorded for yet prints ``null``, and ``stats <topic>`` prints ``Invalid keyTwo:<topic>`` for a
topic without stats for an item others have, exactly as MetaQ.  Realtime stats are kept only
for topics with ``stat=true`` and zeroed every 30 minutes (keys kept), as in MetaQ.  What they
count: ``put`` one per put request (Value = messages stored: 1, or a ``bput``'s count),
``message_size`` one per message (Value = bytes), ``get`` one per answered get (Value 1),
``get_miss`` one per 404/301 get reply, ``offset`` one per ``offset`` request, ``put_failed``
one per failed put.  Their key is a topic that exists (or, for a miss on a name that has no
store, the name of the ``[topic=...]`` section it matched: the dispatcher decides), so
invented topic names never grow the map.

Counters are bumped once per request (a batch put is one ``cmd_put``; ``total_messages`` and
``realtime_message_size`` add the batch's count and bytes), so the cost is per batch.  They
only grow (``reset`` leaves them, as MetaQ), so ``/metrics`` exposes them as counters; a part
of the broker that needs one more (transactions: ``tx_begin``...) bumps ``counters[name]``.

Thread-safety: not thread-safe; owned and used by the broker's event-loop thread only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from pymetaq.client import __version__
from pymetaq.server.config import BrokerConfig
from pymetaq.server.security.config import redact

VERSION = f"pymetaq-{__version__} (MetaQ 1.4 protocol)"
REALTIME_ITEMS = ("put", "get", "offset", "get_miss", "put_failed", "message_size")
REALTIME_RESET_S = 30 * 60
#: ``stats help``: MetaQ's six lines, then pymetaq's additions
HELP_LINES = (
    ("*EMPTY*", "Returns broker info."),
    ("help", "Returns help menu."),
    ("topics", "Returns topics statistics detail info."),
    ("offsets", "Returns partitions detail info."),
    ("realtime", "Returns realtime statistics detail info."),
    ("config", "Returns broker's config file content."),
    ("reset", "Resets realtime statistics."),
    ("<topic>", "Returns one topic's statistics detail info."),
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
    "put_duplicate",
    "put_conflict",
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
        """MetaQ's ``MetaStatLog.formatOutput``."""
        duration = int(duration_s)
        per_count = java_decimal(self.value / self.count) if self.count else "invalid"
        per_second = java_decimal(self.count / duration) if duration else "invalid"
        return (
            f"Count={java_decimal(self.count)},Value={java_decimal(self.value)},"
            f"Value/Count={per_count},Count/Duration={per_second},Duration={duration}"
        )


def java_decimal(x: float) -> str:
    """``new DecimalFormat("#.##").format(x)``: at most two decimals, HALF_EVEN on the double's
    exact value, no trailing zeros."""
    d = Decimal(x).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)
    text = f"{d:f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


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
        self.slave = False  # an asynchronous slave (``slave`` in the general stats)
        self._realtime: dict[tuple[str, str], Realtime] = {}
        self._realtime_since = clock()
        self._extra: dict[str, tuple[str, Callable[[], list[str]]]] = {}

    def add_item(self, item: str, help_text: str, lines: Callable[[], list[str]]) -> None:
        """Answer ``stats <item>`` with ``lines()`` (a pymetaq extension, listed by ``help``)."""
        self._extra[item] = (help_text, lines)

    # -- recording (event-loop thread) -------------------------------------------------------
    def realtime(self, item: str, topic: str, value: int = 1, count: int = 1) -> None:
        """Add ``count`` events of ``item`` (``put``, ``get`` ...) totalling ``value``."""
        now = self._clock()
        if now - self._realtime_since >= REALTIME_RESET_S:
            self.reset()
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
        """MetaQ's ``resetRealTimeStat``: every realtime stat back to zero (its key kept, so it
        prints ``Count=0`` rather than ``null``); the counters are not touched."""
        for stat in self._realtime.values():
            stat.count = stat.value = 0
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
            return redact(str(config.text)).encode("utf-8")
        if item == "reset":
            self.reset()
            lines = ["reset ok"]
        elif item == "help":
            lines = [f"{name} {text}" for name, text in HELP_LINES]
            lines += [f"{name} {text}" for name, (text, _) in self._extra.items()]
        elif item in self._extra:
            lines = self._extra[item][1]()
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
            lines = [f"realtime_{name} {self._grouped(name, None)}" for name in REALTIME_ITEMS]
        else:
            lines = self._topic(item, config, partitions)
        return ("STATS\r\n" + "".join(line + "\r\n" for line in lines) + "END\r\n").encode()

    def _duration(self) -> float:
        return self._clock() - self._realtime_since

    def _grouped(self, name: str, topic: str | None) -> str:
        """MetaQ's ``getGroupedRealTimeStatResult(name[, topic])``."""
        total, seen, seen_topic = Realtime(), False, False
        for (item, t), stat in self._realtime.items():
            if item != name:
                continue
            seen = True
            if topic is None or t == topic:
                seen_topic = True
                total.count += stat.count
                total.value += stat.value
        if not seen:
            return "null"
        if not seen_topic:
            return f"Invalid keyTwo:{topic}"
        return total.describe(self._duration())

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
            ("slave", "true" if self.slave else "false"),
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
            topic,  # MetaQ: the name alone on the first line
            f"resultCode {code}",
            f"partitions {tc.num_partitions if tc is not None else 0}",
            f"message_count {sum(p.message_count for p in parts)}",
            f"bytes {sum(p.message_bytes for p in parts)}",
        ]
        lines += [f"topic_realtime_{name} {self._grouped(name, topic)}" for name in REALTIME_ITEMS]
        return lines


def _group(partitions: Sequence[PartitionInfo]) -> dict[str, list[PartitionInfo]]:
    out: dict[str, list[PartitionInfo]] = {}
    for p in partitions:
        out.setdefault(p.topic, []).append(p)
    return out
