"""The ordered producer: per-partition order that survives a broker outage (MetaQ's
OrderedMessageProducer).

```python
with OrderedProducer("meta://127.0.0.1:8123", spool_dir="/var/spool/app") as p:
    p.send("binlog", row_bytes, key=table_name)       # same key -> same partition, in order
```

* **The partition list is pinned.** It is learned once per topic (or given as
  ``layout={"topic": "0:4;1:2"}``, MetaQ's ``brokerId:numPartitions;...`` syntax, or a list of
  :class:`~pymetaq.client.types.TopicPartition`) and never shrinks when a broker goes away, so a key always maps to the
  same partition (``crc32(key) % n``, or ``partition=`` explicitly; one of the two is required).
  With every broker down and no ``layout`` for a topic never seen, ``send`` raises
  :class:`NoBrokerAvailable` (there is no partition list to pin).
* **Sends to one partition are serialized and synchronous**: ``send`` waits for the ack while
  holding the partition's lock, so a failure can never let a later message overtake.
* **When the send fails with a retriable error** (broker down, connection lost, timeout,
  partition closed 403, busy 503) the message is written to the local spool
  ``<spool_dir>/<topic>@<brokerId>-<partition>/`` (:mod:`pymetaq.client.spool`) and ``send``
  returns ``SendResult(success=True, spooled=True, offset=-1, msg_id=-1)``. While a partition has
  a backlog every new message for it goes to the spool too (behind the backlog).
* **A drain thread** resends each backlog in spool order, ``batch_messages`` records per
  ``bput``, every ``recover_interval_ms`` until it succeeds; a record leaves the spool only
  after its batch is acknowledged. A backlog left by a previous run is found at start and
  drained the same way.
* **Duplicates**: after a *timeout* the message may already be stored when it is spooled, and
  a crash between an ack and the spool's remove resends the record: at-least-once, in order
  (a duplicate appears right after its original or later, never before it).
* Non-retriable errors (bad request, unknown topic/partition) return ``success=False``.
  A full spool raises :class:`~pymetaq.client.spool.SpoolFull`.

Thread-safety: ``send`` may be called from any thread (per-partition locks); one drain thread.
One process per spool directory (the spool takes an ``flock``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pymetaq.client.errors import ClientClosed, MayBeStoredTimeout
from pymetaq.client.producer.config import ProducerConfig
from pymetaq.client.producer.partitioner import key_bytes, key_hash_index, resolve_explicit
from pymetaq.client.producer.sync import Producer
from pymetaq.client.spool import Spool, SpoolConfig
from pymetaq.client.transport.records import build_record
from pymetaq.client.types import SendResult, TopicPartition

log = logging.getLogger(__name__)

LayoutArg = str | int | Sequence[TopicPartition | str]


def parse_layout(topic: str, spec: LayoutArg) -> list[TopicPartition]:
    """``"0:4;1:2"`` (MetaQ) / ``["0-0", TopicPartition(t, 0, 1)]`` / ``4`` (broker 0) ->
    the topic's sorted partition list."""
    if isinstance(spec, int):
        return [TopicPartition(topic, 0, i) for i in range(spec)]
    if isinstance(spec, str):
        parts: list[TopicPartition] = []
        for item in filter(None, (x.strip() for x in spec.split(";"))):
            broker, sep, count = item.partition(":")
            if not sep:
                raise ValueError(f"bad layout item {item!r}: expected brokerId:numPartitions")
            parts += [TopicPartition(topic, int(broker), i) for i in range(int(count))]
        return sorted(parts)
    return sorted(
        TopicPartition(topic, p.broker_id, p.partition)
        if isinstance(p, TopicPartition)
        else TopicPartition.from_key(topic, p)
        for p in spec
    )


class _PartitionState:
    __slots__ = ("lock", "spool")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spool: Spool | None = None


