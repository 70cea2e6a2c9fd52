"""The invalidation event: one message per ``invalidate(key)`` / ``publish_config(key, value)``.

Byte layout: a UTF-8 JSON object, sent with the config key as the message key (so one key's
events stay in one partition, in order)::

    {"v": 1, "op": "invalidate", "key": "db.pool", "id": "<32 hex>", "ts": 1795511444.167}
    {"v": 1, "op": "set", "key": "db.pool", "value": {"size": 8}, "id": "...", "ts": ...}

``value`` is any JSON value; ``id`` names the event (the publisher's, or a random one);
``ts`` is the publisher's clock at send (seconds since the epoch: propagation delay).
Pure functions; thread-safe.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

VERSION = 1
OPS = ("invalidate", "set")


@dataclass(frozen=True)
class ConfigEvent:
    op: str  # "invalidate" | "set"
    key: str
    value: Any = None
    id: str = ""
    ts: float = 0.0


def make_event(op: str, key: str, value: Any = None, event_id: str | None = None) -> ConfigEvent:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}")
    if not isinstance(key, str) or not key:
        raise ValueError("a config key is a non-empty string")
    return ConfigEvent(op, key, value, event_id or uuid.uuid4().hex, time.time())


def encode(e: ConfigEvent) -> bytes:
    doc: dict[str, Any] = {"v": VERSION, "op": e.op, "key": e.key, "id": e.id, "ts": e.ts}
    if e.op == "set":
        doc["value"] = e.value
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def decode(data: bytes) -> ConfigEvent:
    """The event in a message; ``ValueError`` for anything else."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("v") != VERSION or doc.get("op") not in OPS:
            raise ValueError(f"not a version-{VERSION} config event")
        return ConfigEvent(
            doc["op"], str(doc["key"]), doc.get("value"), str(doc["id"]), float(doc["ts"])
        )
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"not a config event: {e}") from None
