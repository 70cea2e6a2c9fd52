"""Partition selection for the producer (MetaQ's PartitionSelector family).

A topic's partitions are the list sorted by (broker_id, partition) that ``BrokerSet`` builds.
The producer picks one per message, in this order of precedence:

1. ``partition=`` given to ``send``: an ``int`` index into that sorted list, a
   :class:`~pymetaq.client.types.TopicPartition`, or a ``"<brokerId>-<partition>"`` key string (:func:`resolve_explicit`).
2. a user callable ``partitioner(topic, partitions, message) -> int | TopicPartition`` (the index or
   the partition itself); ``message`` is an :class:`OutgoingMessage`.
3. ``key=`` given: **key hash** - ``zlib.crc32(key_bytes) % len(partitions)`` (``str`` keys
   are UTF-8 encoded). Stable in every process and every run (never Python's ``hash()``),
   as long as the partition list is the same.
4. otherwise the configured strategy: ``"round_robin"`` (default, MetaQ's: a counter that is
   never negative, modulo the partition count) or ``"random"``.

Thread-safety: :class:`RoundRobin` uses ``itertools.count`` (atomic under the GIL); the rest are
pure functions.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pymetaq.client.errors import InvalidConfig, SerializationError, UnknownTopicOrPartition
from pymetaq.client.types import TopicPartition


class OutgoingMessage(NamedTuple):
    """What a custom partitioner sees of a message being sent."""

    topic: str
    value: bytes
    key: bytes | None
    attribute: str | None


PartitionerFn = Callable[[str, Sequence[TopicPartition], OutgoingMessage], "int | TopicPartition"]


def key_bytes(key: bytes | str | None) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    raise SerializationError(
        f"key must be bytes or str, not {type(key).__name__}: give the producer a key_serializer"
    )


def key_hash_index(key: bytes, n: int) -> int:
    """The stable key-hash choice: ``zlib.crc32(key) % n``."""
    return zlib.crc32(key) % n


class RoundRobin:
    """MetaQ's RoundRobinPartitionSelector: a non-negative counter modulo n."""

    def __init__(self, start: int = 0) -> None:
        self._counter = itertools.count(start)
        #: the bare counter (the producer's hot path calls it and takes ``% n`` itself)
        self.next = self._counter.__next__

    def __call__(self, n: int) -> int:
        return self.next() % n


class RandomChoice:
    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def __call__(self, n: int) -> int:
        return self._rng.randrange(n)


def make_strategy(name: str) -> Callable[[int], int]:
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return RandomChoice()
    raise InvalidConfig(f"unknown partitioner {name!r}: use 'round_robin', 'random' or a callable")


def resolve_explicit(
    topic: str, partitions: Sequence[TopicPartition], partition: int | str | TopicPartition
) -> int:
    """Index of an explicitly requested partition in the sorted list."""
    if isinstance(partition, bool):
        raise TypeError("partition must be an int index, a TopicPartition or a 'b-p' key")
    if isinstance(partition, int):
        if 0 <= partition < len(partitions):
            return partition
        raise UnknownTopicOrPartition(
            f"topic {topic!r} has {len(partitions)} partitions; index {partition} is out of range"
        )
    if isinstance(partition, str):
        target = TopicPartition.from_key(topic, partition)
    else:
        target = TopicPartition(topic, partition.broker_id, partition.partition)
    for i, p in enumerate(partitions):
        if p == target:
            return i
    raise UnknownTopicOrPartition(f"topic {topic!r} has no partition {target.key}")


def resolve_custom(
    fn: PartitionerFn, topic: str, partitions: Sequence[TopicPartition], message: OutgoingMessage
) -> int:
    """Run a user partitioner and validate what it returns."""
    choice = fn(topic, partitions, message)
    if isinstance(choice, TopicPartition):
        return resolve_explicit(topic, partitions, choice)
    if isinstance(choice, int) and not isinstance(choice, bool) and 0 <= choice < len(partitions):
        return choice
    raise UnknownTopicOrPartition(
        f"partitioner returned {choice!r} for topic {topic!r} with {len(partitions)} partitions"
    )
