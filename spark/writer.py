"""The sink of format ``pymetaq``, batch and streaming: Arrow writers that send each row with
the client's ``Producer``.

Each task opens a ``Producer``, queues every row (``send_async``: the producer batches and
pipelines them), flushes and checks every send's result before it returns its commit message:
a task succeeds only when every row it got is acknowledged (durable under the broker's
policy). Partition choice is the Producer's own: the ``partition`` column (a
``"<brokerId>-<partition>"`` key) wins, else ``crc32(key) % n`` over the topic's sorted
partitions (identical to any Producer), else round-robin.

Delivery: **at-least-once** — a task Spark retries, or a micro-batch replayed after a failure,
sends its rows again.

Thread-safety: Spark runs one writer task per thread; commit/abort run on the driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from pymetaq.client.errors import MetaClientError
from pymetaq.client.producer.sync import Producer
from pymetaq.spark.exactly_once import (
    XA_TIMEOUT_S,
    Branch,
    abort_batch,
    commit_batch,
    run_branch,
    sink_identity,
)
from pymetaq.spark.options import SparkOptionError, WriteOptions
from pymetaq.spark.schema import SINK_COLUMNS

#: how long a task waits for its acks after the last row
_ACK_TIMEOUT_S = 60.0


@dataclass
class SinkCommit(WriterCommitMessage):
    """What a task sent: rows acknowledged, per topic."""

    rows: int
    topics: tuple[str, ...] = ()


def check_sink_schema(schema: StructType, overwrite: bool) -> None:
    """Refuse what the sink cannot do before any task runs."""
    if overwrite:
        raise SparkOptionError(
            "format 'pymetaq' only appends to a topic: use .mode('append') "
            "(a topic cannot be overwritten)"
        )
    names = {f.name.lower(): f for f in schema.fields}
    if "value" not in names:
        raise SparkOptionError("the rows to write need a 'value' column (binary or string)")
    for name, field in names.items():
        allowed = SINK_COLUMNS.get(name)
        if allowed is None:
            raise SparkOptionError(
                f"column {field.name!r} cannot be written: the sink takes "
                f"{', '.join(SINK_COLUMNS)} (select or drop the others)"
            )
        kind = (
            "binary"
            if isinstance(field.dataType, BinaryType)
            else (
                "string"
                if isinstance(field.dataType, StringType)
                else field.dataType.simpleString()
            )
        )
        if kind not in allowed:
            raise SparkOptionError(
                f"column {field.name!r} is {kind}; the sink takes {' or '.join(allowed)}"
            )


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx).to_pylist()


def _encode(v: Any) -> bytes | None:
    return v.encode("utf-8") if isinstance(v, str) else v


def send_batches(
    producer: Producer, opts: WriteOptions, batches: Iterator[pa.RecordBatch]
) -> SinkCommit:
    """Send every row, wait for every ack; raise the first failure."""
    handles = []
    topics: set[str] = set()
    for batch in batches:
        cols = {n: _column(batch, n) for n in SINK_COLUMNS}
        values = cols["value"]
        assert values is not None
        n = len(values)
        keys = cols["key"] or [None] * n
        parts = cols["partition"] or [None] * n
        attrs = cols["attribute"] or [None] * n
        tcol = cols["topic"] or [None] * n
        for i in range(n):
            topic = tcol[i] or opts.topic
            if topic is None:
                raise SparkOptionError("a row has no topic: give option 'topic' or a topic column")
            value = _encode(values[i])
            if value is None:
                raise SparkOptionError(f"a row for topic {topic!r} has a null value")
            topics.add(topic)
            handles.append(
                producer.send_async(
                    topic, value, key=_encode(keys[i]), partition=parts[i], attribute=attrs[i]
                )
            )
    if not producer.flush(_ACK_TIMEOUT_S):
        raise MetaClientError(f"{len(handles)} sends were not acknowledged in {_ACK_TIMEOUT_S}s")
    for h in handles:
        result = h.result(_ACK_TIMEOUT_S)
        if result.error is not None:
            raise result.error
    return SinkCommit(len(handles), tuple(sorted(topics)))


def _send_all(opts: WriteOptions, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
    with Producer(opts.servers) as producer:
        return send_batches(producer, opts, batches)


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return _send_all(self.opts, iterator)


class StreamWriter(DataSourceStreamArrowWriter):
    """At-least-once streaming sink: the same sends as :class:`BatchWriter`."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return _send_all(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


@dataclass
class BranchCommit(WriterCommitMessage):
    """What an exactly-once task prepared."""

    rows: int
    branch: Branch


def _topics_of(opts: WriteOptions, batches: list[pa.RecordBatch]) -> list[str]:
    topics = {opts.topic} if opts.topic else set()
    for batch in batches:
        col = _column(batch, "topic")
        if col is not None:
            topics.update(t for t in col if t)
    return sorted(t for t in topics if t)


class ExactlyOnceStreamWriter(DataSourceStreamArrowWriter):
    """``deliveryGuarantee=exactly-once``: see :mod:`pymetaq.spark.exactly_once`."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.ident = sink_identity(dict(opts.raw))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BranchCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "write() runs in a Spark task"
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or 0)
        xid = self.ident.xid(batch_id, ctx.partitionId(), ctx.attemptNumber())
        batches = list(iterator)  # the topics must be known before the branch starts
        topics = _topics_of(self.opts, batches)
        if not topics:  # no rows: nothing to prepare
            return BranchCommit(0, Branch.of(xid, -1, rdonly=True))
        sent = SinkCommit(0)
        with Producer(self.opts.servers) as producer:
            for t in topics:
                producer.partitions(t)  # an XA resource picks among the topics' brokers
            xa = producer.xa_resource(
                self.ident.qualifier, topics=topics, request_timeout_s=XA_TIMEOUT_S
            )

            def send() -> None:
                nonlocal sent
                sent = send_batches(producer, self.opts, iter(batches))

            branch = run_branch(xa, xid, send)
        return BranchCommit(sent.rows, branch)

    def _xa(self, messages: list[WriterCommitMessage | None]) -> tuple[Producer, list[Branch]]:
        branches = [m.branch for m in messages if isinstance(m, BranchCommit)]
        return Producer(self.opts.servers), branches

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        producer, branches = self._xa(messages)
        with producer:  # no topic: every broker is a candidate (recover asks them all)
            xa = producer.xa_resource(
                self.ident.qualifier, topics=[], request_timeout_s=XA_TIMEOUT_S
            )
            commit_batch(xa, self.ident, batchId, branches)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        producer, branches = self._xa(messages)
        with producer:
            xa = producer.xa_resource(
                self.ident.qualifier, topics=[], request_timeout_s=XA_TIMEOUT_S
            )
            abort_batch(xa, branches)
