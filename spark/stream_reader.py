"""The streaming reader of format ``pymetaq``: micro-batches over byte offsets.

Spark checkpoints the offsets this reader returns (``{topic: {"<brokerId>-<partition>":
offset}}``, canonical: :func:`~pymetaq.spark.offsets.canonical`) and replays a batch from its
checkpointed ``(start, end)``: a task reads exactly ``[start, end)`` (ends are record
boundaries), so a restart neither loses nor repeats rows.

* **Admission control** (pyspark 4.2+): ``maxOffsetsPerTrigger`` (stored records, the
  default limit :class:`ReadMaxRows`) and ``maxBytesPerTrigger`` (bytes of log:
  :class:`ReadMaxBytes`); the budget is spread over partitions in proportion to their backlog
  and each partition's end is the record boundary the budget reaches (the driver walks the
  record headers: :func:`~pymetaq.spark.fetch.next_boundary`). Every partition with a backlog
  moves by at least one record. Under ``ReadAllAvailable`` (which the engine may pass) every
  limit is off. A compressed (lz4) batch is one stored record.
* **availableNow**: :meth:`prepareForTriggerAvailableNow` snapshots each partition's end;
  no batch goes beyond it (partitions that appear later wait for the next run).
* **New partitions** (a topic grows, a pattern matches a new topic) start at their first
  stored offset. A partition that disappears is a data loss (``failOnDataLoss``).
* Offsets below a partition's first stored offset (retention): the executors raise
  :class:`~pymetaq.spark.offsets.DataLoss` or skip, per ``failOnDataLoss``.
* **Group commits** (``groupId``, advisory): Spark calls :meth:`commit` with a batch's end once
  that batch is checkpointed and the next one is planned; the reader commits those offsets under
  the group (the servers' ZooKeeper for ``zk://``, the file store for ``meta://``, or
  ``offsetStore``), so ``pymetaq cluster`` and ``pymetaq offsets`` show the query's progress,
  one micro-batch behind. A restarted query still starts from its checkpoint, never from them.

Thread-safety: Spark drives a reader from one thread (the stream runner); the metadata client is
created lazily and dropped when the reader is pickled to the executors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pymetaq.client.transport.servers import zk_servers
from pymetaq.client.types import TopicPartition
from pymetaq.offsets import FileOffsetStore, OffsetEntry, OffsetStore, open_offset_store
from pymetaq.spark.batch_reader import RangePartition, read_partition
from pymetaq.spark.fetch import Brokers, next_boundary
from pymetaq.spark.offsets import DataLoss, Offsets, canonical, from_offsets, resolve, split_budget
from pymetaq.spark.options import ReadOptions

log = logging.getLogger(__name__)
_NO_LIMIT = 1 << 62


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._brokers: Brokers | None = None
        self._target: dict[TopicPartition, int] | None = None
        self._store: OffsetStore | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_brokers"] = None
        state["_store"] = None
        return state

    def _b(self) -> Brokers:
        if self._brokers is None:
            self._brokers = Brokers(self.opts.servers, self.opts.group)
        return self._brokers

    def _bounds(self) -> dict[TopicPartition, tuple[int, int]]:
        b = self._b()
        return {tp: b.bounds(tp) for tp in b.subscribed(self.opts.subscription)}

    def initialOffset(self) -> Offsets:
        bounds = self._bounds()
        return canonical(resolve(self.opts.starting, bounds, what="option 'startingOffsets'"))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: end for tp, (_first, end) in self._bounds().items()}

    def reportLatestOffset(self) -> Offsets:
        return canonical({tp: end for tp, (_first, end) in self._bounds().items()})

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        bounds = self._bounds()
        current = from_offsets(start)
        gone = sorted(str(tp) for tp in current if tp not in bounds)
        if gone and self.opts.fail_on_data_loss:
            raise DataLoss(
                f"data loss: partitions {', '.join(gone)} are gone; "
                "set failOnDataLoss=false to go on without them"
            )
        begins, ends = {}, {}
        for tp, (first, end) in bounds.items():
            begin = current.get(tp, first)
            if self._target is not None:
                end = min(end, self._target.get(tp, begin))
            begins[tp], ends[tp] = begin, max(begin, end)
        max_rows, max_bytes = _NO_LIMIT, _NO_LIMIT
        if isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
            max_bytes = self.opts.max_bytes_per_trigger or _NO_LIMIT
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
        if max_rows == _NO_LIMIT and max_bytes == _NO_LIMIT:
            return canonical(ends)
        backlog = {tp: ends[tp] - max(begins[tp], bounds[tp][0]) for tp in ends}
        byte_share = split_budget(backlog, max_bytes)
        total = sum(b for b in backlog.values() if b > 0) or 1
        out = dict(ends)
        for tp, left in backlog.items():
            if left <= 0:
                continue
            rows = _NO_LIMIT if max_rows == _NO_LIMIT else max(1, max_rows * left // total)
            begin = max(begins[tp], bounds[tp][0])
            if rows >= _NO_LIMIT and byte_share[tp] >= left:
                continue
            out[tp] = next_boundary(self._b(), tp, begin, ends[tp], byte_share[tp], rows)
        return canonical(out)

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        begins = from_offsets(start)
        out = []
        for tp, stop in sorted(from_offsets(end).items()):
            begin = begins.get(tp)
            if begin is None:  # a partition new in this batch: from its first offset
                begin = self._b().bounds(tp)[0]
            if begin < stop:
                out.append(RangePartition(tp.topic, tp.broker_id, tp.partition, begin, stop))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)

    def commit(self, end: Offsets) -> None:
        """Spark has checkpointed a batch ending at ``end`` (called when the next batch is
        planned, so the group trails the query by one micro-batch): with ``groupId``, commit
        ``end`` to the group's offset store. Advisory: a store that fails is logged, the query
        goes on (its checkpoint is the source of truth)."""
        if self.opts.group_id is None:
            return
        entries = [OffsetEntry(tp.topic, tp.key, off) for tp, off in from_offsets(end).items()]
        try:
            self._offset_store().commit(self.opts.group_id, entries)
        except Exception as e:  # advisory: any store failure (ZooKeeper down, a bad path, ...)
            log.warning("groupId %s: committing %s failed: %s", self.opts.group_id, end, e)
            self._drop_store()

    def _offset_store(self) -> OffsetStore:
        if self._store is None:
            spec, zk = self.opts.offset_store, zk_servers(self.opts.servers)
            if spec is not None:
                self._store = open_offset_store(spec)
            elif zk is not None:  # the registry's ZooKeeper, through the reader's session
                from pymetaq.offsets.zk import ZkOffsetStore

                registry = self._b().registry
                assert registry is not None
                self._store = ZkOffsetStore(client=registry.zk, root=registry.url.root)
            else:
                self._store = FileOffsetStore()  # a meta:// Consumer's default store
        return self._store

    def _drop_store(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            try:
                store.close()
            except Exception as e:
                log.warning("groupId %s: closing the offset store: %s", self.opts.group_id, e)

    def stop(self) -> None:
        self._drop_store()
        if self._brokers is not None:
            self._brokers.close()
            self._brokers = None
