"""The CLI's conveniences against a real broker: SIGTERM commits exactly what was printed,
several topics and patterns, the hint of a consumer that waits at the end, ``--from-beginning``,
``offsets reset`` as kafka-consumer-groups (dry run by default, clamped or refused targets),
``topics``, ``stats`` with ``meta://`` servers, ``--json`` on the listings, and
``PYMETAQ_SERVERS``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.offsets import FileOffsetStore
from tests._broker import BrokerProcess
from tests.client._helpers import produce, server

pytestmark = pytest.mark.integration

#: 26-byte records: 20-byte header + "m00000"
N = 20_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    topics = {"big": {}, "rst": {"numPartitions": 2}, "log-*": {"numPartitions": 2}, "a": {}}
    with BrokerProcess.start(tmp_path_factory.mktemp("cmds"), topics=topics) as b:
        produce(b, "big", 0, [f"m{i:05d}".encode() for i in range(N)])
        # (not "reset": `stats reset` would reset the stats, as in MetaQ)
        produce(b, "rst", 0, [b"r0", b"r1", b"r2"])  # 22-byte records: 0, 22, 44 | 66
        produce(b, "log-app", 0, [b"app"])
        produce(b, "log-web", 1, [b"web"])
        produce(b, "a", 0, [b"in-a"])
        yield b


def env_for(b: BrokerProcess, home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "PYMETAQ_SERVERS": server(b)}


def cli(b: BrokerProcess, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", *args],
        cwd=home,
        env=env_for(b, home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_sigterm_commits_exactly_the_printed_messages(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pymetaq.server.cli", "consume", "--topic", "big", "--group", "t"],
        cwd=tmp_path,
        env=env_for(broker, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "m00000\n"  # it is printing; the pipe fills up behind us
    proc.send_signal(signal.SIGTERM)  # (systemd, docker stop, timeout)
    rest = proc.stdout.read()  # the same buffered reader: nothing read ahead is lost
    assert proc.wait(60) == 0
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert "Traceback" not in err
    printed = 1 + len(rest.splitlines())
    assert rest.splitlines() == [f"m{i:05d}" for i in range(1, printed)]
    entry = FileOffsetStore(tmp_path / ".pymetaq_offsets").load("t", "big", "0-0")
    assert entry is not None and entry.offset == 26 * printed, (entry, printed)  # exactly
    committed = entry.offset
    if printed < N:  # the next run goes on exactly there
        again = cli(broker, tmp_path, "consume", "--topic", "big", "--group", "t", "--count", "1")
        assert again.stdout == f"m{committed // 26:05d}\n"


def test_several_topics_and_a_pattern(broker: BrokerProcess, tmp_path: Path) -> None:
    r = cli(
        broker, tmp_path, "consume", "--topic", "log-*", "--topic", "a", "--from-beginning",
        "--count", "3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["app", "in-a", "web"]
    r = cli(broker, tmp_path, "consume", "--topic", "zzz-*")
    assert r.returncode == 2
    assert r.stderr.startswith("pymetaq consume: no topic matches 'zzz-*' (topics: a, big, ")


def test_an_ungrouped_consumer_says_it_waits_at_the_end(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    r = cli(broker, tmp_path, "consume", "--topic", "a", "--idle-timeout", "1")
    assert (r.returncode, r.stdout) == (0, "")
    assert r.stderr == (
        "pymetaq consume: waiting for new messages on a (without --group it starts at the end; "
        "--from-beginning prints what is already there)\n"
    )
    r = cli(broker, tmp_path, "consume", "--topic", "a", "--from-beginning", "--count", "1")
    assert (r.stdout, r.stderr) == ("in-a\n", "")


def _offsets(b: BrokerProcess, home: Path) -> list[tuple[str, int]]:
    r = cli(b, home, "offsets", "show", "--group", "rg", "--json")
    assert r.returncode == 0, r.stderr
    return [(d["partition"], d["offset"]) for d in json.loads(r.stdout)]


def test_offsets_reset_is_a_dry_run_unless_executed(broker: BrokerProcess, tmp_path: Path) -> None:
    r = cli(broker, tmp_path, "consume", "--topic", "rst", "--group", "rg", "--count", "3")
    assert r.returncode == 0 and r.stdout.split() == ["r0", "r1", "r2"], r.stderr
    assert _offsets(broker, tmp_path) == [("0-0", 66)]
    for flag in ([], ["--dry-run"]):
        r = cli(broker, tmp_path, "offsets", "reset", "--group", "rg", "--to", "earliest", *flag)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [
            "topic  partition  old  new",
            "rst    0-0        66   0",
            "dry run: 1 offset(s) of group 'rg' would change; nothing written (add --execute "
            "to write them)",
        ]
        assert _offsets(broker, tmp_path) == [("0-0", 66)]
    r = cli(broker, tmp_path, "offsets", "reset", "--group", "rg", "--to", "22", "--execute")
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "reset 1 offset(s) of group 'rg'"
    assert _offsets(broker, tmp_path) == [("0-0", 22)]
    r = cli(broker, tmp_path, "offsets", "reset", "--group", "rg", "--to", "1", "--execute")
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == "hint: nothing was changed"
    assert "offset 1 of rst/0-0 is not where a message starts" in r.stderr
    assert _offsets(broker, tmp_path) == [("0-0", 22)]
    r = cli(
        broker, tmp_path, "offsets", "reset", "--group", "rg", "--topic", "rst", "--to", "500",
        "--execute", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["executed"] is True
    assert [(c["partition"], c["old"], c["new"], c["clamped"]) for c in doc["changes"]] == [
        ("0-0", 22, 66, True),  # clamped to the end
        ("0-1", None, 0, True),  # an empty partition: 0..0
    ]
    assert _offsets(broker, tmp_path) == [("0-0", 66), ("0-1", 0)]
    r = cli(
        broker, tmp_path, "offsets", "reset", "--group", "rg", "--to", "0", "--execute", "--dry-run"
    )
    assert r.returncode == 2 and "not allowed with argument" in r.stderr


def test_topics_and_stats_listings(broker: BrokerProcess, tmp_path: Path) -> None:
    r = cli(broker, tmp_path, "topics", "--json")
    assert r.returncode == 0, r.stderr
    rows = {d["topic"]: d for d in json.loads(r.stdout)}
    assert rows["rst"]["partitions"] == 2 and rows["rst"]["message_count"] == 3
    assert rows["log-*"]["pattern"] and rows["log-app"]["partitions"] == 2
    assert {d["broker"] for d in rows.values()} == {server(broker)}
    text = cli(broker, tmp_path, "topics").stdout.splitlines()
    assert text[0].split() == [
        "topic",
        "partitions",
        "messages",
        "bytes",
        "publish",
        "subscribe",
        "broker",
    ]
    assert any(line.startswith("log-*") and line.endswith(": a pattern") for line in text)
    for spec in (server(broker), f"{broker.host}:{broker.port}"):  # meta:// and host:port
        r = cli(broker, tmp_path, "stats", "--servers", spec, "--json")
        assert r.returncode == 0, r.stderr
        [doc] = json.loads(r.stdout)
        assert doc["server"] == server(broker) and doc["stats"]["port"] == broker.port
    r = cli(broker, tmp_path, "stats", "reset")  # PYMETAQ_SERVERS
    assert (r.returncode, r.stdout) == (0, "reset ok\n")
