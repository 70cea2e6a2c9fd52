"""What the two consumer faces share: the constructor and the calls that never wait.

:class:`Consumer` (threads) and :class:`AsyncConsumer` (asyncio) both derive from
:class:`ConsumerFace`, so their constructor is written once (a face adds its own state in ``_setup()``)::

    Consumer(servers, group=None, offset_store=None, *, config=ConsumerConfig(...),
             reject_policy=None, transport=None, **overrides)

``overrides`` are :class:`ConsumerConfig` fields (unknown names raise ``TypeError``). Without an
``offset_store`` a grouped consumer uses ``FileOffsetStore("~/.pymetaq_offsets")`` (and closes
it); without a ``reject_policy``, ``LocalRecoverPolicy(recover_dir, recover_interval_s)``.
``transport`` replaces the network (tests pass an in-memory one).

Thread-safety: the values set here are immutable after construction; see each face.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from pymetaq.client.consumer.config import ConsumerConfig, effective_group, make_config
from pymetaq.client.consumer.engine import ConsumerEngine
from pymetaq.client.consumer.recover import LocalRecoverPolicy, RejectPolicy
from pymetaq.client.consumer.transport import BrokerTransport, ConsumerTransport
from pymetaq.client.errors import ConsumerError
from pymetaq.client.types import TopicPartition
from pymetaq.offsets import FileOffsetStore, OffsetStore


class ConsumerFace:
    """The constructor and the non-blocking calls of both consumer faces."""

    def __init__(
        self,
        servers: str | list[str] = "",
        group: str | None = None,
        offset_store: OffsetStore | None = None,
        *,
        config: ConsumerConfig | None = None,
        reject_policy: RejectPolicy | None = None,
        transport: ConsumerTransport | None = None,
        **overrides: Any,
    ) -> None:
        cfg = make_config(config, overrides)
        eff = effective_group(group, cfg)
        self._owns_store = False
        if eff is None:
            offset_store = None
        elif offset_store is None:
            offset_store = FileOffsetStore(Path.home() / ".pymetaq_offsets")
            self._owns_store = True
        policy = reject_policy or LocalRecoverPolicy(cfg.recover_dir, cfg.recover_interval_s)
        tr = transport if transport is not None else BrokerTransport(servers, cfg)
        self._engine = ConsumerEngine(tr, eff, offset_store, cfg, policy)
        self.config = cfg
        #: the group offsets are kept under (``<group>-<instance>`` when broadcast), or None
        self.group = eff
        self._setup()

    def _setup(self) -> None:
        """Each face's own state (called at the end of the shared constructor)."""

    def subscribe(self, topic: str) -> Self:
        """Consume ``topic`` (before the first poll/start)."""
        if self._engine.opened:
            raise ConsumerError("subscribe() must come before start()/poll()")
        if topic not in self._engine.topics:
            self._engine.topics.append(topic)
        return self

    def position(self, tp: TopicPartition) -> int:
        """The consumed position (what a commit would write) of ``tp``."""
        return int(self._engine.state(tp).position)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Continue ``tp`` at byte ``offset`` (a record start; out of range -> 301 -> moved)."""
        self._engine.state(tp).request_seek(offset)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: fetches, messages, empty, moved, errors, crc_errors, grown, commits,
        undecodable (records handed to the reject policy because they cannot be decoded)."""
        return dict(self._engine.counters)

    def _close_store(self) -> None:
        if self._owns_store and self._engine.store is not None:
            self._engine.store.close()
