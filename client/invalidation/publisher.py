"""The publishing side of broadcast config invalidation.

```python
with ConfigPublisher("meta://127.0.0.1:8123", "config") as pub:
    save_to_database("db.pool", {"size": 8})   # the source of truth first
    pub.invalidate("db.pool")                  # every cache drops it (reloads on next get)
    pub.publish_config("feature.x", True)      # every cache holds the new value at once
```

Change the source of truth *before* publishing: a cache that reloads after the event must find
the new value. Each call waits for the broker's ack (the event is durable when it returns) and
returns the :class:`~pymetaq.client.types.SendResult` (a failure raises the producer's
error); calls from several threads share the broker's group commit. The config key is the
message key, so one key's events keep their order.

Thread-safety: the underlying producer is thread-safe; so is this class.
"""

from __future__ import annotations

from typing import Any

from pymetaq.client.invalidation.event import encode, make_event
from pymetaq.client.producer import Producer
from pymetaq.client.types import SendResult


class ConfigPublisher:
    """``invalidate(key)`` / ``publish_config(key, value)`` onto a topic (see the module doc)."""

    def __init__(self, servers: str, topic: str, **producer_overrides: Any) -> None:
        self.topic = topic
        self._producer = Producer(servers, **producer_overrides)
        self._producer.partitions(topic)  # an unknown topic fails here

    def _send(self, op: str, key: str, value: Any, event_id: str | None) -> SendResult:
        data = encode(make_event(op, key, value, event_id))
        return self._producer.send_and_wait(self.topic, data, key=key)

    def invalidate(self, key: str, *, event_id: str | None = None) -> SendResult:
        """Every cache drops ``key``; its next ``get`` loads the current value."""
        return self._send("invalidate", key, None, event_id)

    def publish_config(self, key: str, value: Any, *, event_id: str | None = None) -> SendResult:
        """Every cache holds ``value`` (any JSON value) for ``key`` from now on."""
        return self._send("set", key, value, event_id)

    def close(self) -> None:
        self._producer.close()

    def __enter__(self) -> ConfigPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
