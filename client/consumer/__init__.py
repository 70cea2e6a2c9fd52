"""The pull consumer: ``Consumer`` (threads, listener or poll mode), ``AsyncConsumer`` (asyncio).

| module | its one job |
|---|---|
| ``config`` | ``ConsumerConfig`` (frozen settings), initial position, group names |
| ``transport`` | the network seam: ``ConsumerTransport`` and ``BrokerTransport`` (get, offset) |
| ``scan`` | checks one ``get`` reply's records and splits it into messages |
| ``batch`` | ``MessageBatch`` / ``Messages``: fetched messages, built lazily |
| ``state`` | one partition's ``PartitionState`` and MetaQ's fetch rules (pure functions) |
| ``engine`` | ``ConsumerEngine``: positions, fetch rounds, poll, commits (both faces) |
| ``ledger`` | ``PollLedger``: what the last poll returned, until it counts as consumed |
| ``membership`` | ``Membership``: a ``zk://`` group's fenced hand-off wired into the engine |
| ``face`` | ``ConsumerFace``: the constructor and non-blocking calls both faces share |
| ``sync`` / ``aio`` | the thread face (``Consumer``) and the asyncio face (``AsyncConsumer``) |
| ``recover`` | reject policies: the local recover spool (+ dead letters), drop |

Thread-safety: see each class.
"""

from __future__ import annotations

from pymetaq.client.consumer.aio import AsyncConsumer
from pymetaq.client.consumer.batch import MessageBatch, Messages
from pymetaq.client.consumer.config import ConsumerConfig, InitialPosition
from pymetaq.client.consumer.engine import offset_entry
from pymetaq.client.consumer.recover import DropPolicy, LocalRecoverPolicy, RejectPolicy
from pymetaq.client.consumer.sync import Consumer
from pymetaq.client.errors import ConsumerError, NoCommittedOffset, NotAssigned, UndecodableRecord
from pymetaq.client.types import TopicPartition

__all__ = [
    "AsyncConsumer",
    "Consumer",
    "ConsumerConfig",
    "ConsumerError",
    "DropPolicy",
    "InitialPosition",
    "LocalRecoverPolicy",
    "MessageBatch",
    "Messages",
    "NoCommittedOffset",
    "NotAssigned",
    "RejectPolicy",
    "TopicPartition",
    "UndecodableRecord",
    "offset_entry",
]
