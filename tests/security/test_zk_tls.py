"""``zk://`` discovery of TLS listeners: a broker with ``tlsPort`` registers
``brokers/ids/<id>/master_tls`` next to MetaQ's ``master``; a client whose ``zk://`` URL carries
TLS options connects to that address (real ZooKeeper, a real broker)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client import Consumer, Producer
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import ZooKeeperServer
from tests.security._helpers import Pki, security_ini, tls_port

pytestmark = [pytest.mark.zk, pytest.mark.integration]


def test_zk_discovery_of_the_tls_listener(
    tmp_path: Path, pki: Pki, zk_server: ZooKeeperServer, zk_hosts: str
) -> None:
    sec = {"tlsPort": "0", "tlsCertFile": pki.pem("localhost"), "tlsKeyFile": pki.key("localhost")}
    zk_keys = f"zk.zkEnable=true\nzk.zkConnect={zk_hosts}\nzk.zkSyncTimeMs=100\n"
    ini = security_ini(tmp_path / "data", sec, topics="[topic=orders]\nnumPartitions=2\n")
    ini = ini.replace("zk.zkEnable=false\n", zk_keys)
    chroot = zk_hosts[len(zk_server.hosts) :]
    with BrokerProcess.start(tmp_path, ini_text=ini) as broker:
        from kazoo.client import KazooClient

        zk: Any = KazooClient(hosts=zk_hosts)
        zk.start(timeout=15)
        try:
            node = "/meta/brokers/ids/0/master_tls"
            wait_for(lambda: zk.exists(node), 30, "the TLS address registered")
            tls = tls_port(broker)
            assert zk.get(node)[0] == f"meta+tls://127.0.0.1:{tls}".encode()
            assert (
                zk.get("/meta/brokers/ids/0/master")[0]
                == f"meta://127.0.0.1:{broker.port}".encode()
            )
            assert sorted(zk.get_children("/meta/brokers/ids/0")) == [
                "master",
                "master_config_checksum",
                "master_tls",
            ]
        finally:
            zk.stop()
            zk.close()
        url = f"zk://{zk_server.hosts}{chroot}/meta?ca={pki.pem('ca')}"
        with Producer(url) as p:
            r = p.send("orders", b"over-tls-via-zk", raise_on_error=True)
            assert r.success
        got: list[bytes] = []
        with Consumer(url, None, initial_position="earliest") as c:
            c.subscribe("orders")
            deadline = time.monotonic() + 30
            while b"over-tls-via-zk" not in got and time.monotonic() < deadline:
                got += [m.value for m in c.poll(0.2)]
        assert b"over-tls-via-zk" in got
        # the commands take the same URL: each broker's master_tls address, over TLS
        done = cli("stats", "--servers", url, "--json")
        assert done.returncode == 0, done.stderr
        assert [d["server"] for d in json.loads(done.stdout)] == [f"meta://127.0.0.1:{tls}"]
        done = cli("admin", "closed", "--servers", url)
        assert done.returncode == 0, done.stderr
        # without the CA the handshake fails: the TLS listener (not the plain port) was asked
        done = cli(
            "stats", "--servers", f"zk://{zk_server.hosts}{chroot}/meta?verify_hostname=true"
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    # the client's connections are TLS (its security is TLS): the plain port would refuse the
    # handshake, so reaching the broker at all proves the master_tls address was used


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=90,
    )
