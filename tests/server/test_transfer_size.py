"""No unfetchable record is stored: a broker with ``maxTransferSize=1024`` (a record's data may
be at most 1004 bytes, so every record fits one ``get`` reply) refuses a bigger one with 400
and stores nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.record import iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, bput_frame, result

pytestmark = pytest.mark.integration

TOPICS = {"big": {}, "seg": {}, "edge": {}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp: Path = tmp_path_factory.mktemp("fixes")
    system = {"idleTimeoutMs": 0, "maxTransferSize": 1024, "maxSegmentSize": 4096}
    with BrokerProcess.start(tmp, topics=TOPICS, system=system) as b:
        yield b


@pytest.fixture
def wire(broker: BrokerProcess) -> Iterator[Wire]:
    with Wire(broker.address) as w:
        yield w


def test_bput_with_one_record_over_max_transfer_minus_20_is_400_and_stores_nothing(
    wire: Wire,
) -> None:
    frame = bput_frame("big", 0, [b"small", b"x" * 1005, b"also small"], 70)
    wire.send(frame)
    reason = b"invalid records: record data of 1005 bytes exceeds the limit of 1004"
    expected = result(400, reason, 70)
    assert wire.read_exact(len(expected)) == expected
    assert wire.call(b"offset big g 0 0 71\r\n") in (
        ResultReply(200, b"0", 71),
        ResultReply(404, b"The topic `big` in partition `0` is not exists", 71),
    )
    # the connection is still usable, and a record of exactly the limit is stored and fetchable
    reply = wire.call(bput_frame("big", 0, [b"y" * 1004], 72))
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    assert reply.body.split()[1:] == [b"0", b"0", b"1"]
    got = wire.call(b"get big g 0 0 1024 73\r\n")
    assert isinstance(got, ValueReply) and len(got.data) == 1024
    assert [r.data for r in iter_records(got.data)] == [b"y" * 1004]
