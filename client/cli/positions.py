"""Offsets the CLI is asked to move to: a partition's bounds, and whether an offset is where a
message starts (``consume --from N``, ``offsets reset --to N``).

An offset is a byte position in the partition's log. Only the start of a stored record (or
the end of the log) is a place to read from: a reader put in the middle of a record would read
a payload's bytes as a header. :func:`check_record_start` asks the broker for the bytes at the
offset and checks that a whole record with a matching CRC starts there (a record's data is
at most ``maxTransferSize - 20`` bytes, so one ``get`` of 1 MiB holds it whole; a CRC that
matches by chance is a 2^-31 event).

Thread-safety: coroutines for one event loop (``asyncio.run`` in a command).
"""

from __future__ import annotations

import zlib

from pymetaq.client.consumer.transport import END_OFFSET, BrokerTransport, FetchStatus
from pymetaq.client.types import TopicPartition
from pymetaq.storage.checksum import MASK31
from pymetaq.storage.record import HEADER, HEADER_SIZE

#: the group token of the CLI's own ``get``/``offset`` requests (never committed)
CLI_GROUP = "pymetaq-cli"
#: bytes asked for when checking an offset: holds any record a broker stores
_PROBE_BYTES = 1 << 20


async def bounds(tr: BrokerTransport, tp: TopicPartition) -> tuple[int, int]:
    """``(first, end)``: the first offset still stored and the end of the log."""
    first = await tr.nearest_offset(tp, CLI_GROUP, 0)
    end = await tr.nearest_offset(tp, CLI_GROUP, END_OFFSET)
    return first, end


async def check_record_start(tr: BrokerTransport, tp: TopicPartition, offset: int) -> str | None:
    """None if a message starts at ``offset`` of ``tp`` (or it is the end of the log), else
    why not, for a person."""
    first, end = await bounds(tr, tp)
    if offset == end:
        return None
    if not first <= offset < end:
        return f"offset {offset} is outside {tp}'s offsets {first}..{end}"
    reply = await tr.fetch(tp, CLI_GROUP, offset, _PROBE_BYTES, 0)
    if reply.status is FetchStatus.MOVED:
        return (
            f"offset {offset} of {tp} is in a range whose data is gone; "
            f"the next message is at {reply.new_offset}"
        )
    if reply.status is not FetchStatus.DATA:
        return f"cannot read {tp} at {offset}: {reply.error or reply.status.value}"
    data = reply.data
    if len(data) >= HEADER_SIZE:
        length, crc, _msg_id, _flag = HEADER.unpack_from(data, 0)
        body = data[HEADER_SIZE : HEADER_SIZE + length]
        if length >= 0 and len(body) == length and zlib.crc32(body) & MASK31 == crc:
            return None
    return (
        f"offset {offset} of {tp} is not where a message starts (offsets are byte positions: "
        "use a message's offset or next_offset, e.g. from `pymetaq consume --format json`)"
    )
