"""TLS between real clients and a real broker: handshakes that must pass and must fail, the
plain port beside the TLS port, produce/consume over ``meta+tls://``, the wire extension."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client import Consumer, Producer
from pymetaq.client.errors import NoBrokerAvailable
from pymetaq.client.protocol import NEED_DATA, Limits, Parser, Role, ValueReply
from tests._broker import BrokerProcess
from tests.security._helpers import Pki, security_ini, tls_port

pytestmark = pytest.mark.integration


def _tls(pki: Pki, client_auth: str = "optional") -> dict[str, str]:
    return {
        "tlsPort": "0",
        "tlsCertFile": pki.pem("localhost"),
        "tlsKeyFile": pki.key("localhost"),
        "tlsCaFile": pki.pem("ca"),
        "tlsClientAuth": client_auth,
    }


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("tlsbroker")
    ini = security_ini(base / "data", _tls(pki))
    with BrokerProcess.start(base, ini_text=ini) as b:
        yield b


def _url(port: int, pki: Pki, host: str = "localhost", **opts: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"ca": pki.pem("ca"), **opts}.items())
    return f"meta+tls://{host}:{port}?{query}"


def _roundtrip(url: str, topic: str = "test", n: int = 20) -> list[bytes]:
    values = [b"tls-%03d-" % i + b"x" * 500 for i in range(n)]
    with Producer(url) as p:
        for v in values:
            p.send(topic, v, raise_on_error=True)
    got: list[bytes] = []
    with Consumer(url, None, initial_position="earliest") as c:
        c.subscribe(topic)
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got += [m.value for m in c.poll(0.2)]
    assert got[-n:] == values
    return got


def test_produce_and_consume_over_tls_and_plain_side_by_side(
    broker: BrokerProcess, pki: Pki
) -> None:
    port = tls_port(broker)
    assert port != broker.port
    _roundtrip(_url(port, pki))
    # MetaQ's plain clients keep working on the broker port
    got = _roundtrip(f"meta://127.0.0.1:{broker.port}")
    assert len(got) == 40


def test_client_certificate_and_ip_address(broker: BrokerProcess, pki: Pki) -> None:
    port = tls_port(broker)
    _roundtrip(_url(port, pki, host="127.0.0.1", cert=pki.pem("alice"), key=pki.key("alice")), n=3)


def test_client_refuses_a_broker_it_cannot_verify(broker: BrokerProcess, pki: Pki) -> None:
    port = tls_port(broker)
    for url in (
        _url(port, pki, ca=pki.pem("other-ca")),  # signed by a CA the client does not trust
        f"meta+tls://localhost:{port}",  # the system's CAs do not know the test CA
    ):
        with pytest.raises(NoBrokerAvailable, match="certificate verify failed"):
            Producer(url)


def test_wrong_hostname_refused_unless_verify_hostname_false(pki: Pki, tmp_path: Path) -> None:
    sec = {
        **_tls(pki, "none"),
        "tlsCertFile": pki.pem("wronghost"),
        "tlsKeyFile": pki.key("wronghost"),
    }
    del sec["tlsCaFile"]
    with BrokerProcess.start(tmp_path, ini_text=security_ini(tmp_path / "data", sec)) as broker:
        port = tls_port(broker)
        with pytest.raises(NoBrokerAvailable, match="Hostname mismatch"):
            Producer(_url(port, pki))
        _roundtrip(_url(port, pki, verify_hostname="false"), n=2)


def test_plain_bytes_on_the_tls_port_are_refused(broker: BrokerProcess) -> None:
    with socket.create_connection(("127.0.0.1", tls_port(broker)), timeout=10) as s:
        s.sendall(b"version\r\n")
        assert s.recv(100) == b""  # the handshake fails: the broker closes, says nothing
    assert broker.proc is not None and broker.proc.poll() is None


def _handshake(port: int, pki: Pki, cert: str | None) -> bytes:
    ctx = ssl.create_default_context(cafile=pki.pem("ca"))
    if cert is not None:
        ctx.load_cert_chain(pki.pem(cert), pki.key(cert))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as s,
    ):
        s.sendall(b"version 7\r\n")
        return s.recv(200)


def test_mtls_required(pki: Pki, tmp_path: Path) -> None:
    ini = security_ini(tmp_path / "data", _tls(pki, "required"))
    with BrokerProcess.start(tmp_path, ini_text=ini) as broker:
        port = tls_port(broker)
        assert _handshake(port, pki, "alice").startswith(b"result 200 ")
        for cert in (None, "expired", "mallory"):  # none, expired, signed by another CA
            try:
                reply = _handshake(port, pki, cert)
            except (ssl.SSLError, OSError):  # TLS 1.3: the alert may come with the first read
                reply = b""
            assert reply == b"", cert
        assert broker.proc is not None and broker.proc.poll() is None
        assert _handshake(port, pki, "bob").startswith(b"result 200 ")


def test_tls_on_the_server_port(pki: Pki, tmp_path: Path) -> None:
    sec = {**_tls(pki, "none"), "tlsOnServerPort": "true"}
    del sec["tlsPort"], sec["tlsCaFile"]
    ini = security_ini(tmp_path / "data", sec)
    with BrokerProcess.start(tmp_path, ini_text=ini) as broker:
        assert tls_port(broker) == broker.port
        _roundtrip(_url(broker.port, pki), n=2)
        with pytest.raises(NoBrokerAvailable):
            Producer(f"meta://127.0.0.1:{broker.port}", request_timeout_ms=2000)


def _rss(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    status = Path(f"/proc/{broker.proc.pid}/status").read_text()
    (kib,) = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")]
    return kib << 10


def test_long_poll_replies_to_a_client_that_does_not_read(broker: BrokerProcess, pki: Pki) -> None:
    """Long-poll gets parked on a TLS connection whose client reads nothing, then data arrives:
    every get completes (up to 100 MiB owed) but the broker holds only what the transport
    buffers (the rest waits as deferred slices, no bytes); all replies arrive complete."""
    url = _url(tls_port(broker), pki)
    with Producer(url) as p:
        mark = p.send("test", b"marker", raise_on_error=True)
    end = mark.offset + 20 + len(b"marker")
    ctx = ssl.create_default_context(cafile=pki.pem("ca"))
    n = 100
    with (
        socket.create_connection(("127.0.0.1", tls_port(broker)), timeout=30) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as s,
    ):
        s.sendall(
            b"".join(b"get test g 0 %d 1048576 20000 %d\r\n" % (end, i + 1) for i in range(n))
        )
        assert _another_round_trip(url)  # give the broker a turn to park the gets
        before = _rss(broker)
        with Producer(url) as p:
            p.send_many("test", [b"big-%04d-" % i + b"y" * 4000 for i in range(600)], partition=0)
            p.flush()
        time.sleep(1.0)  # the scenario: the client still reads nothing while the gets complete
        grown = _rss(broker) - before
        assert grown < 24 << 20, f"the broker grew by {grown >> 20} MiB for a client not reading"
        parser = Parser(Role.CLIENT, Limits.for_transfer_size(1 << 20))
        got: dict[int, int] = {}
        while len(got) < n:
            event = parser.next_event()
            if event is NEED_DATA:
                chunk = s.recv(1 << 20)
                assert chunk, f"closed after {len(got)} replies"
                parser.feed(chunk)
                continue
            assert isinstance(event, ValueReply), event
            got[event.opaque] = len(event.data)
    assert sorted(got) == list(range(1, n + 1))
    assert min(got.values()) > 100_000  # each woke with what had arrived by then


def _another_round_trip(url: str) -> bool:
    with Producer(url) as p:
        return bool(p.partitions("test"))
