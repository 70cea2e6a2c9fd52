"""Which partition log a request goes to: a lookup cache over the store, and creation.

:meth:`Partitions.for_read` never creates anything (a get, an offset); :meth:`Partitions.
for_write` (a put) creates a missing log - unless the topic matched a ``[topic=...*...]``
pattern and ``maxAutoCreatedPartitions`` partitions of pattern topics exist already (counted
from the store at start and after a reload, so partitions on disk count too), which raises
:class:`TooManyPartitions`.  A created log is announced (the long-poll gets waiting for it).

Thread-safety: event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pymetaq.server.config import TopicConfig
from pymetaq.server.limits import AutoCreated
from pymetaq.storage import MessageStoreManager, PartitionLog, PartitionOutOfRange, UnknownTopic

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker

Created = Callable[[str, int, PartitionLog], None]


class TooManyPartitions(Exception):
    """A put would create a pattern-topic partition past ``maxAutoCreatedPartitions``."""


class Partitions:
    """The partition logs the dispatcher has looked up (see the module docstring)."""

    def __init__(self, broker: Broker, on_created: Created) -> None:
        self._broker = broker
        self._on_created = on_created
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        limit = broker.config.system.max_auto_created_partitions
        self.auto_created = AutoCreated(limit, self._pattern_logs())

    @property
    def _store(self) -> MessageStoreManager:
        store: MessageStoreManager = self._broker.store
        return store

    def invalidate(self) -> None:
        """Forget cached lookups and recount pattern partitions (after a config reload)."""
        self._logs.clear()
        self.auto_created.reset(self._pattern_logs())

    def _pattern_logs(self) -> list[tuple[str, int]]:
        """The partitions that exist for topics matching a pattern (not an exact section)."""
        config = self._broker.config
        out = []
        for plog in self._store.logs():
            tc = config.topic_config(plog.topic)
            if tc is not None and tc.is_pattern:
                out.append((plog.topic, plog.partition))
        return out

    def for_write(self, topic: str, partition: int, tc: TopicConfig) -> PartitionLog:
        """The log of a put, created if needed: raises TooManyPartitions, StorageError, OSError."""
        key = (topic, partition)
        plog = self._logs.get(key)
        if plog is not None:
            return plog
        store = self._store
        plog = store.get_log(topic, partition, create=False)
        if plog is None:
            auto = self.auto_created
            if tc.is_pattern and not auto.admit(topic, partition):
                raise TooManyPartitions(
                    f"The topic `{topic}` cannot get partition {partition}: the broker holds "
                    f"{len(auto)} partitions of pattern topics "
                    f"(maxAutoCreatedPartitions={auto.limit})"
                )
            try:
                plog = store.get_log(topic, partition, create=True)
            except BaseException:
                auto.forget(topic, partition)
                raise
            assert plog is not None
            self._on_created(topic, partition, plog)
        self._logs[key] = plog
        return plog

    def for_read(self, topic: str, partition: int) -> PartitionLog | None:
        """The log of a get or offset if it exists (never created here)."""
        plog = self._logs.get((topic, partition))
        if plog is not None:
            return plog
        try:
            plog = self._store.get_log(topic, partition, create=False)
        except (UnknownTopic, PartitionOutOfRange):
            return None
        if plog is not None:
            self._logs[(topic, partition)] = plog
        return plog
