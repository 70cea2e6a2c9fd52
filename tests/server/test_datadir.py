"""The data directory at start: one broker per directory, a usable directory, a valid config.

Before the fix a second ``pymetaq server`` on the same ``dataPath`` started, trimmed the first
one's segments and wrote the clean-shutdown marker on exit; a read-only directory failed
later, with a traceback; a bad ``deleteWhen`` started and retention silently never ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply
from pymetaq.server.broker import Broker
from pymetaq.server.config import parse_config
from pymetaq.server.errors import ConfigError, StartupError
from pymetaq.storage.checksum import checksum
from tests._broker import BrokerProcess, write_server_ini
from tests.server._helpers import Wire, put_line
from tests.server._mounts import tmpfs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run_server(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``pymetaq server`` that is expected to exit at once."""
    return subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "server", "-f", str(config)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_broker_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics={"t": {}}) as first:
        assert first.proc is not None
        with Wire(first.address) as w:
            reply = w.call(put_line("t", 0, b"one", 1, checksum(b"one")))
            assert isinstance(reply, ResultReply) and reply.code == 200
        second = tmp_path / "second.ini"
        write_server_ini(second, data_path=first.data_path, topics={"t": {}})
        proc = run_server(second, tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert f"is in use by another pymetaq process (pid {first.proc.pid})" in proc.stderr
        assert "Traceback" not in proc.stderr
        with Wire(first.address) as w:  # the first one is untouched and still serving
            reply = w.call(put_line("t", 0, b"two", 2, checksum(b"two")))
            assert isinstance(reply, ResultReply) and reply.code == 200
            assert reply.body.split()[2] == b"23"  # right after the first record
        assert (first.data_path / ".lock").read_text().strip() == str(first.proc.pid)
    # after a clean stop the directory is free again
    with BrokerProcess(second, tmp_path) as again:
        again.launch()
        assert again.terminate() == 0


def test_an_in_process_broker_gets_a_startup_error(tmp_path: Path) -> None:
    text = f"[system]\nserverPort=0\ndashboardHttpPort=0\ndataPath={tmp_path}\n[zookeeper]\nzk.zkEnable=false\n[topic=t]\n"
    with Broker(parse_config(text, cwd=str(tmp_path))):
        second = Broker(parse_config(text, cwd=str(tmp_path)))
        with pytest.raises(StartupError, match="in use by another pymetaq process"):
            second.start()


@pytest.fixture
def readonly_dir(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as mnt:
        yield mnt


def test_a_read_only_data_directory_is_refused_at_start(tmp_path: Path, readonly_dir: Path) -> None:
    ini = write_server_ini(tmp_path / "server.ini", data_path=readonly_dir, topics={"t": {}})
    proc = run_server(ini, tmp_path)
    assert proc.returncode == 1
    assert f"data directory {readonly_dir} is not writable (Read-only file system)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_data_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_text("not a directory")
    ini = write_server_ini(tmp_path / "server.ini", data_path=data, topics={"t": {}})
    proc = run_server(ini, tmp_path)
    assert proc.returncode == 1 and "cannot be created" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_port_in_use_is_a_clear_startup_error(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, name="a") as first:
        ini = write_server_ini(
            tmp_path / "b.ini", data_path=tmp_path / "b", system={"serverPort": first.port}
        )
        proc = run_server(ini, tmp_path)
        assert proc.returncode == 1
        assert f"cannot listen on 127.0.0.1:{first.port}: Address already in use" in proc.stderr
        assert "Traceback" not in proc.stderr


CONFIG_ERRORS = [
    ("deleteWhen=0 0 25 * * ?", "'deleteWhen' in section [system]: '0 0 25 * * ?'"),
    ("deleteWhen=every day", "'deleteWhen' in section [system]"),
    ("deleteWhen=0 0 0 30 2 ?", "(it never fires)"),
    ("deleteWhen=0 0 6 L * ?", "bad cron value 'L'"),
    ("hostName=not a host", "'hostName' in section [system]: 'not a host'"),
    ("hostName=-bad-.example", "not an IP address or a host name"),
    ("hostName=no-such-host.invalid", "does not resolve"),
    ("minFreeDiskBytes=-1", "must be >= 0 bytes"),
]


@pytest.mark.parametrize(("line", "message"), CONFIG_ERRORS)
def test_bad_system_values_stop_the_start_with_the_line(
    tmp_path: Path, line: str, message: str
) -> None:
    text = f"[system]\nbrokerId=0\n{line}\n[zookeeper]\nzk.zkEnable=false\n[topic=t]\n"
    with pytest.raises(ConfigError, match=r"server\.ini:3: bad value") as info:
        parse_config(text, "server.ini", cwd=str(tmp_path))
    assert message in str(info.value)


def test_a_bad_topic_delete_when_names_the_topic_section(tmp_path: Path) -> None:
    text = "[system]\n[zookeeper]\nzk.zkEnable=false\n[topic=t]\ndeleteWhen=61 * * * * ?\n"
    with pytest.raises(
        ConfigError, match=r"x.ini:5: bad value for 'deleteWhen' in section \[topic=t\]"
    ):
        parse_config(text, "x.ini", cwd=str(tmp_path))


@pytest.mark.parametrize(
    "name", ["a/b", "..", ".", "log-/../../x", "a b", "*/..", "x" * 201, "é", "log-\\x"]
)
def test_bad_topic_section_names_are_refused(tmp_path: Path, name: str) -> None:
    text = f"[system]\n[zookeeper]\nzk.zkEnable=false\n[topic={name}]\n"
    with pytest.raises(ConfigError, match="bad topic name in"):
        parse_config(text, "x.ini", cwd=str(tmp_path))


def test_patterns_never_match_a_separator_or_dot_dot(tmp_path: Path) -> None:
    text = "[system]\n[zookeeper]\nzk.zkEnable=false\n[topic=log-*]\n[topic=*]\n"
    cfg = parse_config(text, cwd=str(tmp_path))
    for hostile in ("log-/../../outside", "log-x/../test", "..", ".", "a/b", "log-\x00"):
        assert cfg.topic_config(hostile) is None, hostile
    assert cfg.topic_config("log-a.b_c") is not None
    assert cfg.topic_config("anything") is not None


def test_valid_host_names_are_accepted(tmp_path: Path) -> None:
    for host in ("", "127.0.0.1", "::1", "localhost"):
        text = f"[system]\nhostName={host}\n[zookeeper]\nzk.zkEnable=false\n[topic=t]\n"
        assert parse_config(text, cwd=str(tmp_path)).system.host_name == host


def test_the_shipped_config_documents_the_new_key() -> None:
    text = (ROOT / "conf" / "server.ini").read_text()
    assert "minFreeDiskBytes=" in text


def test_lock_file_is_not_a_partition(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics={"t": {}}) as broker:
        # the lock file and the transaction journal (dataLogPath defaults to dataPath), no store
        assert sorted(os.listdir(broker.data_path)) == [".lock", "transactions"]
