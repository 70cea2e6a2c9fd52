"""The producer: ``Producer`` (threads), ``AsyncProducer`` (asyncio), ``OrderedProducer``.

| module | its one job |
|---|---|
| ``config`` | ``ProducerConfig`` (frozen settings) |
| ``partitioner`` | partition selection (explicit > callable > key hash > round robin / random) |
| ``batch`` | a ``Batch`` (one ``bput``) and the handles standing for its messages' results |
| ``accumulator`` | per-partition batch queues, buffer bound, in-flight slots |
| ``sender`` | writes due batches as ``bput``, retries, completes them (event loop) |
| ``engine`` | selection + accumulator + sender; the send paths written once |
| ``sync`` / ``aio`` | the thread face (``Producer``) and the asyncio face (``AsyncProducer``) |
| ``ordered`` | ``OrderedProducer``: pinned partitions, a local spool while a partition is down |
| ``transactional`` | where a send inside a transaction goes (``pymetaq.client.transaction``) |

Thread-safety: see each class.
"""

from __future__ import annotations

from pymetaq.client.producer.aio import AsyncProducer
from pymetaq.client.producer.batch import BatchHandle, SendHandle
from pymetaq.client.producer.config import ProducerConfig
from pymetaq.client.producer.ordered import OrderedProducer
from pymetaq.client.producer.sync import Producer

__all__ = [
    "AsyncProducer",
    "BatchHandle",
    "OrderedProducer",
    "Producer",
    "ProducerConfig",
    "SendHandle",
]
