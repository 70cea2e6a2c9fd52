"""The batch reader of format ``pymetaq``: plans one Spark partition per log partition (more
with ``minPartitions``) on the driver, and reads them on the executors.

Planning resolves ``startingOffsets``/``endingOffsets`` against each partition's bounds,
applies ``failOnDataLoss`` to starts below the first stored offset, and, with
``minPartitions``, splits large ranges. Offsets are byte positions and a task must start where
a record starts, so ranges are split only at **segment starts** (MetaQ's ``offset`` request
returns the start of the segment holding an offset): a range inside one segment stays one
task.

Thread-safety: Spark calls a reader from one thread; the reader holds no client after planning
(it is pickled to the executors).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pymetaq.client.types import TopicPartition
from pymetaq.spark.fetch import Brokers, read_range
from pymetaq.spark.offsets import check_start, resolve
from pymetaq.spark.options import ReadOptions
from pymetaq.spark.schema import ARROW_SCHEMA


@dataclass
class RangePartition(InputPartition):
    """``[start, end)`` of one partition (picklable: it travels to an executor)."""

    topic: str
    broker_id: int
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.broker_id, self.partition)


def read_partition(opts: ReadOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    """Executor side of both readers (a placeholder partition yields nothing: Spark plans an
    ``InputPartition(None)`` when a read has no partitions)."""
    if not isinstance(part, RangePartition):
        return iter(())
    return read_range(
        opts.servers,
        opts.group,
        part.tp,
        part.start,
        part.end,
        opts.fail_on_data_loss,
        opts.fetch_size,
        ARROW_SCHEMA,
    )


def plan_ranges(brokers: Brokers, opts: ReadOptions) -> list[RangePartition]:
    """Driver side: the ranges of a batch read."""
    parts = brokers.subscribed(opts.subscription)
    bounds = {tp: brokers.bounds(tp) for tp in parts}
    starts = resolve(opts.starting, bounds, what="option 'startingOffsets'")
    ends = resolve(opts.ending, bounds, what="option 'endingOffsets'")
    ranges = []
    for tp in parts:
        first, last = bounds[tp]
        start = check_start(tp, starts[tp], first, last, opts.fail_on_data_loss)
        end = min(ends[tp], last)
        if start < end:
            ranges.append((tp, start, end))
    pieces = split_counts([e - s for _, s, e in ranges], opts.min_partitions)
    out: list[RangePartition] = []
    for (tp, start, end), n in zip(ranges, pieces):
        cuts = {start, end}
        for i in range(1, n):
            cut = brokers.nearest(tp, start + (end - start) * i // n)
            if start < cut < end:
                cuts.add(cut)
        edges = sorted(cuts)
        out.extend(
            RangePartition(tp.topic, tp.broker_id, tp.partition, a, b)
            for a, b in itertools.pairwise(edges)
        )
    return out


def split_counts(sizes: Sequence[int], min_partitions: int | None) -> list[int]:
    """How many pieces each range is cut into so the total reaches ``min_partitions``: in
    proportion to its size (Kafka's rule), at least one each."""
    if not min_partitions or min_partitions <= len(sizes):
        return [1] * len(sizes)
    total = sum(sizes) or 1
    return [max(1, -(-min_partitions * s // total)) for s in sizes]


class BatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        with Brokers(self.opts.servers, self.opts.group) as brokers:
            return plan_ranges(brokers, self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)
