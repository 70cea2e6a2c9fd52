"""``pymetaq tail``'s pure parts: records from bytes, the config file (tail4j's INI, TOML, the
flags), the attribute and the readback's chase, the checkpoint's atomic file, and the CLI's
user errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pymetaq.client.tail import checkpoint
from pymetaq.client.tail.config import ConfigError, load_config
from pymetaq.client.tail.files import FollowedFile, Matcher, locate, split_lines, split_records
from pymetaq.client.tail.readback import Ranges, attribute, chase, parse_attribute


def test_split_lines_keeps_a_partial_last_line_for_later() -> None:
    assert split_lines(b"a\nb\r\n\npart") == ([b"a", b"b", b""], 6)
    assert split_lines(b"no newline") == ([], 0)


def test_split_records_waits_for_the_next_start_unless_final() -> None:
    start = re.compile(rb"\d{4}-")
    data = b"2024-1 boom\n  at x\n  at y\n2024-2 ok\n2024-3 tail\n  more\n"
    records, used = split_records(data, start)
    assert records == [b"2024-1 boom\n  at x\n  at y", b"2024-2 ok"]
    assert data[used:] == b"2024-3 tail\n  more\n"
    records, used = split_records(data, start, final=True)
    assert records[-1] == b"2024-3 tail\n  more" and used == len(data)


def test_attribute_round_trip_and_chase() -> None:
    attr = attribute("ag", "1:2", 3, 100, 250, 4, 77, "web1", "/var/log/a;b=c.log")
    assert attr.endswith(";host=web1;file=/var/log/a;b=c.log")
    assert parse_attribute(attr, "ag") == ("1:2", 3, 100, 250, 4, 77)
    assert parse_attribute(attr, "other") is None
    assert parse_attribute("tail=ag;garbage", "ag") is None
    ranges: Ranges = {("1:2", 3): {100: (250, 7), 250: (400, 8), 500: (600, 9)}}
    assert chase(ranges, "1:2", 3, 100, None) == (400, 8)  # stops at the gap 400..500
    assert chase(ranges, "1:2", 4, 100, 5) == (100, 5)


def test_tail4j_ini_and_toml(tmp_path: Path) -> None:
    ini = tmp_path / "tail4j.ini"
    ini.write_text(
        "[system]\ncheckpoint_path=/tmp/cp\nmax_buf_size=131073\n"
        "[meta]\nserver_url=meta://127.0.0.1:8123\ndiamond_zk_data_id=\n"
        "[topic_1]\ntopic=test\nlog_base_path=/var/log/app\n"
        "log_name_regx=/var/log/app/config\\.client\\.log.*\nencoding=utf-8\ncompress=false\n"
        "ordered=true\ntimeout=10000\ncheckpoint_name=test_cp\n"
    )
    cfg = load_config(str(ini))
    (src,) = cfg.sources
    assert cfg.servers == "meta://127.0.0.1:8123" and cfg.max_buf_size == 131073
    assert src.topic == "test" and src.checkpoint == "/tmp/cp/test_cp.json"
    assert src.ordered and not src.compress and src.timeout_ms == 10000
    assert src.encoding is None  # utf-8: shipped as it is
    toml = tmp_path / "tail.toml"
    toml.write_text(
        '[app]\ntopic = "logs"\npaths = ["/var/log/*.log", "/srv/x.log"]\ncompress = true\n'
        'multiline_start = "^\\\\d{4}"\n'
    )
    (src,) = load_config(str(toml)).sources
    assert src.globs == ("/var/log/*.log", "/srv/x.log") and src.compress
    assert src.multiline_start == "^\\d{4}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[app]\ntopic=t\npaths=/x\ncompres=true\n", "unknown key 'compres' (did you mean 'compress'?)"),
        ("[app]\npaths=/x\n", "no topic="),
        ("[app]\ntopic=t\n", "no files"),
        ("[app]\ntopic=t\npaths=/x\nordered=maybe\n", "expected true or false"),
        ("[app]\ntopic=t\nlog_base_path=/x\nlog_name_regx=(\n", "bad regular expression"),
        ("[system]\n", "no source section"),
    ],
)  # fmt: skip
def test_config_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.ini"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(str(path))


def test_matcher_locate_and_truncation(tmp_path: Path) -> None:
    (tmp_path / "app.log").write_bytes(b"one\ntwo\n")
    (tmp_path / "app.log.1").write_bytes(b"old\n")
    (tmp_path / "other.txt").write_bytes(b"x\n")
    m = Matcher(base_dir=str(tmp_path), name_regex=re.compile(r"app\.log.*"))
    assert [Path(p).name for p in m.paths()] == ["app.log", "app.log.1"]
    f = FollowedFile.open(str(tmp_path / "app.log"))
    assert f is not None
    f.advance(f.read_chunk(100))
    assert f.pos == 8 and not f.truncated()
    (tmp_path / "app.log").rename(tmp_path / "app.log.2")
    assert locate(f.ident, str(tmp_path / "app.log")) == str(tmp_path / "app.log.2")
    with open(tmp_path / "app.log.2", "r+b") as w:  # copytruncate, then the writer goes on
        w.truncate(0)
        w.write(b"new content, longer than before\n")
    assert f.truncated()
    assert f.restart_truncated() == 8 and f.gen == 1 and f.pos == 0
    f.close()


def test_checkpoint_round_trip_and_lock(tmp_path: Path) -> None:
    path = str(tmp_path / "cp" / "a.json")
    fd = checkpoint.lock(path)
    with pytest.raises(checkpoint.CheckpointError, match="another agent"):
        checkpoint.lock(path)
    cp = checkpoint.Checkpoint("t", "agent1", {"1:2": checkpoint.FileMark("/x", 5, 1, b"ab", 9)})
    cp.scan["0-0"] = 42
    checkpoint.save(path, cp)
    back = checkpoint.load(path, "t")
    assert back == cp
    with pytest.raises(checkpoint.CheckpointError, match="belongs to topic 't'"):
        checkpoint.load(path, "u")
    Path(path).write_text("{broken")
    with pytest.raises(checkpoint.CheckpointError, match="cannot read"):
        checkpoint.load(path, "t")
    import os

    os.close(fd)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "tail", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.integration
def test_cli_user_errors(tmp_path: Path) -> None:
    out = _cli()
    assert out.returncode == 2
    assert out.stderr.startswith("pymetaq tail: name a --topic and the files to follow")
    assert "hint:" in out.stderr and "Traceback" not in out.stderr
    bad = tmp_path / "bad.ini"
    bad.write_text("[app]\ntopic=t\npaths=/x\nordred=true\n")
    out = _cli("--config", str(bad))
    assert out.returncode == 2 and "did you mean 'ordered'?" in out.stderr
    out = _cli("--topic", "bad topic!", "/x")
    assert out.returncode == 2 and out.stderr.startswith("pymetaq tail: ")
    assert "Traceback" not in out.stderr


@pytest.mark.integration
def test_once_ships_multiline_records_and_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    from tests._broker import BrokerProcess
    from tests.client._helpers import fetch_all

    log = tmp_path / "app.log"
    log.write_bytes(b"2024-01 start\n2024-02 boom\n  at a()\n  at b()\n2024-03 last\n  tail\n")
    with BrokerProcess.start(tmp_path / "b", topics={"logs": {}}) as broker:
        args = ["--servers", f"meta://{broker.host}:{broker.port}", "--topic", "logs",
                "--checkpoint", str(tmp_path / "cp.json"), "--multiline-start", r"\d{4}-",
                "--once", str(log)]  # fmt: skip
        out = _cli(*args)
        assert out.returncode == 0, out.stderr
        assert out.stderr.endswith("shipped 3 lines\n")
        with open(log, "ab") as f:
            f.write(b"2024-04 more\n")
        out = _cli(*args)
        assert out.returncode == 0 and out.stderr.endswith("shipped 1 line\n"), out.stderr
        values = [m.value for m in fetch_all(broker.address, "logs", 0)]
    assert values == [
        b"2024-01 start",
        b"2024-02 boom\n  at a()\n  at b()",
        b"2024-03 last\n  tail",
        b"2024-04 more",
    ]
