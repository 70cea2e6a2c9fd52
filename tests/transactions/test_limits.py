"""What a client can make the broker hold is bounded; timeouts roll transactions back.

One broker with small limits: 2 local transactions per connection, 4 open transactions per
broker, 4 KiB of held messages, a 2 s timeout cap.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from pymetaq.client.protocol import ResultReply
from pymetaq.server.stats import VERSION
from pymetaq.server.transaction.handler import _loopback
from tests._broker import BrokerProcess
from tests.transactions._txwire import Wire, log_when, ok, put_ok, result, tx_line, tx_put, wait_for

pytestmark = pytest.mark.integration

SYSTEM = {
    "idleTimeoutMs": 0,
    "maxTxPerConnection": 2,
    "maxTxTimeoutTimerCapacity": 4,
    "maxTxHeldBytes": 4096,
    "maxTxTimeoutInSeconds": 2,
}
_n = itertools.count(1)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    topics = {"lim": {}, "expire": {}}
    with BrokerProcess.start(tmp_path_factory.mktemp("txlim"), topics=topics, system=SYSTEM) as b:
        yield b


def key() -> str:
    return f"TX:lim-{next(_n)}:1"


def open_keys(w: Wire) -> dict[str, str]:
    body = w.call(b"stats transactions 77\r\n").body.decode()
    return dict(line.split(" ", 1) for line in body.split("\r\n")[1:-2])


def test_local_transactions_per_connection(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w, Wire(broker.address) as other:
        a, b, c = key(), key(), key()
        ok(w, tx_line(a, "s", "BEGIN", 1), 1)
        ok(w, tx_line(b, "s", "BEGIN", 2), 2)
        body = b"XAException:code=-3,msg=too many open transactions on this connection (maxTxPerConnection=2)"
        w.exact(tx_line(c, "s", "BEGIN", 3), result(500, body, 3))
        ok(other, tx_line(c, "s", "BEGIN", 4), 4)  # another connection still can
        ok(w, tx_line(a, "s", "ROLLBACK", 5), 5)
        ok(w, tx_line(key(), "s", "BEGIN", 6), 6)  # a slot came free


def test_open_transactions_per_broker(broker: BrokerProcess) -> None:
    conns = [Wire(broker.address) for _ in range(3)]
    try:
        keys = [f"XID:1:{next(_n):04x}:01:lim" for _ in range(5)]
        for i, k in enumerate(keys[:4]):
            ok(conns[i % 3], tx_line(k, "s", "BEGIN", "lim", 10 + i), 10 + i)
        body = b"XAException:code=-3,msg=too many open transactions on this broker (maxTxTimeoutTimerCapacity=4)"
        conns[0].exact(tx_line(keys[4], "s", "BEGIN", "lim", 20), result(500, body, 20))
        conns[0].exact(b"version 21\r\n", result(200, VERSION.encode(), 21))  # the broker is fine
        ok(conns[1], tx_line(keys[0], "s", "ROLLBACK", "lim", 22), 22)
        ok(conns[0], tx_line(keys[4], "s", "BEGIN", "lim", 23), 23)
        for i, k in enumerate(keys[1:]):
            ok(conns[2], tx_line(k, "s", "ROLLBACK", "lim", 30 + i), 30 + i)
    finally:
        for c in conns:
            c.close()


def test_held_bytes_are_bounded(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        k = key()
        ok(w, tx_line(k, "s", "BEGIN", 1), 1)
        for i in range(3):
            put_ok(w, "lim", 0, b"x" * 1000, k, 10 + i)
        r = w.call(tx_put("lim", 0, b"y" * 1200, k, 20))
        assert r == ResultReply(
            500,
            b"Put message failed: transactions on this broker already hold 3060 bytes "
            b"(maxTxHeldBytes=4096)",
            20,
        )
        ok(w, tx_line(k, "s", "COMMIT_ONE_PHASE", 21), 21)  # the accepted three commit
        assert [len(rec.data) for rec in log_when(broker.address, "lim", 0, 3)] == [1000] * 3
        k2 = key()
        ok(w, tx_line(k2, "s", "BEGIN", 22), 22)
        put_ok(w, "lim", 0, b"y" * 1200, k2, 23)  # space was freed by the commit
        ok(w, tx_line(k2, "s", "ROLLBACK", 24), 24)


def test_an_expired_transaction_is_rolled_back_and_a_late_commit_fails(
    broker: BrokerProcess,
) -> None:
    with Wire(broker.address) as w:
        local, xa, prepared = key(), f"XID:1:{next(_n):04x}:02:lim", f"XID:1:{next(_n):04x}:03:lim"
        ok(w, tx_line(local, "s", "BEGIN", 1, 1), 1)
        put_ok(w, "expire", 0, b"late-local", local, 2)
        ok(w, tx_line(xa, "s", "BEGIN", 1, "lim", 3), 3)
        put_ok(w, "expire", 0, b"late-xa", xa, 4)
        ok(w, tx_line(prepared, "s", "BEGIN", 1, "lim", 5), 5)
        put_ok(w, "expire", 0, b"prepared", prepared, 6)
        ok(w, tx_line(prepared, "s", "PREPARE", "lim", 7), 7, b"0")
        wait_for(lambda: local not in open_keys(w) and xa not in open_keys(w), what="timeouts")
        assert open_keys(w)[prepared].startswith("state PREPARED")  # prepared: never expires
        expired = f"Local transaction '{local}' was rolled back: it timed out after 1 s"
        w.exact(tx_line(local, "s", "COMMIT_ONE_PHASE", 8), result(500, expired.encode(), 8))
        r = w.call(tx_put("expire", 0, b"more", local, 9))
        assert r == ResultReply(500, expired.encode(), 9)
        xa_expired = f"XAException:code=106,msg=XA transaction '{xa}' was rolled back: it timed out after 1 s"
        w.exact(
            tx_line(xa, "s", "COMMIT_ONE_PHASE", "lim", 10), result(500, xa_expired.encode(), 10)
        )
        ok(w, tx_line(prepared, "s", "COMMIT_TWO_PHASE", "lim", 11), 11)
        assert [r.data for r in log_when(broker.address, "expire", 0, 1)] == [b"prepared"]


def test_a_begin_without_timeout_gets_the_cap(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        k = key()
        ok(w, tx_line(k, "s", "BEGIN", 1), 1)
        assert " timeout_s 2 " in open_keys(w)[k]
        ok(w, tx_line(k, "s", "ROLLBACK", 2), 2)


def test_txadmin_is_refused_from_a_non_loopback_peer(
    broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ip = _outside_address()
    system = {**SYSTEM, "hostName": ip}
    with BrokerProcess.start(
        tmp_path_factory.mktemp("txremote"), topics={"t": {}}, system=system
    ) as b:
        assert b.host == ip
        with Wire(b.address) as w:
            body = b"txadmin is accepted only from a loopback address (see docs/transactions.md)"
            w.exact(b"txadmin commit XID:1:aa:bb:q 1\r\n", result(403, body, 1))
            w.exact(b"version 2\r\n", result(200, VERSION.encode(), 2))


def test_loopback_check_covers_ipv4_ipv6_and_unknown_peers() -> None:
    def conn(peer: object) -> object:
        return SimpleNamespace(transport=SimpleNamespace(get_extra_info=lambda name: peer))

    assert _loopback(conn(("127.0.0.1", 5)))  # type: ignore[arg-type]
    assert _loopback(conn(("127.8.9.1", 5)))  # type: ignore[arg-type]
    assert _loopback(conn(("::1", 5, 0, 0)))  # type: ignore[arg-type]
    assert not _loopback(conn(("192.0.2.7", 5)))  # type: ignore[arg-type]
    assert not _loopback(conn(("fd00::2", 5, 0, 0)))  # type: ignore[arg-type]
    assert not _loopback(conn(None))  # type: ignore[arg-type]
    assert not _loopback(conn("/tmp/sock"))  # type: ignore[arg-type]


def _outside_address() -> str:
    """This machine's primary non-loopback IPv4 address (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))
        except OSError as exc:
            raise AssertionError(f"this test needs a non-loopback IPv4 address: {exc}") from exc
        ip: str = s.getsockname()[0]
    assert not ip.startswith("127."), "this test needs a non-loopback IPv4 address"
    return ip
