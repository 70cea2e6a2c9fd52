"""The shared client core: the stable names the producer and the consumer build on.

Import from here (``from pymetaq.client.core import ...``); the pieces live in small modules:

| name | module | what |
|------|--------|------|
| ``parse_servers(s) -> list[(host, port)]`` | ``servers`` | ``"meta://h:p[,meta://h:p]"`` |
| ``BrokerSet`` | ``metadata`` | connections to all brokers, broker ids, partition lists |
| ``parse_stats(body) -> dict`` | ``servers`` | a ``stats`` reply body as ``{key: rest}`` |
| ``BrokerConnection`` | ``connection`` | one pipelined asyncio connection (opaque matching) |
| ``raise_for_reply(reply)`` | ``connection`` | non-200 ``result`` -> the mapped exception |
| ``LoopThread`` | ``connection`` | an asyncio loop in a daemon thread (one per sync client) |
| ``Message``, ``SendResult`` | ``message`` | a named tuple; a frozen dataclass |
| ``Partition(broker_id, partition)`` | ``message`` | a NamedTuple; ``.key`` = ``"b-p"``, sorted as MetaQ |
| ``build_record``, ``build_records``, ``compress_batch`` | ``message`` | record building |
| ``decode_messages(buf, topic, partition, base_offset, verify=True, *, broker_id=0)`` |
| | ``message`` | ``-> (messages, next_offset)``; CRC check, lz4 expansion, partial tail |
| ``MetaClientError`` and subclasses, ``error_for_reply`` | ``errors`` | the error tree |

``BrokerSet`` (asyncio, one loop): ``await start()``; ``await partitions(topic, refresh=False)``
-> sorted ``list[Partition]``; ``cached_partitions(topic)`` (any thread, no I/O);
``await connection(broker_id)`` / ``cached_connection(broker_id)``; ``invalidate(topic)``
(background refresh); ``brokers`` -> {id: url}; ``close()``. ``BrokerConnection``:
``await open(host, port, connect_timeout=, limits=)``, ``send_request(cmd, timeout,
on_done=None)`` -> ``asyncio.Future`` (``on_done(fut)`` runs once it is settled, from the reply
handler itself), ``await request(cmd, timeout)``, ``send_oneway(cmd)``, ``close()``,
``closed``; the command's ``opaque`` is replaced by the connection's counter.

Thread-safety: see each module (connections and broker sets belong to one event loop; values
and functions are thread-safe; ``LoopThread`` is thread-safe).
"""

from __future__ import annotations

from pymetaq.client.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    BrokerConnection,
    LoopThread,
    raise_for_reply,
)
from pymetaq.client.errors import (
    BadRequest,
    BrokerError,
    BrokerInternalError,
    BrokerTimeout,
    ClientClosed,
    ConnectionLost,
    CorruptMessage,
    MessageTooLarge,
    MetaClientError,
    NoBrokerAvailable,
    NotFound,
    OffsetOutOfRange,
    PartitionClosed,
    RequestTimeout,
    ServiceBusy,
    UnknownTopicOrPartition,
    error_for_reply,
)
from pymetaq.client.message import (
    Message,
    Partition,
    SendResult,
    build_record,
    build_records,
    compress_batch,
    decode_messages,
    make_data,
)
from pymetaq.client.metadata import BrokerSet
from pymetaq.client.servers import parse_servers, parse_stats

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "BadRequest",
    "BrokerConnection",
    "BrokerError",
    "BrokerInternalError",
    "BrokerSet",
    "BrokerTimeout",
    "ClientClosed",
    "ConnectionLost",
    "CorruptMessage",
    "LoopThread",
    "Message",
    "MessageTooLarge",
    "MetaClientError",
    "NoBrokerAvailable",
    "NotFound",
    "OffsetOutOfRange",
    "Partition",
    "PartitionClosed",
    "RequestTimeout",
    "SendResult",
    "ServiceBusy",
    "UnknownTopicOrPartition",
    "build_record",
    "build_records",
    "compress_batch",
    "decode_messages",
    "error_for_reply",
    "make_data",
    "parse_servers",
    "parse_stats",
    "raise_for_reply",
]
