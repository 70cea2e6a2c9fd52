"""Brokers register in a real ZooKeeper exactly as MetaQ's table says (real broker processes)."""

from __future__ import annotations

import contextlib
import functools
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.client.protocol.zk import parse_meta_url
from tests._broker import BrokerProcess, write_server_ini
from tests._helpers import wait_for
from tests._services import free_port
from tests.cluster.conftest import ephemerals
from tests.server._helpers import Wire, put_line

pytestmark = [pytest.mark.zk, pytest.mark.integration]

TOPICS = {
    "orders": {"numPartitions": 3},
    "audit": {"numPartitions": 2, "acceptPublish": "false"},
    "outbox": {"acceptSubscribe": "false"},
    "log-*": {"numPartitions": 2},
}


def _zk(hosts: str, **extra: Any) -> dict[str, Any]:
    return {
        "zk.zkEnable": "true",
        "zk.zkConnect": hosts,
        "zk.zkSessionTimeoutMs": 2000,
        "zk.zkConnectionTimeoutMs": 10000,
        "zk.zkSyncTimeMs": 300,
        **extra,
    }


def _start(tmp_path: Path, hosts: str, broker_id: int, **kw: Any) -> BrokerProcess:
    zk = _zk(hosts, **kw.pop("zk", {}))
    return BrokerProcess.start(
        tmp_path,
        name=kw.pop("name", f"b{broker_id}"),
        system={"brokerId": broker_id, **kw.pop("system", {})},
        topics=kw.pop("topics", TOPICS),
        zookeeper=zk,
    )


def _expected(b: BrokerProcess, broker_id: int, ini: Path) -> dict[str, bytes]:
    url = f"meta://{b.host}:{b.port}".encode()
    crc = zlib.crc32(ini.read_bytes()) & 0xFFFFFFFF
    j = b'{"numParts":%d,"broker":"%d-m"}'
    return {
        f"/meta/brokers/ids/{broker_id}/master": url,
        f"/meta/brokers/ids/{broker_id}/master_config_checksum": str(crc).encode(),
        f"/meta/brokers/topics/orders/{broker_id}-m": b"3",
        f"/meta/brokers/topics/audit/{broker_id}-m": b"2",
        f"/meta/brokers/topics/outbox/{broker_id}-m": b"1",
        f"/meta/brokers/topics-pub/orders/{broker_id}-m": j % (3, broker_id),
        f"/meta/brokers/topics-sub/orders/{broker_id}-m": j % (3, broker_id),
        f"/meta/brokers/topics-sub/audit/{broker_id}-m": j % (2, broker_id),
        f"/meta/brokers/topics-pub/outbox/{broker_id}-m": j % (1, broker_id),
    }


def _mine(zk: Any, broker_id: int) -> dict[str, bytes]:
    """Broker ``broker_id``'s ephemeral nodes -> values."""
    return {
        p: v
        for p, v in ephemerals(zk, "/meta/brokers").items()
        if p.startswith(f"/meta/brokers/ids/{broker_id}/") or p.endswith(f"/{broker_id}-m")
    }


def metaq_python_producer_partitions(zk: Any, topic: str) -> list[tuple[str, int, int]]:
    """What MetaQ's Python producer (contrib/python, zkpython) reads: the legacy
    ``/meta/brokers/topics/<topic>`` ``-m`` children (count = node text) and each broker's
    ``/meta/brokers/ids/<id>/master`` URL -> [(url, brokerId, partition)]."""
    out = []
    for child in sorted(zk.get_children(f"/meta/brokers/topics/{topic}")):
        if not child.endswith("-m"):
            continue
        broker_id = child.split("-")[0]
        count = int(zk.get(f"/meta/brokers/topics/{topic}/{child}")[0].decode())
        url = zk.get(f"/meta/brokers/ids/{broker_id}/master")[0].decode()
        out += [(url, int(broker_id), p) for p in range(count)]
    return out


