"""Start a real pymetaq broker as a subprocess for integration tests (and the benchmark).

```python
from tests._broker import BrokerProcess, write_server_ini

with BrokerProcess.start(tmp_path, topics={"test": {"numPartitions": 2}}) as broker:
    sock = socket.create_connection(broker.address)
```

``start`` writes a ``server.ini`` (``serverPort=0``, ``dataPath`` under ``tmp_path``, group commit
by default, ZooKeeper off) and runs ``python -m pymetaq.server.cli server -f <ini>``; it waits
for the ``listening on HOST:PORT`` log line (the broker picks a free port) and fails with the
broker's log if it does not appear.  The log is collected by a reader thread
(``broker.log_text()``).  ``kill()`` is SIGKILL (crash tests), ``terminate()`` SIGTERM
(clean stop, returns the exit code), ``restart()`` starts the same config again (new port).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from tests._helpers import require_integration, wait_for

_LISTEN = re.compile(r"listening on ([^\s:]+):(\d+)")
_HTTP = re.compile(r"dashboard and /metrics on (https?://\S+/)")
START_TIMEOUT_S = 60.0
#: ``python -c`` prologue: lower RLIMIT_NOFILE, then run the CLI module as ``-m`` would
_LIMITED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (%d, %d)); "
    "sys.argv = ['pymetaq'] + sys.argv[1:]; "
    "runpy.run_module('pymetaq.server.cli', run_name='__main__', alter_sys=True)"
)

DEFAULT_SYSTEM: dict[str, Any] = {
    "brokerId": 0,
    "serverPort": 0,
    "numPartitions": 1,
    "unflushThreshold": 0,
    "unflushInterval": 10000,
    "dashboardHttpPort": 0,  # off: tests that want it pass a free port
}


def write_server_ini(
    path: Path,
    *,
    data_path: Path,
    system: Mapping[str, Any] | None = None,
    topics: Mapping[str, Mapping[str, Any]] | None = None,
    zookeeper: Mapping[str, Any] | None = None,
) -> Path:
    """Write a server.ini: [system] (defaults above + ``system``), [zookeeper] (off unless
    ``zookeeper`` gives keys, e.g. ``{"zk.zkEnable": "true", "zk.zkConnect": hosts}``), topics."""
    sys_values = {**DEFAULT_SYSTEM, "dataPath": str(data_path), **(system or {})}
    lines = ["[system]", *(f"{k}={v}" for k, v in sys_values.items()), ""]
    zk_values = {"zk.zkEnable": "false", **(zookeeper or {})}
    lines += ["[zookeeper]", *(f"{k}={v}" for k, v in zk_values.items()), ""]
    for name, values in (topics if topics is not None else {"test": {}}).items():
        lines += [f"[topic={name}]", *(f"{k}={v}" for k, v in values.items()), ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


class BrokerProcess:
    """A broker subprocess; use :meth:`start`."""

    def __init__(
        self,
        config_path: Path,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        nofile: tuple[int, int] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.config_path = config_path
        #: more ``pymetaq server`` arguments (``-Fmetaslave=...``)
        self.extra_args = list(extra_args or [])
        self.cwd = cwd
        self.env = dict(env or {})
        #: (soft, hard) RLIMIT_NOFILE the broker process starts with (fd-exhaustion tests)
        self.nofile = nofile
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        tmp_path: Path,
        *,
        system: Mapping[str, Any] | None = None,
        topics: Mapping[str, Mapping[str, Any]] | None = None,
        ini_text: str | None = None,
        name: str = "broker",
        nofile: tuple[int, int] | None = None,
        zookeeper: Mapping[str, Any] | None = None,
        extra_args: list[str] | None = None,
    ) -> BrokerProcess:
        """Write a config under ``tmp_path/name`` and start a broker on it (``extra_args``:
        more ``pymetaq server`` arguments, e.g. ``-Fmetaslave=<file>``)."""
        base = tmp_path / name
        base.mkdir(parents=True, exist_ok=True)
        config = base / "server.ini"
        if ini_text is not None:
            config.write_text(ini_text, encoding="utf-8")
        else:
            write_server_ini(
                config, data_path=base / "data", system=system, topics=topics, zookeeper=zookeeper
            )
        broker = cls(config, base, nofile=nofile, extra_args=extra_args)
        broker.launch()
        return broker

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def http_url(self) -> str:
        """``http://host:port/`` of the dashboard and ``/metrics`` (``dashboardHttpPort``)."""
        match = _HTTP.search(self.log_text())
        if match is None:
            raise AssertionError(f"the broker logged no dashboard address:\n{self.log_text()}")
        return match.group(1)

    @property
    def data_path(self) -> Path:
        return self.cwd / "data"

    def launch(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the process and wait until it listens."""
        require_integration("a broker process")
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        if self.proc is not None:  # a restart: reap the previous process and its pipe
            if self.proc.poll() is None:
                self.kill()
            if self._reader is not None:
                self._reader.join(5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        with self._lock:
            self._lines = []
        args = ["server", "-f", str(self.config_path), *self.extra_args]
        argv = [sys.executable, "-m", "pymetaq.server.cli", *args]
        if self.nofile is not None:  # lower the limit in the child, then run the broker
            argv = [sys.executable, "-c", _LIMITED % self.nofile, *args]
        self.proc = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._reader = threading.Thread(target=self._read_log, args=(self.proc,), daemon=True)
        self._reader.start()
        proc = self.proc
        try:
            match = wait_for(
                lambda: _LISTEN.search(self.log_text()) or proc.poll() is not None,
                timeout,
                "the broker's 'listening on' line",
            )
        except AssertionError:
            self.kill()
            raise RuntimeError(
                f"broker did not listen within {timeout} s:\n{self.log_text()}"
            ) from None
        if not isinstance(match, re.Match):
            self._reader.join(5)
            if proc.stdout is not None:
                proc.stdout.close()
            raise RuntimeError(
                f"broker exited with {proc.returncode} before listening:\n" + self.log_text()
            )
        self.host, self.port = match.group(1), int(match.group(2))

    def _read_log(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            with self._lock:
                self._lines.append(raw.decode("utf-8", "replace"))

    def log_text(self) -> str:
        with self._lock:
            return "".join(self._lines)

    # -- stopping -----------------------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL (a process crash) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        if self._reader is not None:
            self._reader.join(5)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the broker process (SIGSTOP/SIGCONT/SIGHUP in tests)."""
        assert self.proc is not None
        self.proc.send_signal(sig)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code (the process is killed on timeout)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        if self._reader is not None:
            self._reader.join(5)
        return self.proc.returncode

    def restart(self) -> None:
        """Start the same configuration again (after kill/terminate)."""
        if self.proc is not None and self.proc.poll() is None:
            self.terminate()
        self.launch()

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate(30)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    # -- convenience ----------------------------------------------------------------------------
    def connect(self, timeout: float = 10.0) -> socket.socket:
        """A fresh TCP connection to the broker (blocking, with a timeout)."""
        return socket.create_connection(self.address, timeout=timeout)
