"""pymetaq.client: the producer and consumer APIs.

```python
from pymetaq.client import Producer, AsyncProducer, OrderedProducer, Consumer, AsyncConsumer
from pymetaq.client import Message, SendResult, TopicPartition
```

Every public name is imported lazily on first access (PEP 562 ``__getattr__``), so importing
``pymetaq.client`` (or its codec, ``pymetaq.client.protocol``) loads nothing else, and the
producer never loads the consumer. The map of the subpackages is in ``docs/internals.md``.

``__version__`` is pymetaq's one version (pyproject reads it; ``pymetaq --version``, the
broker's ``version`` reply and ``stats`` report it).

Thread-safety: see each class.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from pymetaq.client.consumer import AsyncConsumer, Consumer, ConsumerConfig
    from pymetaq.client.errors import (
        BrokerError,
        ClientClosed,
        ConnectionLost,
        MessageMayBeStored,
        MessageTooLarge,
        MetaClientError,
        MissingDependency,
        NoBrokerAvailable,
        OffsetOutOfRange,
        RequestTimeout,
        SerializationError,
        UnknownTopicOrPartition,
    )
    from pymetaq.client.producer import (
        AsyncProducer,
        BatchHandle,
        OrderedProducer,
        Producer,
        ProducerConfig,
        SendHandle,
    )
    from pymetaq.client.types import Message, SendResult, TopicPartition

#: public name -> the module that defines it
_LAZY = {
    "AsyncConsumer": "pymetaq.client.consumer.aio",
    "Consumer": "pymetaq.client.consumer.sync",
    "ConsumerConfig": "pymetaq.client.consumer.config",
    "AsyncProducer": "pymetaq.client.producer.aio",
    "Producer": "pymetaq.client.producer.sync",
    "OrderedProducer": "pymetaq.client.producer.ordered",
    "ProducerConfig": "pymetaq.client.producer.config",
    "BatchHandle": "pymetaq.client.producer.batch",
    "SendHandle": "pymetaq.client.producer.batch",
    "Message": "pymetaq.client.types",
    "SendResult": "pymetaq.client.types",
    "TopicPartition": "pymetaq.client.types",
    "BrokerError": "pymetaq.client.errors",
    "ClientClosed": "pymetaq.client.errors",
    "ConnectionLost": "pymetaq.client.errors",
    "MessageTooLarge": "pymetaq.client.errors",
    "MetaClientError": "pymetaq.client.errors",
    "NoBrokerAvailable": "pymetaq.client.errors",
    "OffsetOutOfRange": "pymetaq.client.errors",
    "RequestTimeout": "pymetaq.client.errors",
    "UnknownTopicOrPartition": "pymetaq.client.errors",
    "MessageMayBeStored": "pymetaq.client.errors",
    "MissingDependency": "pymetaq.client.errors",
    "SerializationError": "pymetaq.client.errors",
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
    "MessageMayBeStored",
    "MessageTooLarge",
    "MetaClientError",
    "MissingDependency",
    "NoBrokerAvailable",
    "OffsetOutOfRange",
    "OrderedProducer",
    "Producer",
    "ProducerConfig",
    "RequestTimeout",
    "SendHandle",
    "SendResult",
    "SerializationError",
    "TopicPartition",
    "UnknownTopicOrPartition",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pymetaq.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
