"""``pymetaq top`` in a real terminal (tmux): it shows the truth, moves, and quits cleanly on q
and on Ctrl-C (exit code 0, the terminal restored)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pymetaq.client.cli.top import human_bytes
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.monitor._helpers import Ledger, Producer, RawGroup, fill

pytestmark = pytest.mark.integration


class Tmux:
    """One tmux server of the test's own (its own socket), killed at the end."""

    def __init__(self, name: str) -> None:
        if shutil.which("tmux") is None:
            raise AssertionError("tmux is missing: apt-get install tmux")
        self.base = ["tmux", "-L", name]

    def run(self, *args: str) -> str:
        out = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def start(self, session: str, argv: list[str]) -> None:
        # argv run directly, no shell (a shell would get Ctrl-C's SIGINT too); the pane stays
        # after the command ends, so its status and last words can be read
        self.run("new-session", "-d", "-s", session, "-x", "150", "-y", "40", "--", *argv)
        self.run("set-option", "-t", session, "remain-on-exit", "on")

    def screen(self, session: str) -> str:
        return self.run("capture-pane", "-p", "-t", session)

    def keys(self, session: str, *keys: str) -> None:
        self.run("send-keys", "-t", session, *keys)

    def exit_status(self, session: str) -> int | None:
        """The pane's command's exit status once it has ended, else None."""
        dead, status, signal = self.run(
            "display-message", "-p", "-t", session,
            "#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}",
        ).strip().split(":")  # fmt: skip
        if dead != "1":
            return None
        return int(status) if status else -int(signal or 0)  # killed by a signal: -signal

    def kill(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=30)


def test_top_shows_rates_and_lag_and_quits_cleanly(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    with BrokerProcess.start(tmp_path, topics={"lagt": {"numPartitions": 2}, "load": {}}) as broker:
        ledger = Ledger()
        fill(broker.address, ledger, "lagt", 2, 100, rng)
        slow = RawGroup(broker.address, "slow")
        slow.fetch("lagt", 0, 600)
        slow.fetch("lagt", 1, 900)
        lag = sum(ledger.end("lagt", p) - slow.last_get[("lagt", p)] for p in (0, 1))
        producer = Producer(broker.address, Ledger(), "load", 1, seed)
        producer.start()
        tmux = Tmux(f"pymetaq-top-{os.getpid()}")
        command = [
            sys.executable,
            "-m",
            "pymetaq.server.cli",
            "top",
            "--server",
            f"127.0.0.1:{broker.port}",
        ]
        try:
            tmux.start("q", command)
            expected = f"slow lagt 2 {human_bytes(lag)}"
            wait_for(
                lambda: expected in " ".join(tmux.screen("q").split()),
                30,
                f"top showing {expected!r}",
            )
            screen = tmux.screen("q")
            assert f"pymetaq top - broker 0 at 127.0.0.1:{broker.port}" in screen

            def load_rate() -> float:
                line = next(x for x in tmux.screen("q").splitlines() if x.startswith("load "))
                rate = line.split()[2]  # messages/s in; "-" until the second poll
                return 0.0 if rate == "-" else float(rate.replace(",", ""))

            wait_for(lambda: load_rate() > 0, 30, "a messages/s rate for the load topic")
            tmux.keys("q", "q")
            wait_for(lambda: tmux.exit_status("q") == 0, 30, "top to exit 0 on q")
            assert "pymetaq top - broker" not in tmux.screen("q")  # the terminal is restored

            tmux.start("c", command)
            wait_for(lambda: "slow" in tmux.screen("c"), 30, "top's second screen")
            tmux.keys("c", "C-c")
            wait_for(lambda: tmux.exit_status("c") == 0, 30, "top to exit 0 on Ctrl-C")
            assert "Traceback" not in tmux.screen("c") and "Traceback" not in tmux.screen("q")
        finally:
            tmux.kill()
            producer.stop()
            slow.close()


def test_top_once_prints_one_screen_and_fails_clearly(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "pymetaq.server.cli", "top", "--once", "--interval", "0.2"]
    with BrokerProcess.start(tmp_path) as broker:
        out = subprocess.run(
            [*cli, "--server", f"127.0.0.1:{broker.port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("pymetaq top - broker 0")
        assert "(no consumer group has fetched yet)" in out.stdout
    down = subprocess.run(
        [*cli, "--server", f"127.0.0.1:{broker.port}"], capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 1 and "Connection refused" in down.stderr
    assert "Traceback" not in down.stderr
