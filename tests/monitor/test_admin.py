"""``pymetaq admin`` against a real broker: close and open partitions (puts answer 403 with
MetaQ's text, gets go on), reload the config, slave status, clear refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, put_line

pytestmark = pytest.mark.integration


def admin(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "pymetaq.server.cli",
        "admin",
        "--server",
        f"127.0.0.1:{broker.port}",
    ]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60)


def put(w: Wire, partition: int, opaque: int) -> ResultReply:
    reply = w.call(put_line("ops", partition, b"payload", opaque))
    assert isinstance(reply, ResultReply)
    return reply


def test_close_and_open_partitions(tmp_path: Path) -> None:
    with (
        BrokerProcess.start(tmp_path, topics={"ops": {"numPartitions": 4}}) as broker,
        Wire(broker.address) as w,
    ):
        assert put(w, 1, 1).code == 200
        done = admin(broker, "close", "ops", "1-2")
        assert (done.returncode, done.stdout) == (0, "closed ops partition(s) 1..2\n"), done.stderr
        refused = put(w, 1, 2)
        assert refused.code == 403
        assert refused.body.decode() == (
            f"Put message to [broker 'meta://127.0.0.1:{broker.port}'] [partition 'ops-1'] "
            "failed.Detail:partition[0-1] has been closed"
        )
        assert put(w, 0, 3).code == 200 and put(w, 3, 4).code == 200
        # partition -1: the broker picks among the open ones only
        chosen = {int(put(w, -1, 10 + i).body.split()[1]) for i in range(40)}
        assert chosen <= {0, 3}
        # consumers still drain a closed partition
        got = w.call(b"get ops g 1 0 1024 60\r\n")
        assert isinstance(got, ValueReply) and len(got.data) == 27
        assert admin(broker, "closed").stdout == "ops 1,2\n"
        assert admin(broker, "open", "ops", "2").stdout == "opened ops partition(s) 2\n"
        assert put(w, 2, 70).code == 200 and put(w, 1, 71).code == 403
        assert admin(broker, "open", "ops").stdout == "opened ops partition(s) 1\n"
        assert admin(broker, "closed").stdout == "no closed partitions\n"
        assert put(w, 1, 72).code == 200
        stats = w.call(b"stats  73\r\n")
        assert isinstance(stats, ResultReply) and b"\r\nput_failed 2\r\n" in stats.body


def test_refusals_are_clear(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics={"ops": {"numPartitions": 4}}) as broker:
        unknown = admin(broker, "close", "nosuch", "0")
        assert unknown.returncode == 1
        assert unknown.stderr == (
            "pymetaq admin: refused (404): The topic `nosuch` is not in topics list of the broker\n"
        )
        beyond = admin(broker, "close", "ops", "2-9")
        assert beyond.returncode == 1
        assert "bad partition range 2..9 for `ops`: it has partitions 0..3" in beyond.stderr
        usage = admin(broker, "close", "ops", "x")
        assert (
            usage.returncode == 2 and "'x' is not a partition (3) or a range (0-3)" in usage.stderr
        )
        assert "Traceback" not in usage.stderr + beyond.stderr + unknown.stderr
        with Wire(broker.address) as w:
            reply = w.call(b"admin frobnicate 5\r\n")
            assert isinstance(reply, ResultReply) and reply.code == 400
            assert reply.body.startswith(b"unknown admin action 'frobnicate'")
    down = admin(broker, "slaves")  # the broker has stopped
    assert down.returncode == 1 and "(is the broker running?)" in down.stderr


def test_reload_and_slave_status(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics={"ops": {}}) as broker, Wire(broker.address) as w:
        slaves = admin(broker, "slaves")
        assert slaves.returncode == 0 and slaves.stdout.startswith("no slaves")
        assert w.call(put_line("later", 0, b"x", 1)).code == 500  # type: ignore[union-attr]
        text = broker.config_path.read_text()
        broker.config_path.write_text(text + "\n[topic=later]\n")
        done = admin(broker, "reload")
        assert done.returncode == 0 and done.stdout.startswith(
            "config reloaded: 2 topic section(s)"
        )
        assert w.call(put_line("later", 0, b"x", 2)).code == 200  # type: ignore[union-attr]
        broker.config_path.write_text(text + "\n[topic=later]\nnumPartitions=zero\n")
        bad = admin(broker, "reload")
        assert bad.returncode == 1
        assert "config reload failed, keeping the old configuration" in bad.stderr
        assert "numPartitions" in bad.stderr
        assert w.call(put_line("later", 0, b"x", 3)).code == 200  # type: ignore[union-attr]


def test_the_broker_comes_from_pymetaq_servers_as_for_the_other_commands(tmp_path: Path) -> None:
    """No --server: $PYMETAQ_SERVERS names the broker (README: every command finds it there)."""
    cmd = [sys.executable, "-m", "pymetaq.server.cli", "admin", "slaves"]
    with BrokerProcess.start(tmp_path) as broker:
        env = {**os.environ, "PYMETAQ_SERVERS": f"meta://127.0.0.1:{broker.port}"}
        found = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        assert found.returncode == 0 and found.stdout.startswith("no slaves"), found.stderr
    env["PYMETAQ_SERVERS"] = f"meta://127.0.0.1:{broker.port}"  # stopped now
    gone = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert gone.returncode == 1
    assert f"127.0.0.1:{broker.port}: Connection refused" in gone.stderr
