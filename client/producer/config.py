"""The producer's settings: ``ProducerConfig`` (frozen; see ``docs/client.md`` for every field)
and ``make_config(config, overrides)`` (keyword overrides, unknown names rejected).

Thread-safe: immutable values.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from pymetaq.client.producer.partitioner import PartitionerFn, make_strategy


@dataclass(frozen=True)
class ProducerConfig:
    """Producer settings (pass ``config=`` and/or keyword overrides to the constructor)."""

    linger_ms: float = 0.0
    batch_messages: int = 1000
    batch_bytes: int = 512 * 1024
    max_in_flight: int = 5
    request_timeout_ms: float = 3000.0
    connect_timeout_ms: float = 3000.0
    retries: int = 0
    retry_backoff_ms: float = 100.0
    partitioner: Literal["round_robin", "random"] | PartitionerFn = "round_robin"
    compression: Literal["lz4"] | None = None
    max_message_bytes: int = 1 << 20
    buffer_bytes: int = 64 << 20
    metadata_max_age_ms: float = 30000.0
    body_checksum: bool = False
    #: ``zk://`` servers: the ZooKeeper session timeout asked for (MetaQ's zkSessionTimeoutMs)
    zk_session_timeout_ms: float = 30000.0

    def __post_init__(self) -> None:
        if self.compression not in (None, "lz4"):
            raise ValueError(f"compression must be None or 'lz4', not {self.compression!r}")
        if self.batch_messages < 1 or self.batch_bytes < 1 or self.max_in_flight < 1:
            raise ValueError("batch_messages, batch_bytes and max_in_flight must be >= 1")
        if self.retries < 0 or self.linger_ms < 0:
            raise ValueError("retries and linger_ms must be >= 0")
        if not callable(self.partitioner):
            make_strategy(self.partitioner)  # validates the name

    @property
    def delivery_timeout_s(self) -> float:
        """How long a blocking ``send`` waits: every attempt, backoff, connect and linger."""
        attempts = self.retries + 1
        per = self.request_timeout_ms + self.retry_backoff_ms + self.connect_timeout_ms
        return (attempts * per + self.linger_ms) / 1000.0 + 1.0


def make_config(config: ProducerConfig | None, overrides: dict[str, Any]) -> ProducerConfig:
    cfg = config or ProducerConfig()
    if overrides:
        names = {f.name for f in fields(ProducerConfig)}
        unknown = set(overrides) - names
        if unknown:
            raise TypeError(f"unknown producer option(s): {', '.join(sorted(unknown))}")
        cfg = replace(cfg, **overrides)
    return cfg
