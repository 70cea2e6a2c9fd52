"""The producer's settings: ``ProducerConfig`` (frozen; see ``docs/client.md`` for every field)
and ``make_config(config, overrides)`` (keyword overrides, unknown names rejected).

Thread-safe: immutable values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from pymetaq.client.errors import InvalidConfig, unknown_options
from pymetaq.client.producer.partitioner import PartitionerFn, make_strategy

#: records a broker takes in one ``bput`` (one millisecond's worth of message ids)
MAX_BATCH_MESSAGES = 4096


@dataclass(frozen=True)
class ProducerConfig:
    """Producer settings (pass ``config=`` and/or keyword overrides to the constructor)."""

    linger_ms: float = 0.0
    #: the most a broker takes per bput: each batch costs the broker a fixed ~0.5 ms besides
    #: its records, so a per-message loop stores ~2x more per second than with 1000
    #: (docs/benchmarks.md); at light load batches stay small whatever the cap
    batch_messages: int = MAX_BATCH_MESSAGES
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
    #: turns each value given to a send into ``bytes`` (e.g. ``str.encode``, or
    #: ``lambda v: json.dumps(v).encode()``); None: values must be bytes
    value_serializer: Callable[[Any], bytes] | None = None
    #: the same for keys; None: keys must be bytes or str (UTF-8)
    key_serializer: Callable[[Any], bytes] | None = None
    #: a message's key travels with it, in MetaQ's attribute (``Message.key`` on the
    #: consumer; the encoding is in ``pymetaq.client.transport.records``); False: the key only
    #: chooses the partition and the attribute is stored exactly as given
    key_in_attribute: bool = True
    #: ``zk://`` servers: the ZooKeeper session timeout asked for (MetaQ's zkSessionTimeoutMs)
    zk_session_timeout_ms: float = 30000.0
    #: each batch carries this producer's id and a per-partition sequence number, so a retried
    #: batch is stored once (the broker answers a duplicate with the original result) and up
    #: to 5 batches per partition may be in flight with retries on; False: the plain ``bput``
    idempotence: bool = True

    def __post_init__(self) -> None:
        if self.compression not in (None, "lz4"):
            raise InvalidConfig(f"compression must be None or 'lz4', not {self.compression!r}")
        if self.batch_messages < 1 or self.batch_bytes < 1 or self.max_in_flight < 1:
            raise InvalidConfig("batch_messages, batch_bytes and max_in_flight must be >= 1")
        if self.batch_messages > MAX_BATCH_MESSAGES:
            raise InvalidConfig(
                f"batch_messages={self.batch_messages}: a broker stores at most "
                f"{MAX_BATCH_MESSAGES} messages per batch"
            )
        if self.retries < 0 or self.linger_ms < 0:
            raise InvalidConfig("retries and linger_ms must be >= 0")
        if not callable(self.partitioner):
            make_strategy(self.partitioner)  # validates the name

    @property
    def delivery_timeout_s(self) -> float:
        """How long a blocking ``send`` waits: every attempt, backoff, connect and linger."""
        attempts = self.retries + 1
        per = self.request_timeout_ms + self.retry_backoff_ms + self.connect_timeout_ms
        return (attempts * per + self.linger_ms) / 1000.0 + 1.0


#: other clients' option names -> what to use instead (the UnknownOption message says so)
KAFKA_NAMES = {
    "bootstrap_servers": "pass servers as the first argument, 'meta://host:port,...'",
    "acks": "a send is acknowledged once it is durable under the broker's flush policy",
    "compression_type": "use compression='lz4'",
    "batch_size": "use batch_bytes (or batch_messages)",
    "max_request_size": "use max_message_bytes",
    "buffer_memory": "use buffer_bytes",
    "max_in_flight_requests_per_connection": "use max_in_flight",
    "enable_idempotence": "use idempotence (on by default)",
}


def make_config(config: ProducerConfig | None, overrides: dict[str, Any]) -> ProducerConfig:
    """``config`` (default ``ProducerConfig()``) with keyword overrides applied; an unknown
    name raises :class:`~pymetaq.client.errors.UnknownOption` (a ``TypeError``) saying what
    was probably meant."""
    cfg = config or ProducerConfig()
    if overrides:
        names = {f.name for f in fields(ProducerConfig)}
        unknown = set(overrides) - names
        if unknown:
            raise unknown_options("producer", unknown, names, KAFKA_NAMES)
        cfg = replace(cfg, **overrides)
    return cfg
