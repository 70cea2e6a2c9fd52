"""The producer engine shared by ``Producer`` and ``AsyncProducer``: configuration, partition
selection, the accumulator and the sender wired together.

``ProducerConfig`` is the frozen settings value (see ``docs/client.md`` for every field);
``make_config(config, overrides)`` applies keyword overrides and rejects unknown names.

Thread-safety: ``ProducerEngine.select``/``check`` may run on any thread; the accumulator is
thread-safe; the sender and the broker set belong to the engine's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeAlias

from pymetaq.client.errors import ClientClosed, MessageTooLarge
from pymetaq.client.producer.accumulator import Accumulator, AnyFuture
from pymetaq.client.producer.config import ProducerConfig
from pymetaq.client.producer.partitioner import (
    OutgoingMessage,
    RoundRobin,
    key_bytes,
    key_hash_index,
    make_strategy,
    resolve_custom,
    resolve_explicit,
)
from pymetaq.client.producer.sender import Sender, SenderConfig
from pymetaq.client.transport.brokers import BrokerSet
from pymetaq.client.types import Partition

PartitionArg: TypeAlias = int | str | Partition | None


def all_small_bytes(values: Sequence[bytes], limit: int) -> bool:
    return all(type(v) is bytes and len(v) <= limit for v in values)


class ProducerEngine:
    """Selection + accumulator + sender, shared by both faces."""

    def __init__(
        self,
        servers: str | list[str],
        cfg: ProducerConfig,
        loop: asyncio.AbstractEventLoop,
        future_factory: Callable[[], AnyFuture],
        threadsafe: bool,
    ) -> None:
        self.cfg = cfg
        self.loop = loop
        self.brokers = BrokerSet(
            servers,
            connect_timeout=cfg.connect_timeout_ms / 1000.0,
            request_timeout=cfg.request_timeout_ms / 1000.0,
            metadata_max_age_s=cfg.metadata_max_age_ms / 1000.0,
        )
        sender_cfg = SenderConfig(
            cfg.max_in_flight,
            cfg.request_timeout_ms / 1000.0,
            cfg.retries,
            cfg.retry_backoff_ms / 1000.0,
            cfg.compression,
            cfg.body_checksum,
        )
        self.acc = Accumulator(
            batch_messages=cfg.batch_messages,
            batch_bytes=cfg.batch_bytes,
            linger_s=cfg.linger_ms / 1000.0,
            buffer_bytes=cfg.buffer_bytes,
            future_factory=future_factory,
            wake=self._wake,
        )
        self.sender = Sender(sender_cfg, self.brokers, self.acc, loop)
        self._wake_fn = self.sender.wake_threadsafe if threadsafe else self.sender.wake
        self._custom = cfg.partitioner if callable(cfg.partitioner) else None
        self._strategy = None if callable(cfg.partitioner) else make_strategy(cfg.partitioner)
        #: the fast path's selector (no key, no explicit partition, no custom partitioner)
        self.rr_next = self._strategy.next if isinstance(self._strategy, RoundRobin) else None
        self.closed = False

    def _wake(self) -> None:
        self._wake_fn()

    def select(
        self,
        topic: str,
        parts: list[Partition],
        value: bytes,
        key: bytes | str | None,
        partition: PartitionArg,
        attribute: str | None,
    ) -> Partition:
        if partition is not None:
            return parts[resolve_explicit(topic, parts, partition)]
        kb = key_bytes(key)
        if self._custom is not None:
            return parts[
                resolve_custom(
                    self._custom, topic, parts, OutgoingMessage(topic, value, kb, attribute)
                )
            ]
        if kb is not None:
            return parts[key_hash_index(kb, len(parts))]
        assert self._strategy is not None
        return parts[self._strategy(len(parts))]

    def check(self, value: bytes) -> bytes:
        if self.closed:
            raise ClientClosed("producer is closed")
        if type(value) is not bytes:
            if isinstance(value, (bytearray, memoryview)):
                value = bytes(value)
            else:
                raise TypeError(f"value must be bytes, not {type(value).__name__}")
        if len(value) > self.cfg.max_message_bytes:
            raise MessageTooLarge(
                f"message of {len(value)} bytes exceeds max_message_bytes={self.cfg.max_message_bytes}"
            )
        return value
