"""pymetaq.client: the producer and consumer APIs.

```python
from pymetaq.client import Producer, AsyncProducer, OrderedProducer, Consumer, Message, SendResult
```

``Consumer`` (and the other consumer names) are imported lazily from
``pymetaq.client.consumer`` on first access, so the producer works on its own. The shared core
(connections, metadata, record decoding, errors) is :mod:`pymetaq.client.core`.

Thread-safety: see each class.
"""

from __future__ import annotations

import importlib
from typing import Any

from pymetaq.client.batch import BatchHandle, SendHandle
from pymetaq.client.errors import (
    BrokerError,
    ClientClosed,
    ConnectionLost,
    MessageTooLarge,
    MetaClientError,
    NoBrokerAvailable,
    OffsetOutOfRange,
    RequestTimeout,
    UnknownTopicOrPartition,
)
from pymetaq.client.message import Message, Partition, SendResult
from pymetaq.client.producer import AsyncProducer, Producer, ProducerConfig

_LAZY = {
    "OrderedProducer": "pymetaq.client.ordered",
    "Consumer": "pymetaq.client.consumer",
    "AsyncConsumer": "pymetaq.client.consumer",
    "ConsumerConfig": "pymetaq.client.consumer",
}

__all__ = [
    "AsyncConsumer",
    "AsyncProducer",
    "BatchHandle",
    "BrokerError",
    "ClientClosed",
    "ConnectionLost",
    "Consumer",
    "ConsumerConfig",
    "Message",
    "MessageTooLarge",
    "MetaClientError",
    "NoBrokerAvailable",
    "OffsetOutOfRange",
    "OrderedProducer",
    "Partition",
    "Producer",
    "ProducerConfig",
    "RequestTimeout",
    "SendHandle",
    "SendResult",
    "UnknownTopicOrPartition",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pymetaq.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