def test_three_brokers_register_exactly_as_metaq(tmp_path: Path, zk_hosts: str, zk: Any) -> None:
    with contextlib.ExitStack() as stack:
        brokers = [stack.enter_context(_start(tmp_path, zk_hosts, i)) for i in range(3)]
        for i, b in enumerate(brokers):
            want = _expected(b, i, b.config_path)
            wait_for(functools.partial(_registered, zk, i, want), what=f"broker {i} registered")
            assert zk.get(f"/meta/brokers/ids/{i}")[0] == want[f"/meta/brokers/ids/{i}/master"]
        assert not zk.exists("/meta/brokers/topics/log-*")  # patterns are not topics
        assert sorted(zk.get_children("/meta/brokers/topics-sub/orders")) == ["0-m", "1-m", "2-m"]

        # MetaQ's Python producer finds every partition, and a 6-token put (no checksum) works
        found = metaq_python_producer_partitions(zk, "orders")
        assert [(b, p) for _, b, p in found] == [(b, p) for b in range(3) for p in range(3)]
        url, broker_id, part = found[4]
        assert parse_meta_url(url) == brokers[broker_id].address
        with Wire(parse_meta_url(url)) as w:
            w.send(b"put orders %d 5 0 7\r\nhello" % part)
            assert _code(w.reply()) == 200

        # a pattern topic is registered when its first put creates the store
        with Wire(brokers[1].address) as w:
            assert _code(w.call(put_line("log-app", 1, b"x", 1))) == 200
        j = b'{"numParts":2,"broker":"1-m"}'
        log_app = {
            "/meta/brokers/topics/log-app/1-m": b"2",
            "/meta/brokers/topics-pub/log-app/1-m": j,
            "/meta/brokers/topics-sub/log-app/1-m": j,
        }
        wait_for(
            lambda: _mine(zk, 1) == _expected(brokers[1], 1, brokers[1].config_path) | log_app,
            what="log-app registered",
        )
        assert not zk.exists("/meta/brokers/topics/log-app/0-m")


def test_stop_unregisters_then_serves_for_sync_time(tmp_path: Path, zk_hosts: str, zk: Any) -> None:
    b = _start(tmp_path, zk_hosts, 4, zk={"zk.zkSyncTimeMs": 3000})
    with b:
        wait_for(lambda: zk.exists("/meta/brokers/topics-pub/orders/4-m"), what="registered")
        b.signal(signal.SIGTERM)
        wait_for(lambda: not _mine(zk, 4), timeout_s=10, what="every node gone")
        assert b.proc is not None and b.proc.poll() is None, "unregistered before stopping"
        with Wire(b.address) as w:  # still serving during zk.zkSyncTimeMs
            assert _code(w.call(put_line("orders", 0, b"late", 9))) == 200
        assert b.terminate() == 0
        assert zk.get("/meta/brokers/ids/4")[0] == b""  # parent blanked for old clients
        assert "unregistered from ZooKeeper; serving 3000 ms more" in b.log_text()


def test_session_expiry_re_registers(tmp_path: Path, zk_hosts: str, zk: Any) -> None:
    b = _start(tmp_path, zk_hosts, 5)
    with b:
        want = _expected(b, 5, b.config_path)
        wait_for(lambda: _mine(zk, 5) == want, what="registered")
        before = zk.exists("/meta/brokers/ids/5/master").ephemeralOwner
        b.signal(signal.SIGSTOP)  # silent for longer than the 2 s session: the server expires it
        try:
            wait_for(lambda: not _mine(zk, 5), timeout_s=20, what="session expired")
        finally:
            b.signal(signal.SIGCONT)
        wait_for(lambda: _mine(zk, 5) == want, timeout_s=20, what="re-registered")
        assert zk.exists("/meta/brokers/ids/5/master").ephemeralOwner != before


def test_config_reload_re_registers(tmp_path: Path, zk_hosts: str, zk: Any) -> None:
    b = _start(tmp_path, zk_hosts, 6, topics={"a": {"numPartitions": 1}, "b": {}})
    with b:
        wait_for(lambda: zk.exists("/meta/brokers/topics-pub/b/6-m"), what="registered")
        write_server_ini(
            b.config_path,
            data_path=b.data_path,
            system={"brokerId": 6},
            topics={"a": {"numPartitions": 4, "acceptPublish": "false"}, "c": {}},
            zookeeper=_zk(zk_hosts),
        )
        b.signal(signal.SIGHUP)
        want = _expected(b, 6, b.config_path)  # for the checksum and the master
        j = b'{"numParts":%d,"broker":"6-m"}'
        want = {k: v for k, v in want.items() if "/ids/" in k} | {
            "/meta/brokers/topics/a/6-m": b"4",
            "/meta/brokers/topics-sub/a/6-m": j % 4,
            "/meta/brokers/topics/c/6-m": b"1",
            "/meta/brokers/topics-pub/c/6-m": j % 1,
            "/meta/brokers/topics-sub/c/6-m": j % 1,
        }
        wait_for(lambda: _mine(zk, 6) == want, what="re-registered after reload")