class OrderedProducer:
    """Per-partition ordered sends with a local spool for outages (see the module docstring)."""

    def __init__(
        self,
        servers: str | list[str],
        *,
        spool_dir: str | os.PathLike[str],
        layout: Mapping[str, LayoutArg] | None = None,
        recover_interval_ms: float = 500.0,
        spool_fsync: bool = True,
        config: ProducerConfig | None = None,
        **overrides: Any,
    ) -> None:
        overrides.setdefault("retries", 0)
        self._producer = Producer(servers, config=config, _allow_no_broker=True, **overrides)
        self.config = self._producer.config
        self.spool_dir = Path(spool_dir)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self._spool_cfg = SpoolConfig(fsync=spool_fsync)
        self._layouts: dict[str, list[TopicPartition]] = {
            t: parse_layout(t, v) for t, v in (layout or {}).items()
        }
        self._states: dict[TopicPartition, _PartitionState] = {}
        self._states_lock = threading.Lock()
        self._interval = recover_interval_ms / 1000.0
        self._wake = threading.Event()
        self._progress = threading.Condition()
        self._closed = False
        self._open_existing_spools()
        self._drainer = threading.Thread(
            target=self._drain_loop, name="pymetaq-ordered-drain", daemon=True
        )
        self._drainer.start()

    # -- partitions and spools ---------------------------------------------------------------

    def partitions(self, topic: str) -> list[TopicPartition]:
        """The topic's pinned partition list (learned from the brokers on first use)."""
        parts = self._layouts.get(topic)
        if parts is None:
            parts = list(self._producer.partitions(topic))
            self._layouts[topic] = parts
        return parts

    def _state(self, tp: TopicPartition) -> _PartitionState:
        st = self._states.get(tp)
        if st is None:
            with self._states_lock:
                st = self._states.setdefault(tp, _PartitionState())
        return st

    def _spool(self, tp: TopicPartition, st: _PartitionState) -> Spool:
        if st.spool is None:
            st.spool = Spool.for_producer(self.spool_dir, tp.topic, tp.key, self._spool_cfg)
        return st.spool

    def _open_existing_spools(self) -> None:
        for d in sorted(self.spool_dir.iterdir()):
            topic, sep, pkey = d.name.rpartition("@")
            if not d.is_dir() or not sep:
                continue
            try:
                tp = TopicPartition.from_key(topic, pkey)
            except ValueError:
                log.warning("ignoring %s: not a <topic>@<brokerId>-<partition> spool", d)
                continue
            st = self._state(tp)
            spool = self._spool(tp, st)
            if len(spool):
                log.info("found %d spooled messages for %s@%s", len(spool), topic, pkey)

    def backlog(self, topic: str | None = None) -> int:
        """Messages waiting in the spools (of one topic, or all)."""
        total = 0
        for tp, st in list(self._states.items()):
            if st.spool is not None and (topic is None or tp.topic == topic):
                total += len(st.spool)
        return total

    # -- sending -------------------------------------------------------------------------

    def _choose(
        self, topic: str, key: bytes | str | None, partition: int | str | TopicPartition | None
    ) -> TopicPartition:
        parts = self.partitions(topic)
        if partition is not None:
            return parts[resolve_explicit(topic, parts, partition)]
        kb = key_bytes(key)
        if kb is None:
            raise ValueError(
                "OrderedProducer.send needs key= or partition= (order is per partition)"
            )
        return parts[key_hash_index(kb, len(parts))]

    def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | str | None = None,
        partition: int | str | TopicPartition | None = None,
        attribute: str | None = None,
    ) -> SendResult:
        """Send in order to the key's (or given) partition; spool it if the partition is down."""
        if self._closed:
            raise ClientClosed("ordered producer is closed")
        engine = self._producer._engine
        value, key = engine.check(engine.values.value(value)), engine.values.key(key)
        tp = self._choose(topic, key, partition)
        if key is not None or attribute is not None:
            attribute = engine.values.attribute(key, attribute)  # the key travels with it
        st = self._state(tp)
        with st.lock:
            if st.spool is not None and len(st.spool):
                return self._to_spool(tp, st, value, attribute)
            handle = engine.send_to(tp, value, attribute)
            try:
                result = handle.result(self.config.delivery_timeout_s)
            except TimeoutError:
                err = MayBeStoredTimeout(f"send to {tp} (no ack in time)")
                result = SendResult(False, tp.partition, -1, -1, err, tp.broker_id, topic)
            if result.success or result.error is None or not result.error.retriable:
                return result
            log.info("%s unavailable (%s): spooling", tp, result.error)
            return self._to_spool(tp, st, value, attribute)

    def _to_spool(
        self, tp: TopicPartition, st: _PartitionState, value: bytes, attribute: str | None
    ) -> SendResult:
        self._spool(tp, st).append(
            build_record(value, attribute), topic=tp.topic, partition=tp.partition
        )
        self._wake.set()
        return SendResult(True, tp.partition, -1, -1, None, tp.broker_id, tp.topic, spooled=True)

    # -- draining ------------------------------------------------------------------------

    def _drain_loop(self) -> None:
        while not self._closed:
            progress = False
            for tp, st in list(self._states.items()):
                if self._closed:
                    return
                if st.spool is not None and len(st.spool):
                    try:
                        progress |= self._drain_one(tp, st)
                    except Exception:  # never let the drain thread die; logged with the cause
                        log.exception("draining %s failed", tp)
            if not progress:
                self._wake.wait(self._interval)
                self._wake.clear()

    def _drain_one(self, tp: TopicPartition, st: _PartitionState) -> bool:
        """Send the head of one backlog; True if something was acknowledged."""
        spool = st.spool
        assert spool is not None
        entries = spool.pending()[: self.config.batch_messages]
        if not entries:
            return False
        handle = self._producer._engine.send_records(tp, [e.record for e in entries])
        try:
            ok = handle.wait(self.config.delivery_timeout_s)
        except TimeoutError:
            return False
        if not ok:
            log.debug("drain of %s failed: %s", tp, handle.errors)
            return False
        for e in entries:
            spool.remove(e.key)
        self._notify_progress()
        return True

    def _notify_progress(self) -> None:
        with self._progress:
            self._progress.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every spool is empty (True) or ``timeout_s`` passes (False).

        Event-driven: the drain thread is woken at once and notifies after every acknowledged
        backlog batch (no polling)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._progress:
            while self.backlog():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._wake.set()
                self._progress.wait(left)
        return True

    def close(self) -> None:
        """Stop draining (spooled messages stay on disk for the next run) and close."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._drainer.join(self.config.delivery_timeout_s + 5)
        self._producer.close()
        for st in self._states.values():
            if st.spool is not None:
                st.spool.close()

    def __enter__(self) -> OrderedProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
