"""No unfetchable record is stored: a broker with ``maxTransferSize=1024`` (a record's data may
be at most 1004 bytes, so every record fits one ``get`` reply) refuses a bigger one with 400
and stores nothing.
"""

from __future__ import annotations

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.record import iter_records
from tests.server._helpers import Wire, bput_frame, result

pytestmark = pytest.mark.integration


def test_bput_with_one_record_over_max_transfer_minus_20_is_400_and_stores_nothing(
    small_wire: Wire,
) -> None:
    frame = bput_frame("big", 0, [b"small", b"x" * 1005, b"also small"], 70)
    small_wire.send(frame)
    reason = b"invalid records: record data of 1005 bytes exceeds the limit of 1004"
    expected = result(400, reason, 70)
    assert small_wire.read_exact(len(expected)) == expected
    assert small_wire.call(b"offset big g 0 0 71\r\n") in (
        ResultReply(200, b"0", 71),
        ResultReply(404, b"The topic `big` in partition `0` is not exists", 71),
    )
    # the connection is still usable, and a record of exactly the limit is stored and fetchable
    reply = small_wire.call(bput_frame("big", 0, [b"y" * 1004], 72))
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    assert reply.body.split()[1:] == [b"0", b"0", b"1"]
    got = small_wire.call(b"get big g 0 0 1024 73\r\n")
    assert isinstance(got, ValueReply) and len(got.data) == 1024
    assert [r.data for r in iter_records(got.data)] == [b"y" * 1004]
