"""The packaged standalone configuration: conf/server.ini is the same file, ``pymetaq config
--print`` writes it, ``pymetaq server`` without -f runs it (data in ./data), and the broker's
log says what happened in readable lines (no dataclass reprs, no recovery line for a partition
that was just created)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pymetaq.server import default_config
from pymetaq.server.cli import main
from pymetaq.server.config import parse_config
from tests._helpers import wait_for

pytestmark = pytest.mark.integration  # one test runs broker processes

ROOT = Path(__file__).resolve().parents[2]


def test_conf_server_ini_is_the_packaged_default() -> None:
    assert (ROOT / "conf" / "server.ini").read_bytes() == (
        ROOT / "server" / "default.ini"
    ).read_bytes(), "conf/server.ini and server/default.ini differ: cp server/default.ini conf/"
    assert default_config.default_text() == (ROOT / "conf" / "server.ini").read_text("utf-8")


def test_the_default_is_standalone_on_8123_with_data_in_dot_data(tmp_path: Path) -> None:
    config = parse_config(default_config.default_text(), cwd=str(tmp_path))
    assert config.system.server_port == 8123
    assert config.system.data_path == str(tmp_path / "data")
    assert not config.zookeeper.enabled
    assert default_config.load(None).path == default_config.DEFAULT_PATH
    assert default_config.file_option(default_config.load(None)) == ""


def test_config_print_writes_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--print"]) == 0
    assert capsys.readouterr().out == default_config.default_text()


class _Server:
    """``pymetaq server --port 0`` (no -f) in ``cwd``, its log collected."""

    def __init__(self, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pymetaq.server.cli", "server", "--port", "0"],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(
            target=lambda: self.lines.extend(self.proc.stdout or []), daemon=True
        )
        self.reader.start()
        found = wait_for(
            lambda: re.search(r"listening on 127\.0\.0\.1:(\d+)", self.log()), 60, "listening"
        )
        assert found is not None
        self.port = int(found.group(1))

    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        self.reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code


def test_server_without_f_runs_the_default_and_logs_readable_lines(tmp_path: Path) -> None:
    first = _Server(tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", first.port), timeout=30) as s:
            s.sendall(b"put test 0 5 0 -1 1\r\nhello")
            assert s.recv(100).startswith(b"result 200 ")
    finally:
        assert first.stop() == 0
    log = first.log()
    assert "no -f: running the packaged standalone configuration" in log
    assert f"(data: {tmp_path / 'data'})" in log
    assert (tmp_path / "data" / "test-0").is_dir()
    assert "recovered" not in log and "RecoveryReport" not in log  # test-0 was just created
    second = _Server(tmp_path)
    assert second.stop() == 0
    lines = second.log().splitlines()
    assert any(
        line.endswith("INFO pymetaq.storage.manager: test-0: recovered 1 segment(s), offsets "
                      "0..25 (clean shutdown, not scanned)")
        for line in lines
    ), lines  # fmt: skip
    assert "RecoveryReport(" not in second.log()
