"""``pymetaq produce``: a file of N lines stores exactly N messages, in order; length framing."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.cli.produce import iter_length_prefixed, iter_lines
from tests._broker import BrokerProcess
from tests.client._helpers import fetch_all


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("cli")
    with BrokerProcess.start(tmp, topics={"lines": {"numPartitions": 3}, "framed": {}}) as b:
        yield b


def test_framing_readers() -> None:
    assert list(iter_lines(io.BytesIO(b"a\nb\r\n\nlast"))) == [b"a", b"b", b"", b"last"]
    data = struct.pack(">I", 3) + b"abc" + struct.pack(">I", 0) + struct.pack(">I", 2) + b"\n\n"
    assert list(iter_length_prefixed(io.BytesIO(data))) == [b"abc", b"", b"\n\n"]
    with pytest.raises(ValueError):
        list(iter_length_prefixed(io.BytesIO(struct.pack(">I", 5) + b"ab")))


@pytest.mark.integration
def test_produce_file_of_n_lines_stores_n_messages(broker: BrokerProcess, tmp_path: Path) -> None:
    n = 2500
    lines = [f"line {i}" for i in range(n)]
    lines[7] = ""  # an empty line is an empty message
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "produce", "--server", f"meta://{broker.host}:{broker.port}",
         "--topic", "lines", "--file", str(path), "--batch", "500", "--progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"produced {n:,} of {n:,} messages" in out.stderr
    assert "msg/s" in out.stderr
    stored = [fetch_all(broker.address, "lines", p) for p in range(3)]
    values = sorted(
        (m.value for part in stored for m in part), key=lambda v: int(v.split()[1]) if v else 7
    )
    assert len(values) == n
    assert values == [line.encode() for line in lines]
    for part in stored:  # each 500-line chunk went to one partition, in input order
        nums = [int(m.value.split()[1]) if m.value else 7 for m in part]
        assert nums == sorted(nums)


@pytest.mark.integration
def test_produce_stdin_length_framed_with_key_and_lz4(broker: BrokerProcess) -> None:
    payloads = [b"bin\x00ary\n" * i for i in range(50)]
    data = b"".join(struct.pack(">I", len(p)) + p for p in payloads)
    out = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "produce", "--server", f"meta://{broker.host}:{broker.port}",
         "--topic", "framed", "--framing", "length", "--key", "k", "--compression", "lz4"],
        input=data, capture_output=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [m.value for m in fetch_all(broker.address, "framed", 0)] == payloads


@pytest.mark.integration
def test_produce_reports_unreachable_server(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_text("a\n")
    out = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "produce", "--server", "meta://127.0.0.1:1",
         "--topic", "t", "--file", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1  # a runtime error (usage errors are 2)
    assert "cannot connect" in out.stderr and "Traceback" not in out.stderr
