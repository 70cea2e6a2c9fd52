"""Issue 8, defect 9 (client side): a send whose request was written but got no answer is
reported as :class:`MessageMayBeStored` — and it really may have been stored; a send that was
never written is reported with an error that is not.

Against a real broker: SIGSTOP freezes it after it read nothing yet (the request sits in its
socket), the producer's attempt times out, SIGCONT lets the broker store it after all.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client import MessageMayBeStored, Producer, RequestTimeout
from pymetaq.client.errors import MayBeStoredConnectionLost, MayBeStoredTimeout
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.client._helpers import fetch_all

pytestmark = pytest.mark.integration


def _values(broker: BrokerProcess) -> list[bytes]:
    return [m.value for m in fetch_all(broker.address, "t", 0)]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess.start(tmp_path, topics={"t": {"numPartitions": 1}}) as b:
        yield b


def _freeze(broker: BrokerProcess) -> int:
    """SIGSTOP the broker (it reads nothing more); returns its pid for SIGCONT."""
    assert broker.proc is not None
    os.kill(broker.proc.pid, signal.SIGSTOP)
    return broker.proc.pid


def test_a_written_send_that_times_out_may_have_been_stored(broker: BrokerProcess) -> None:
    with Producer(f"meta://{broker.host}:{broker.port}", request_timeout_ms=300) as p:
        assert p.send("t", b"before").success
        pid = _freeze(broker)
        try:
            r = p.send("t", b"frozen")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert not r.success
        err = r.error
        assert isinstance(err, MayBeStoredTimeout)
        assert isinstance(err, MessageMayBeStored) and isinstance(err, RequestTimeout)
        assert err.retriable and err.invalid_metadata
        assert "may have been stored" in str(err)
        # ... and it was: the broker read the request once it ran again
        wait_for(lambda: len(_values(broker)) == 2, 30, "the late store")
        assert _values(broker) == [b"before", b"frozen"]


def test_a_send_lost_with_its_connection_may_have_been_stored(broker: BrokerProcess) -> None:
    with Producer(f"meta://{broker.host}:{broker.port}", request_timeout_ms=30_000) as p:
        assert p.send("t", b"before").success
        _freeze(broker)
        h = p.send_async("t", b"in flight")
        p.flush(0.3)  # written, unanswered
        broker.kill()  # the connection dies with the request pending
        r = h.result(30)
        assert not r.success and isinstance(r.error, MayBeStoredConnectionLost)
        # a send after the broker is gone is never written: a plain, definite failure
        r2 = p.send("t", b"never written")
        assert not r2.success
        assert not isinstance(r2.error, MessageMayBeStored), r2.error
