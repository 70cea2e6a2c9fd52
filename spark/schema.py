"""The rows of format ``pymetaq``: the read schema (modelled on Kafka's source) and what the
sink accepts.

| column | type | meaning |
|---|---|---|
| ``key`` | binary | the key the producer sent (null without one) |
| ``value`` | binary | the message body |
| ``topic`` | string | |
| ``partition`` | string | MetaQ's partition key ``"<brokerId>-<partition>"`` |
| ``offset`` | long | the byte position of the stored record (an lz4 batch's messages share it) |
| ``msg_id`` | long | the broker-assigned message id |
| ``timestamp`` | timestamp | when the broker stored it: the id's time bits (UTC) |
| ``attribute`` | string | MetaQ's message attribute (null without one) |

The sink takes ``value`` (binary or string, required) and optional ``key`` (binary or string),
``topic`` (string), ``partition`` (string key) and ``attribute`` (string); other columns are
refused, so a typo is not silently dropped.

Thread-safety: constants.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_DDL = (
    "key binary, value binary, topic string, partition string, offset long, msg_id long, "
    "timestamp timestamp, attribute string"
)

ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.string()),
        ("offset", pa.int64()),
        ("msg_id", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("attribute", pa.string()),
    ]
)

#: the sink's columns: name -> the Spark types it accepts
SINK_COLUMNS = {
    "value": ("binary", "string"),
    "key": ("binary", "string"),
    "topic": ("string",),
    "partition": ("string",),
    "attribute": ("string",),
}
