"""The systems the suite knows, by name: ``pymetaq``, ``redis`` (Streams), ``nats`` (JetStream),
``null`` (the harness floor, opt-in), ``fsync`` (the disk floor for durable acks: ideal group
commit in process, opt-in, ``ack_latency`` only), ``pymetaq-nometrics`` (pymetaq with its HTTP port off,
opt-in: ``--systems pymetaq,pymetaq-nometrics`` measures what ``/metrics`` costs) and
``pymetaq-noidem`` (pymetaq's producers with ``idempotence=False``, opt-in: what the idempotent
producer's exactly-once retries cost) and ``pymetaq-idemfsync`` (the broker with
``producersSync=fdatasync``, opt-in: the idempotent producers' file fdatasynced beside the log
instead of written in place before its flush).

A system module is imported only when it is asked for, so a missing client library of one peer
never stops the others (it becomes a skip note).
"""

from __future__ import annotations

import importlib

from bench.common import SystemUnavailable
from bench.systems.base import System

_MODULES = {
    "pymetaq": ("bench.systems.pymetaq_sys", "PymetaqSystem"),
    "pymetaq-nometrics": ("bench.systems.pymetaq_sys", "PymetaqNoMetricsSystem"),
    "pymetaq-noidem": ("bench.systems.pymetaq_sys", "PymetaqNoIdemSystem"),
    "pymetaq-idemfsync": ("bench.systems.pymetaq_sys", "PymetaqIdemFsyncSystem"),
    "redis": ("bench.systems.redis_sys", "RedisSystem"),
    "nats": ("bench.systems.nats_sys", "NatsSystem"),
    "null": ("bench.systems.null_sys", "NullSystem"),
    "fsync": ("bench.systems.fsync_sys", "FsyncSystem"),
}

NAMES = tuple(_MODULES)
DEFAULT = ("pymetaq", "redis", "nats")


def create(name: str) -> System:
    """A fresh, unstarted system; raises ``SystemUnavailable`` if its client cannot be imported."""
    module_name, class_name = _MODULES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemUnavailable(f"{name}: client library missing ({exc})") from exc
    cls: type[System] = getattr(module, class_name)
    return cls()


__all__ = ["DEFAULT", "NAMES", "System", "create"]
