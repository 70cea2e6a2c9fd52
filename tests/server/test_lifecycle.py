"""Process lifecycle: clean stop, config errors, SIGHUP reload, the in-process Broker, the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.server.broker import Broker
from pymetaq.server.config import parse_config
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import iter_records
from tests._broker import BrokerProcess, write_server_ini
from tests._helpers import free_port
from tests.server._helpers import Wire, put_line, wait_for

pytestmark = pytest.mark.integration

CLEAN_MARKER = ".clean_shutdown"


def put(w: Wire, topic: str, data: bytes, opaque: int, partition: int = 0) -> ResultReply:
    reply = w.call(put_line(topic, partition, data, opaque, checksum(data)))
    assert isinstance(reply, ResultReply)
    return reply


def test_sigterm_finishes_in_flight_puts_writes_the_marker_and_exits_0(tmp_path: Path) -> None:
    broker = BrokerProcess.start(tmp_path)
    with broker:
        w = Wire(broker.address)
        frames = b"".join(put_line("test", 0, b"m%04d" % i, i, -1) for i in range(300))
        w.send(frames)
        first = w.reply()
        assert isinstance(first, ResultReply) and first.code == 200
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGTERM)
        acked = {first.opaque}
        try:
            while True:
                reply = w.reply()
                assert isinstance(reply, ResultReply) and reply.code == 200, reply
                acked.add(reply.opaque)
        except (ConnectionError, OSError):
            pass
        w.close()
        assert broker.proc.wait(60) == 0, broker.log_text()
        assert (broker.data_path / CLEAN_MARKER).exists()
        assert "stopped: storage closed cleanly" in broker.log_text()
        broker.launch()
        with Wire(broker.address) as r:
            got = r.call(b"get test g 0 0 1048576 1\r\n")
            assert isinstance(got, ValueReply)
            stored = {int(rec.data[1:]) for rec in iter_records(got.data)}
        assert acked <= stored  # every acknowledged put survived the stop


def test_config_error_exits_nonzero_with_did_you_mean(tmp_path: Path) -> None:
    ini = tmp_path / "server.ini"
    ini.write_text("[system]\nbrokerId=0\nunflushTreshold=0\n[topic=t]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "server", "-f", str(ini)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"pymetaq server: configuration error: {ini}:3: unknown key 'unflushTreshold' in section "
        "[system]; did you mean 'unflushThreshold'?"
    )


def test_missing_config_file_exits_nonzero(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "server", "-f", str(tmp_path / "no.ini")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "cannot read config file" in proc.stderr


def test_sighup_reloads_topic_sections(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics={"old": {}}) as broker:
        with Wire(broker.address) as w:
            assert put(w, "new", b"x", 1).code == 500
            assert put(w, "old", b"x", 10).code == 200  # its section is remembered now
            write_server_ini(
                broker.config_path,
                data_path=broker.data_path,
                topics={"old": {"acceptPublish": "false"}, "new": {"numPartitions": 2}},
            )
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "config reloaded" in broker.log_text(), what="reload")
            reply = put(w, "new", b"x", 2, partition=1)
            assert reply.code == 200, reply
            assert put(w, "old", b"x", 11).code == 403  # the reloaded section, not the old one
            # a broken file keeps the old configuration
            broker.config_path.write_text("[system]\nbogus=1\n")
            broker.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "config reload failed" in broker.log_text(), what="failed reload")
            assert put(w, "new", b"y", 3, partition=1).code == 200
        assert broker.terminate() == 0


def test_in_process_broker_context_manager(tmp_path: Path) -> None:
    config = parse_config(
        f"[system]\nserverPort=0\ndashboardHttpPort=0\ndataPath={tmp_path / 'd'}\nunflushThreshold=0\n"
        "[zookeeper]\nzk.zkEnable=false\n[topic=t]\n",
    )
    with Broker(config) as broker:
        assert broker.port > 0 and broker.address == ("127.0.0.1", broker.port)
        with Wire(broker.address) as w:
            assert put(w, "t", b"inproc", 1).code == 200
            got = w.call(b"get t g 0 0 1000 2\r\n")
            assert isinstance(got, ValueReply)
            assert [r.data for r in iter_records(got.data)] == [b"inproc"]
    assert (tmp_path / "d" / CLEAN_MARKER).exists()
    with Broker(config) as again, Wire(again.address) as w:  # the same data reopens
        got = w.call(b"get t g 0 0 1000 3\r\n")
        assert isinstance(got, ValueReply)


def test_stats_command_line(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics={"t": {}}) as broker:
        with Wire(broker.address) as w:
            assert put(w, "t", b"abc", 1).code == 200
        server = f"{broker.host}:{broker.port}"
        cmd = [sys.executable, "-m", "pymetaq.server.cli", "stats"]
        general = subprocess.run(
            [*cmd, "--server", server], capture_output=True, text=True, timeout=60
        )
        assert general.returncode == 0
        lines = general.stdout.splitlines()
        assert lines[0] == f"pid {broker.proc.pid}"  # type: ignore[union-attr]
        assert "cmd_put 1" in lines and "total_messages 1" in lines
        topics = subprocess.run(
            [*cmd, "topics", "--server", server], capture_output=True, text=True, timeout=60
        )
        assert topics.stdout.splitlines() == [
            "t partitions 1 message_count 1 message_bytes 23 accept_publish true "
            "accept_subscribe true"
        ]
        down = subprocess.run(
            [*cmd, "--server", "127.0.0.1:1"], capture_output=True, text=True, timeout=60
        )
        assert down.returncode == 1 and "127.0.0.1:1" in down.stderr


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "pymetaq"
    assert script.exists() and os.access(script, os.X_OK)
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "server" in proc.stdout and "stats" in proc.stdout


def test_shipped_config_runs_standalone_with_data_under_the_working_directory(
    tmp_path: Path,
) -> None:
    text = (Path(__file__).resolve().parents[2] / "conf" / "server.ini").read_text()
    text = text.replace("serverPort=8123", "serverPort=0")
    http_port = free_port()
    text = text.replace("dashboardHttpPort=8120", f"dashboardHttpPort={http_port}")
    with BrokerProcess.start(tmp_path, ini_text=text) as broker:
        assert broker.http_url == f"http://127.0.0.1:{http_port}/"  # loopback by default
        with urllib.request.urlopen(broker.http_url + "metrics", timeout=30) as reply:
            assert b"pymetaq_build_info" in reply.read()
        assert f"(data: {broker.cwd / 'data'})" in broker.log_text()
        with Wire(broker.address) as w:
            assert put(w, "log-app", b"hello", 1, partition=1).code == 200
            assert put(w, "test", b"hello", 2, partition=3).code == 200
        assert broker.terminate() == 0
    assert (tmp_path / "broker" / "data" / "log-app-1").is_dir()
