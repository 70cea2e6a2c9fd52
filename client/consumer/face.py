"""What the two consumer faces share: the constructor and the calls that never wait.

:class:`Consumer` (threads) and :class:`AsyncConsumer` (asyncio) both derive from
:class:`ConsumerFace`, so their constructor is written once (a face adds its own state in ``_setup()``)::

    Consumer(servers, group=None, offset_store=None, *, config=ConsumerConfig(...),
             reject_policy=None, transport=None, **overrides)

``overrides`` are :class:`ConsumerConfig` fields (an unknown name raises
:class:`~pymetaq.client.errors.UnknownOption`, a ``TypeError``). Without an ``offset_store`` a
grouped consumer uses ``FileOffsetStore()`` (``~/.pymetaq_offsets``, the default the CLI uses
too) and closes it; without a ``reject_policy``, ``LocalRecoverPolicy(recover_dir, recover_interval_s)``.
``transport`` replaces the network (tests pass an in-memory one).

``servers="zk://host:port[,host:port][/root]"``: brokers come from ZooKeeper (``topics-sub``)
and a grouped consumer joins its group there (:mod:`pymetaq.client.consumer.membership`);
its default offset store is then ZooKeeper itself (MetaQ's default,
``<root>/consumers/<group>/offsets``), except for broadcast consumers, which keep MetaQ's
local file.

Thread-safety: the values set here are immutable after construction; see each face.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

from pymetaq.client.consumer.batch import Messages
from pymetaq.client.consumer.config import ConsumerConfig, effective_group, make_config
from pymetaq.client.consumer.engine import ConsumerEngine
from pymetaq.client.consumer.iterate import BatchCursor
from pymetaq.client.consumer.membership import Membership
from pymetaq.client.consumer.recover import LocalRecoverPolicy, RejectPolicy
from pymetaq.client.consumer.state import PartitionState
from pymetaq.client.consumer.transport import BrokerTransport, ConsumerTransport
from pymetaq.client.errors import ConsumerError, SerializationError
from pymetaq.client.transport.zkbrokers import ZkBrokerSet
from pymetaq.client.types import Message, TopicPartition
from pymetaq.offsets.base import OffsetStore
from pymetaq.offsets.file import FileOffsetStore


def deserializer(cfg: ConsumerConfig) -> Callable[[Message], Message] | None:
    """``Message -> Message`` through ``value_deserializer``/``key_deserializer`` (None when
    neither is set); a deserializer that raises is a :class:`SerializationError` that names
    the message and how to skip it."""
    vd, kd = cfg.value_deserializer, cfg.key_deserializer
    if vd is None and kd is None:
        return None

    def deserialize(m: Message) -> Message:
        what = "value_deserializer"
        try:
            value = m.value if vd is None else vd(m.value)
            what = "key_deserializer"
            key = m.key if kd is None or m.key is None else kd(m.key)
        except Exception as e:
            raise SerializationError(
                f"{what} failed on the message at {m.topic}/{m.partition_key} offset {m.offset}: "
                f"{e!r} (to skip it: consumer.seek(tp, {m.next_offset}))"
            ) from e
        return m._replace(value=value, key=key)

    return deserialize


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
        tr = transport if transport is not None else BrokerTransport(servers, cfg)
        brokers = getattr(tr, "brokers", None)
        zk_set = brokers if isinstance(brokers, ZkBrokerSet) else None
        self._owns_store = False
        if eff is None:
            offset_store = None
        elif offset_store is None:
            if zk_set is not None and not cfg.broadcast:
                from pymetaq.offsets.zk import ZkOffsetStore  # imported only for zk:// groups

                offset_store = ZkOffsetStore(client=zk_set.zk, root=zk_set.url.root)
            else:
                offset_store = FileOffsetStore()
            self._owns_store = True
        policy = reject_policy or LocalRecoverPolicy(cfg.recover_dir, cfg.recover_interval_s)
        self._engine = ConsumerEngine(tr, eff, offset_store, cfg, policy)
        self.config = cfg
        #: the group offsets are kept under (``<group>-<instance>`` when broadcast), or None
        self.group = eff
        #: the ZooKeeper group membership (``zk://`` servers and a group), else None
        self.membership: Membership | None = None
        if zk_set is not None and eff is not None:
            self.membership = Membership(
                self._engine,
                zk_set.zk,
                root=zk_set.url.root,
                group=eff,
                config=cfg,
                quiesce=self._group_quiesce,
                assigned=self._group_assigned,
                follow=zk_set.follow,
            )
            self._engine.membership = self.membership
        self._closed = False
        #: what ``for message in consumer`` is handing out (see ``iterate``)
        self._cursor = BatchCursor()
        #: a message through the configured deserializers (None: none configured)
        self._deserialize = deserializer(cfg)
        self._setup()

    @property
    def closed(self) -> bool:
        """``close()`` was called."""
        return self._closed

    def _setup(self) -> None:
        """Each face's own state (called at the end of the shared constructor)."""

    def _group_quiesce(self, parts: frozenset[TopicPartition]) -> None:
        """(coordinator thread) Return once nothing of ``parts`` (fenced) is being delivered.
        Poll mode needs nothing here: the engine waits for the application's next poll."""

    def _group_assigned(self, states: list[PartitionState]) -> None:
        """(coordinator thread) ``states`` were added by a rebalance (poll mode: the engine's
        poll picks them up by itself)."""

    def _check_manual_assign(self) -> None:
        if self.membership is not None:
            raise ConsumerError(
                "assign() is for consumers without a ZooKeeper group: this one's partitions "
                f"are given by group {self.group!r}"
            )

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

    def _deserialized(self, msgs: Messages) -> Messages:
        """A poll's result through the deserializers; a failure is raised (the caller rewinds
        the poll: the messages are fetched again)."""
        fn = self._deserialize
        return msgs if fn is None else Messages([[fn(m) for m in msgs]])

    def _close_store(self) -> None:
        if self._owns_store and self._engine.store is not None:
            self._engine.store.close()
