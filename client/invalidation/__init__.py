"""Broadcast config invalidation: a publisher and, in every application process, a cache that
drops or refreshes an entry when an invalidation arrives (MetaQ's broadcast consumer use).

| module | its one job |
|---|---|
| ``event`` | the event message (JSON): ``invalidate`` or ``set`` of one key |
| ``publisher`` | ``ConfigPublisher``: ``invalidate(key)``, ``publish_config(key, value)`` |
| ``cache`` | ``ConfigCache``: loader-backed cache on a broadcast consumer, offsets per instance |

The guide is ``docs/invalidation.md``. Thread-safety: see each class.
"""

from __future__ import annotations

from pymetaq.client.invalidation.cache import ConfigCache, ConfigCacheError
from pymetaq.client.invalidation.event import ConfigEvent
from pymetaq.client.invalidation.publisher import ConfigPublisher

__all__ = ["ConfigCache", "ConfigCacheError", "ConfigEvent", "ConfigPublisher"]
