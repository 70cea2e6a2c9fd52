"""``offset`` answers through storage's getNearestOffset: the start of the segment holding the
offset (``maxSegmentSize=4096``, so segment boundaries are reachable with a few records).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, bput_frame

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


def test_offset_answers_the_start_of_the_segment_holding_it(wire: Wire) -> None:
    # 980-byte data = 1000-byte records: four fill a 4096-byte segment, the fifth rolls
    for i in range(3):
        reply = wire.call(bput_frame("seg", 0, [bytes([65 + i]) * 980] * 3, 80 + i))
        assert isinstance(reply, ResultReply) and reply.code == 200, reply
    # segments start at 0, 3000 (the second batch did not fit), 6000; the end is 9000
    cases = {0: 0, 1: 0, 2999: 0, 3000: 3000, 4500: 3000, 5999: 3000, 6000: 6000, 8999: 6000}
    for n, (offset, want) in enumerate(cases.items()):
        line = b"offset seg g 0 %d %d\r\n" % (offset, 90 + n)
        assert wire.call(line) == ResultReply(200, b"%d" % want, 90 + n), offset
    assert wire.call(b"offset seg g 0 9000 98\r\n") == ResultReply(200, b"9000", 98)
    assert wire.call(b"offset seg g 0 123456 99\r\n") == ResultReply(200, b"9000", 99)
    assert wire.call(b"offset seg g 0 -5 100\r\n") == ResultReply(200, b"0", 100)
