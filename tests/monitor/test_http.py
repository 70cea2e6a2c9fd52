"""The HTTP port against hostile clients (real sockets): oversized heads, too many connections,
odd methods, persistent connections; a port that cannot be bound stops the start; ``admin``
from a non-loopback peer is refused."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.protocol import AdminCommand
from pymetaq.server.broker import Broker
from pymetaq.server.config import parse_config
from pymetaq.server.http.server import MAX_CONNECTIONS
from tests._broker import BrokerProcess
from tests._helpers import free_port, wait_for

pytestmark = pytest.mark.integration


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_hostile_http_clients(tmp_path: Path) -> None:
    port = free_port()
    with BrokerProcess.start(tmp_path, system={"dashboardHttpPort": port}) as broker:
        big = b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
        assert exchange(port, big).startswith(b"HTTP/1.1 431 ")
        assert exchange(port, b"DELETE / HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 405 "
        )
        assert exchange(port, b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 404 "
        )
        body = exchange(port, b"POST / HTTP/1.1\r\nContent-Length: 70000\r\n\r\n")
        assert body.startswith(b"HTTP/1.1 413 ")
        # two requests on one connection, the second a HEAD (headers only), then close
        two = exchange(
            port,
            b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n"
            b"HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
        )
        assert two.count(b"HTTP/1.1 200 OK") == 2 and two.endswith(b"\r\n\r\n")
        # connections beyond the bound are answered 503 at once; the others keep working
        held = [
            socket.create_connection(("127.0.0.1", port), timeout=30)
            for _ in range(MAX_CONNECTIONS)
        ]
        try:
            wait_for(
                lambda: exchange(port, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 503 "),
                30,
                "a 503 past the connection bound",
            )
        finally:
            for s in held:
                s.close()
        wait_for(
            lambda: exchange(port, b"GET /api/topics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200"),
            30,
            "the port to serve again",
        )
        assert "Traceback" not in broker.log_text()


def test_a_taken_port_stops_the_start_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as err:
            BrokerProcess.start(tmp_path, system={"dashboardHttpPort": port})
    assert f"cannot listen on 127.0.0.1:{port} for the dashboard and /metrics" in str(err.value)
    assert "or 0 to turn the HTTP port off" in str(err.value)


class FakeConn:
    peer_ip = "192.0.2.7"  # TEST-NET: nothing is sent anywhere

    def __init__(self) -> None:
        self.replies: list[tuple[int, bytes, int]] = []

    def result(self, code: int, body: bytes, opaque: int) -> None:
        self.replies.append((code, body, opaque))


def test_admin_from_another_host_is_refused(tmp_path: Path) -> None:
    text = (
        f"[system]\nserverPort=0\ndashboardHttpPort=0\ndataPath={tmp_path}\n"
        "[zookeeper]\nzk.zkEnable=false\n[topic=t]\n"
    )
    with Broker(parse_config(text, cwd=str(tmp_path))) as broker:
        dispatcher, loop = broker.dispatcher, broker.loop
        assert dispatcher is not None and loop is not None
        conn = FakeConn()
        on_admin: Any = dispatcher.on_admin
        loop.call_soon_threadsafe(on_admin, conn, AdminCommand("close", ("t", "0"), 9))
        wait_for(lambda: conn.replies, 30, "the admin reply")
        assert conn.replies == [
            (403, b"admin commands are accepted only from this host (a loopback address)", 9)
        ]
        assert not dispatcher.monitor.closed
