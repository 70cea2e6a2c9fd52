"""The client's values: ``Message`` (fetched), ``SendResult`` (a send's outcome) and
``TopicPartition`` (the one partition type of the producer, the consumer and the offsets).

Thread-safe: immutable values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pymetaq.client.errors import MetaClientError

#: MetaQ's id epoch (``IdWorker.twepoch``); ``pymetaq.storage.ids.EPOCH_MS`` is the same
#: number (the client may not import the storage engine; a test keeps them equal)
ID_EPOCH_MS = 1303895660503
#: bits below an id's time: 10 of broker id, 12 of sequence
ID_TIME_SHIFT = 22


class Message(NamedTuple):
    """A fetched message (immutable).

    ``partition`` is the broker-local partition number and ``broker_id`` the broker's id
    (MetaQ's partition key is ``f"{broker_id}-{partition}"``, see :attr:`partition_key`).
    ``offset`` is the byte position of the stored record; ``next_offset`` the position of the
    next record (fetch from there to continue). For an lz4 batch every inner message shares the
    outer record's ``offset``, ``next_offset`` and ``id``.

    ``key`` is the key the producer sent it with (it travels in MetaQ's attribute, see
    :mod:`pymetaq.client.transport.records`), None for a message sent without one (or by a
    MetaQ client); ``attribute`` is the attribute the producer gave. With a consumer's
    ``value_deserializer``/``key_deserializer`` the two fields hold what they return.

    A named tuple: the consumer builds one per record in C (``tuple.__new__`` over ``zip``),
    about 0.1 us instead of ~1 us for a frozen dataclass; fields read at C speed.
    """

    topic: str
    partition: int
    offset: int
    id: int
    value: bytes
    attribute: str | None = None
    next_offset: int = 0
    broker_id: int = 0
    key: bytes | None = None

    @property
    def partition_key(self) -> str:
        return f"{self.broker_id}-{self.partition}"

    @property
    def timestamp(self) -> int:
        """When the broker stored the message, in epoch milliseconds: the time bits of its id,
        ``(id >> 22) + 1303895660503``.

        pymetaq brokers take the time from the wall clock and never let it go backwards (a
        clock stepped back, or more than 4096 messages in a millisecond, give times slightly
        ahead of the wall clock). MetaQ's own brokers used ``System.nanoTime()``, whose origin
        is arbitrary: for messages a MetaQ broker stored the value is not a date.
        """
        return (self.id >> ID_TIME_SHIFT) + ID_EPOCH_MS


@dataclass(frozen=True, slots=True)
class SendResult:
    """The outcome of one send (MetaQ's ``SendResult``).

    On success ``partition`` is the broker-local partition, ``broker_id`` its broker, ``offset``
    the byte position of the stored record and ``msg_id`` the broker-assigned id; on failure
    ``success`` is False and ``error`` holds the exception (``offset``/``msg_id`` are -1).
    """

    success: bool
    partition: int
    offset: int
    msg_id: int
    error: MetaClientError | None = None
    broker_id: int = 0
    topic: str = ""
    #: OrderedProducer only: the message was kept in the local spool (offset/msg_id -1) and
    #: will be sent, in order, when its partition is reachable again.
    spooled: bool = False

    @property
    def partition_key(self) -> str:
        return f"{self.broker_id}-{self.partition}"


class TopicPartition(NamedTuple):
    """One partition of one topic — the client's one partition type.

    MetaQ's partition key is ``"<broker_id>-<partition>"`` (:attr:`key`; offset stores use it).
    A named tuple (hashing and ordering in C: the producer picks one per message); a topic's
    partitions sort as MetaQ sorts them, by (broker_id, partition).
    """

    topic: str
    broker_id: int
    partition: int

    @property
    def key(self) -> str:
        """MetaQ's partition key ``"<brokerId>-<partition>"``."""
        return f"{self.broker_id}-{self.partition}"

    def __str__(self) -> str:
        return f"{self.topic}/{self.broker_id}-{self.partition}"

    @classmethod
    def from_key(cls, topic: str, key: str) -> TopicPartition:
        """``("t", "3-1")`` -> ``TopicPartition("t", 3, 1)``; ``ValueError`` for a bad key."""
        b, sep, p = key.partition("-")
        if not sep:
            raise ValueError(f"partition key {key!r} is not '<brokerId>-<partition>'")
        return cls(topic, int(b), int(p))
