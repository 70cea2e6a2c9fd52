"""A user's mistake at the ``pymetaq`` command line is one line and a hint, never a
traceback: ``pymetaq <command>: <message>``, exit code 2 for a usage error and 1 for a runtime
one. One test per case, each asserting the message and the exit code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._broker import BrokerProcess, write_server_ini
from tests.client._helpers import free_port, produce, server

pytestmark = pytest.mark.integration

NO_BROKER_HINT = (
    "hint: is a broker running there? `pymetaq server` starts one on meta://127.0.0.1:8123; "
    "name others with --servers or $PYMETAQ_SERVERS"
)
TOPICS_HINT = (
    "hint: `pymetaq topics` lists the topics the brokers serve; a new topic needs a "
    "[topic=NAME] section in the broker's server.ini"
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    topics = {"test": {"numPartitions": 4}, "one": {}}
    with BrokerProcess.start(tmp_path_factory.mktemp("errs"), topics=topics) as b:
        produce(b, "one", 0, [b"hello", b"world"])
        yield b


def cli(
    *args: str, cwd: Path, stdin: str = "", env: dict[str, str] | None = None, pre: str = ""
) -> subprocess.CompletedProcess[str]:
    """``pymetaq *args``; ``pre``: Python run first in the same process (to hide a module)."""
    code = f"{pre}\nimport sys\nfrom pymetaq.server.cli import main\nsys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(cwd), **(env or {})},
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def test_unknown_topic(broker: BrokerProcess, tmp_path: Path) -> None:
    r = cli("produce", "--servers", server(broker), "--topic", "nope", cwd=tmp_path, stdin="x\n")
    assert (r.returncode, r.stderr) == (
        1,
        f"pymetaq produce: no broker serves topic 'nope'\n{TOPICS_HINT}\n",
    )
    r = cli("consume", "--servers", server(broker), "--topic", "nope", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        1,
        f"pymetaq consume: no broker serves topic 'nope'\n{TOPICS_HINT}\n",
    )


def test_invalid_topic_name(broker: BrokerProcess, tmp_path: Path) -> None:
    r = cli("consume", "--servers", server(broker), "--topic", "a/b", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("pymetaq consume: invalid topic name 'a/b': '/' is not allowed")


def test_broker_down(tmp_path: Path) -> None:
    port = free_port()
    r = cli("consume", "--servers", f"meta://127.0.0.1:{port}", "--topic", "t", cwd=tmp_path)
    assert r.returncode == 1
    first, hint = r.stderr.splitlines()
    assert first.startswith(
        f"pymetaq consume: no broker reachable: cannot connect to 127.0.0.1:{port}"
    )
    assert hint == NO_BROKER_HINT
    r = cli("stats", "--servers", f"meta://127.0.0.1:{port}", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith(f"pymetaq stats: cannot get stats from meta://127.0.0.1:{port}: ")


def test_corrupt_offset_store(tmp_path: Path) -> None:
    (tmp_path / "o.json").write_text("{not json")
    r = cli("offsets", "show", "--group", "g", "--store", "file:o.json", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "pymetaq offsets show: the offset store cannot be read: o.json: Expecting property name "
        "enclosed in double quotes: line 1 column 2 (char 1)",
        "hint: fix it, or move it aside to start over (groups then start at their initial "
        "position; `pymetaq offsets reset` sets positions)",
    ]


def test_corrupt_default_offset_store_for_consume(broker: BrokerProcess, tmp_path: Path) -> None:
    (tmp_path / ".pymetaq_offsets").write_text('{"g": [{"topic": "one"}]}')  # HOME=tmp_path
    r = cli("consume", "--servers", server(broker), "--topic", "one", "--group", "g", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith(
        f"pymetaq consume: the offset store cannot be read: {tmp_path / '.pymetaq_offsets'}: "
    )


def test_unreadable_offset_store(tmp_path: Path) -> None:
    (tmp_path / "o.json").mkdir()  # not a file: cannot be read, whoever runs the test
    r = cli("offsets", "show", "--group", "g", "--store", "file:o.json", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr == (
        "pymetaq offsets show: the offset store cannot be used: o.json: "
        "[Errno 21] Is a directory: 'o.json'\n"
    )


def test_bad_store_url(tmp_path: Path) -> None:
    for spec in ("bogus:x", "mysql://db/x"):
        r = cli("offsets", "show", "--group", "g", "--store", spec, cwd=tmp_path)
        assert r.returncode == 2
        assert r.stderr.splitlines() == [
            f"pymetaq offsets show: bad offset store {spec!r}: unknown offset store {spec!r} "
            "(file:, sqlite:, postgresql+psycopg:, zk://)",
            "hint: file:PATH | sqlite:PATH | SQLAlchemy URL | zk://... "
            "(default: file:~/.pymetaq_offsets)",
        ]


def test_missing_optional_extra(tmp_path: Path) -> None:
    hide = "import sys; sys.modules['sqlalchemy'] = None  # as if the sql extra were absent"
    r = cli("offsets", "show", "--group", "g", "--store", "sqlite:o.db", cwd=tmp_path, pre=hide)
    assert (r.returncode, r.stderr) == (
        1,
        "pymetaq offsets show: SqlOffsetStore needs SQLAlchemy, which is not installed: "
        "pip install 'pymetaq[sql]'\n",
    )
    hide = "import sys; sys.modules['kazoo'] = None; sys.modules['kazoo.client'] = None"
    r = cli("offsets", "show", "--group", "g", "--store", "zk://h:1", cwd=tmp_path, pre=hide)
    assert (r.returncode, r.stderr) == (
        1,
        "pymetaq offsets show: ZkOffsetStore needs kazoo, which is not installed: "
        "pip install 'pymetaq[zk]'\n",
    )


def test_missing_file(broker: BrokerProcess, tmp_path: Path) -> None:
    r = cli(
        "produce", "--servers", server(broker), "--topic", "test", "--file", "nope.txt",
        cwd=tmp_path,
    )  # fmt: skip
    assert (r.returncode, r.stderr) == (
        2,
        "pymetaq produce: cannot read --file 'nope.txt': No such file or directory\n",
    )


def test_bad_partition(broker: BrokerProcess, tmp_path: Path) -> None:
    s = server(broker)
    r = cli("produce", "--servers", s, "--topic", "test", "--partition", "x", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        2,
        "pymetaq produce: bad --partition 'x': a partition number or <brokerId>-<partition> "
        "(e.g. 0-1)\n",
    )
    r = cli("produce", "--servers", s, "--topic", "test", "--partition", "0-9", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        2,
        "pymetaq produce: bad --partition '0-9': test has 4 partition(s): 0-0, 0-1, 0-2, 0-3 "
        "(or an index 0..3)\n",
    )
    r = cli("consume", "--servers", s, "--topic", "test", "--partition", "7", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        2,
        "pymetaq consume: --partition '7' matches 0 of test's partitions (0-0, 0-1, 0-2, 0-3)\n",
    )


def test_bad_group_name(broker: BrokerProcess, tmp_path: Path) -> None:
    r = cli(
        "consume", "--servers", server(broker), "--topic", "one", "--group", "a b", cwd=tmp_path
    )
    assert r.returncode == 2
    assert r.stderr.startswith("pymetaq consume: invalid group: group name 'a b' contains ' '")
    r = cli("offsets", "show", "--group", "x:y", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("pymetaq offsets show: invalid group: group name 'x:y' contains")


def test_from_offset_not_a_record_boundary(broker: BrokerProcess, tmp_path: Path) -> None:
    s = server(broker)
    r = cli("consume", "--servers", s, "--topic", "one", "--from", "7", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        2,
        "pymetaq consume: --from 7: offset 7 of one/0-0 is not where a message starts "
        "(offsets are byte positions: use a message's offset or next_offset, e.g. from "
        "`pymetaq consume --format json`)\n",
    )
    r = cli("consume", "--servers", s, "--topic", "one", "--from", "999", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        2,
        "pymetaq consume: --from 999: offset 999 is outside one/0-0's offsets 0..50\n",
    )
    r = cli(
        "consume", "--servers", s, "--topic", "one", "--from", "25", "--count", "1", cwd=tmp_path
    )
    assert (r.returncode, r.stdout) == (0, "world\n")


def test_bad_servers(tmp_path: Path) -> None:
    r = cli("consume", "--servers", "http://x", "--topic", "t", cwd=tmp_path)
    assert r.stderr.splitlines() == [
        "pymetaq consume: bad --servers 'http://x': bad server 'http://x': expected "
        "meta://host:port",
        "hint: meta://host:port[,meta://host:port...] or zk://host:port[,...][/root]",
    ]
    assert r.returncode == 2
    r = cli("topics", cwd=tmp_path, env={"PYMETAQ_SERVERS": "meta://h:99999"})
    assert r.returncode == 2
    assert r.stderr.startswith(
        "pymetaq topics: bad PYMETAQ_SERVERS 'meta://h:99999': bad server 'meta://h:99999': "
        "port 99999 out of range"
    )
    # zk://: the brokers registered there (tests/cluster/test_zk_faces.py); none reachable
    port = free_port()
    r = cli("stats", "--servers", f"zk://127.0.0.1:{port}", "--timeout", "1", cwd=tmp_path)
    assert (r.returncode, r.stderr.splitlines()[0]) == (
        1,
        f"pymetaq stats: cannot connect to ZooKeeper at 127.0.0.1:{port} within 1 s: "
        "Connection time-out",
    )


def test_port_in_use(broker: BrokerProcess, tmp_path: Path) -> None:
    ini = write_server_ini(
        tmp_path / "s.ini", data_path=tmp_path / "d", system={"serverPort": broker.port}
    )
    r = cli("server", "-f", str(ini), cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        f"pymetaq server: cannot listen on 127.0.0.1:{broker.port}: Address already in use "
        "(check hostName and serverPort)"
    )


def test_bad_host_name(tmp_path: Path) -> None:
    ini = write_server_ini(
        tmp_path / "s.ini", data_path=tmp_path / "d", system={"hostName": "no-such-host.invalid"}
    )
    r = cli("server", "-f", str(ini), cwd=tmp_path)
    assert r.returncode == 2
    assert re.fullmatch(
        f"pymetaq server: configuration error: {re.escape(str(ini))}:\\d+: bad value for "
        "'hostName' in section \\[system\\]: 'no-such-host.invalid' must be empty, an IP address "
        "or a host name \\(it does not resolve .*\\)\n",
        r.stderr,
    ), r.stderr


def test_usage_errors_are_argparse_style_with_exit_2(tmp_path: Path) -> None:
    r = cli("consume", cwd=tmp_path)
    assert r.returncode == 2 and "error: the following arguments are required: --topic" in r.stderr
    r = cli("consume", "--topic", "t", "--count", "-1", cwd=tmp_path)
    assert r.returncode == 2 and "argument --count: must be >= 0, not -1" in r.stderr
