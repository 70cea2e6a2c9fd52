"""Fixtures shared by the broker's test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._broker import BrokerProcess
from tests.server._helpers import Wire


@pytest.fixture(scope="module")
def small_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker (one per module) with ``maxTransferSize=1024`` (a record's data may be at most
    1004 bytes: every record must fit one ``get`` reply) and ``maxSegmentSize=4096`` (segment
    boundaries reachable with a few records); topics ``big``, ``seg`` and ``edge``."""
    system = {"idleTimeoutMs": 0, "maxTransferSize": 1024, "maxSegmentSize": 4096}
    topics: dict[str, dict[str, int]] = {"big": {}, "seg": {}, "edge": {}}
    tmp = tmp_path_factory.mktemp("small")
    with BrokerProcess.start(tmp, topics=topics, system=system) as b:
        yield b


@pytest.fixture
def small_wire(small_broker: BrokerProcess) -> Iterator[Wire]:
    """A connection to :func:`small_broker`."""
    with Wire(small_broker.address) as w:
        yield w
