"""``pymetaq consume`` and ``pymetaq offsets`` as a user runs them, against a real broker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.offsets import FileOffsetStore, OffsetEntry
from tests._broker import BrokerProcess
from tests.client._helpers import produce, server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    topics = {"cli": {"numPartitions": 1}, "cli2": {"numPartitions": 2}, "sig": {}}
    with BrokerProcess.start(tmp_path_factory.mktemp("clibroker"), topics=topics) as b:
        yield b


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_consume_json_count_and_group_commit(broker: BrokerProcess, tmp_path: Path) -> None:
    offsets = produce(broker, "cli", 0, [b"hello", b"line\nbreak", b"\xff\xfe", b"four"])
    assert offsets == [0]
    store = tmp_path / "o.json"
    r = cli(
        "consume",
        "--server",
        server(broker),
        "--topic",
        "cli",
        "--from",
        "earliest",
        "--count",
        "3",
        "--format",
        "json",
        "--group",
        "cg",
        "--offset-store",
        f"file:{store}",
    )
    assert r.returncode == 0, r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(d["offset"], d["next_offset"], d["partition"]) for d in docs] == [
        (0, 25, "0-0"),
        (25, 55, "0-0"),
        (55, 77, "0-0"),
    ]
    assert docs[0]["value"] == "hello" and docs[1]["value"] == "line\nbreak"
    assert docs[2]["value_b64"] == "//4=" and "value" not in docs[2]
    assert docs[0]["id"] < docs[1]["id"] < docs[2]["id"] and docs[0]["attribute"] is None
    # exactly the 3 printed messages count as consumed: the group resumes at the 4th
    entry = FileOffsetStore(store).load("cg", "cli", "0-0")
    assert entry == OffsetEntry("cli", "0-0", 77, docs[2]["id"])
    r = cli(
        "consume",
        "--server",
        server(broker),
        "--topic",
        "cli",
        "--group",
        "cg",
        "--offset-store",
        f"file:{store}",
        "--count",
        "1",
    )
    assert r.returncode == 0 and r.stdout == "four\n", r.stderr
    # text format, one partition, from an explicit offset; newlines escaped
    r = cli(
        "consume",
        "--server",
        server(broker),
        "--topic",
        "cli",
        "--from",
        "25",
        "--partition",
        "0-0",
        "--count",
        "1",
    )
    assert r.stdout == "line\\nbreak\n", r.stderr


def test_offsets_show_and_reset(broker: BrokerProcess, tmp_path: Path) -> None:
    produce(broker, "cli2", 0, [b"a" * 10] * 3)
    produce(broker, "cli2", 1, [b"b" * 10] * 5)
    spec = f"sqlite:{tmp_path / 'off.db'}"
    r = cli(
        "consume",
        "--server",
        server(broker),
        "--topic",
        "cli2",
        "--group",
        "og",
        "--offset-store",
        spec,
        "--from",
        "earliest",
        "--count",
        "8",
    )
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 8, r.stderr
    r = cli("offsets", "show", "--store", spec, "--group", "og")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0] == ["topic", "partition", "offset", "msg_id"]
    assert [row[:3] for row in rows[1:]] == [["cli2", "0-0", "90"], ["cli2", "0-1", "150"]]
    r = cli("offsets", "show", "--store", spec, "--group", "og", "--server", server(broker))
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0][-3:] == ["first", "end", "lag"] and rows[1][-1] == "0" and rows[2][-1] == "0"

    r = cli(
        "offsets",
        "reset",
        "--store",
        spec,
        "--group",
        "og",
        "--topic",
        "cli2",
        "--to",
        "earliest",
        "--server",
        server(broker),
        "--dry-run",
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split() for line in lines[:3]] == [
        ["topic", "partition", "old", "new"],
        ["cli2", "0-0", "90", "0"],
        ["cli2", "0-1", "150", "0"],
    ]
    assert "dry run" in lines[-1]
    r = cli("offsets", "show", "--store", spec, "--group", "og")
    assert [line.split()[2] for line in r.stdout.splitlines()[1:]] == ["90", "150"]  # unchanged

    r = cli(
        "offsets", "reset", "--store", spec, "--group", "og", "--partition", "0-1", "--to", "30",
        "--servers", server(broker), "--execute",
    )  # fmt: skip
    assert r.returncode == 0 and "reset 1 offset" in r.stdout, r.stderr
    r = cli(
        "consume",
        "--server",
        server(broker),
        "--topic",
        "cli2",
        "--group",
        "og",
        "--offset-store",
        spec,
        "--count",
        "4",
        "--partition",
        "0-1",
    )
    assert r.stdout.splitlines() == ["b" * 10] * 4  # resumed at offset 30: messages 2..5


def test_consume_ctrl_c_exits_cleanly(broker: BrokerProcess, tmp_path: Path) -> None:
    produce(broker, "sig", 0, [b"s1", b"s2"])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pymetaq.server.cli",
            "consume",
            "--server",
            server(broker),
            "--topic",
            "sig",
            "--from",
            "earliest",
            "--group",
            "sg",
            "--offset-store",
            f"file:{tmp_path / 'o.json'}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = [proc.stdout.readline(), proc.stdout.readline()]
    assert first == ["s1\n", "s2\n"]
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    entry = FileOffsetStore(tmp_path / "o.json").load("sg", "sig", "0-0")
    assert entry is not None and entry.offset == 2 * 22