def test_same_id_and_role_refuses_to_start(tmp_path: Path, zk_hosts: str, zk: Any) -> None:
    first = _start(tmp_path, zk_hosts, 7)
    with first:
        wait_for(lambda: zk.exists("/meta/brokers/ids/7/master"), what="first registered")
        owner = zk.exists("/meta/brokers/ids/7/master").ephemeralOwner
        with pytest.raises(RuntimeError) as err:
            _start(tmp_path, zk_hosts, 7, name="dup")
        text = str(err.value)
        assert "exited with 1 before listening" in text
        assert "another broker is registered with brokerId=7 as master at meta://" in text
        assert "Traceback" not in text
        url = f"meta://{first.host}:{first.port}".encode()
        assert zk.get("/meta/brokers/ids/7/master")[0] == url
        assert zk.get("/meta/brokers/ids/7")[0] == url  # the refused broker wrote nothing
        assert zk.exists("/meta/brokers/ids/7/master").ephemeralOwner == owner
        assert "waiting up to" in text and "crashed previous run" in text


def test_crash_restart_on_a_new_port_takes_over(tmp_path: Path, zk_hosts: str, zk: Any) -> None:
    b = _start(tmp_path, zk_hosts, 8)
    with b:
        wait_for(lambda: zk.exists("/meta/brokers/ids/8/master"), what="registered")
        b.kill()
        b.launch()  # serverPort=0: a new address while the dead session still holds the node
        want = _expected(b, 8, b.config_path)
        wait_for(lambda: _mine(zk, 8) == want, timeout_s=30, what="registered again")


def test_unreachable_zookeeper_fails_startup_clearly(tmp_path: Path) -> None:
    port = free_port()
    zk = {"zk.zkConnect": f"127.0.0.1:{port}", "zk.zkConnectionTimeoutMs": 1000}
    with pytest.raises(RuntimeError) as err:
        _start(tmp_path, "unused", 9, zk=zk)
    assert f"cannot connect to ZooKeeper at 127.0.0.1:{port} (zk.zkConnect) within 1 s" in str(
        err.value
    )


def test_disabled_zookeeper_never_imports_kazoo(tmp_path: Path) -> None:
    ini = write_server_ini(tmp_path / "server.ini", data_path=tmp_path / "data")
    code = (
        "import sys\n"
        "from pymetaq.server.broker import Broker\n"
        "from pymetaq.server.config import load_config\n"
        f"b = Broker(load_config({str(ini)!r}).with_system(server_port=0)).start()\n"
        "b.stop()\n"
        "assert b.registry is None\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kazoo'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_restart_after_clean_stop_registers_again(tmp_path: Path, zk_hosts: str, zk: Any) -> None:
    b = _start(tmp_path, zk_hosts, 10)
    with b:
        wait_for(lambda: zk.exists("/meta/brokers/ids/10/master"), what="registered")
        assert b.terminate() == 0
        t0 = time.monotonic()
        b.launch()
        want = _expected(b, 10, b.config_path)
        wait_for(lambda: _mine(zk, 10) == want, what="registered again")
        assert time.monotonic() - t0 < 20


def test_crash_restart_on_the_same_port_starts_at_once(
    tmp_path: Path, zk_hosts: str, zk: Any
) -> None:
    port = free_port()
    b = _start(
        tmp_path, zk_hosts, 11, system={"serverPort": port}, zk={"zk.zkSessionTimeoutMs": 6000}
    )
    with b:
        wait_for(lambda: zk.exists("/meta/brokers/ids/11/master"), what="registered")
        old = zk.exists("/meta/brokers/ids/11/master").ephemeralOwner
        b.kill()
        b.launch()  # listening while the dead session still holds every node
        assert b.port == port
        with Wire(b.address) as w:
            assert _code(w.call(put_line("orders", 0, b"x", 1))) == 200
        want = _expected(b, 11, b.config_path)
        wait_for(
            lambda: (
                _mine(zk, 11) == want
                and zk.exists("/meta/brokers/ids/11/master").ephemeralOwner != old
            ),
            timeout_s=30,
            what="registered by the new run once the old session expired",
        )
        assert "a previous run of this broker?" in b.log_text()


def _registered(zk: Any, broker_id: int, want: dict[str, bytes]) -> bool:
    return bool(_mine(zk, broker_id) == want)


def _code(reply: ResultReply | ValueReply) -> int:
    assert isinstance(reply, ResultReply), reply
    return reply.code
