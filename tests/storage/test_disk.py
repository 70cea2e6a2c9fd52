"""The real disk's two write paths (``[system] segmentWrites``): ``pwrite`` and ``mmap``."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from pymetaq.storage.config import WRITE_MODES
from pymetaq.storage.disk import MmapDisk
from pymetaq.storage.errors import DiskFull


def _script(seed: int) -> list[tuple[str, int, bytes]]:
    """Appends, a truncate and a grow, as a partition's active segment sees them."""
    rng = random.Random(seed)
    ops: list[tuple[str, int, bytes]] = []
    pos = 0
    for _ in range(200):
        data = rng.randbytes(rng.randint(1, 9000))
        ops.append(("write", pos, data))
        pos += len(data)
    ops.append(("truncate", pos // 2, b""))
    pos //= 2
    ops.append(("grow", 4 << 20, b""))
    for _ in range(50):
        data = rng.randbytes(rng.randint(1, 70000))
        ops.append(("write", pos, data))
        pos += len(data)
    ops.append(("seal", pos, b""))
    return ops


def _play(path: Path, writes: str, ops: list[tuple[str, int, bytes]]) -> bytes:
    f = MmapDisk(writes).create(str(path), 1 << 20)
    try:
        for op, arg, data in ops:
            if op == "write":
                f.write_at(arg, data)
            elif op == "truncate":
                f.truncate(arg)
            elif op == "grow":
                f.grow(arg)
            else:
                f.sync()
                f.seal(arg)
    finally:
        f.close()
    return path.read_bytes()


def test_both_write_modes_leave_the_same_file(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    ops = _script(seed)
    files = {w: _play(tmp_path / f"{w}.meta", w, ops) for w in WRITE_MODES}
    expected = bytearray()
    for op, arg, data in ops:
        if op == "write":
            expected[arg : arg + len(data)] = data
        elif op in ("truncate", "seal"):
            del expected[arg:]
    assert files["pwrite"] == files["mmap"] == bytes(expected)


def test_a_short_pwrite_is_continued_until_every_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwrite
    calls: list[int] = []

    def short(fd: int, data: bytes, pos: int) -> int:  # at most 1000 bytes per call
        calls.append(len(data))
        return real(fd, bytes(data[:1000]), pos)

    f = MmapDisk("pwrite").create(str(tmp_path / "s.meta"), 1 << 20)
    monkeypatch.setattr(os, "pwrite", short)
    payload = bytes(range(256)) * 10  # 2560 bytes: three calls
    f.write_at(100, payload)
    monkeypatch.undo()
    assert calls == [2560, 1560, 560]
    assert f.read_at(100, 2560) == payload
    f.close()


def test_a_pwrite_that_writes_nothing_is_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = MmapDisk("pwrite").create(str(tmp_path / "z.meta"), 1 << 20)
    monkeypatch.setattr(os, "pwrite", lambda fd, data, pos: 0 if pos else 10)
    with pytest.raises(DiskFull, match="nothing written at 10"):
        f.write_at(0, b"x" * 20)
    monkeypatch.undo()
    f.close()


def test_an_unknown_write_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="segment writes must be pwrite or mmap, not 'mapped'"):
        MmapDisk("mapped")


def test_a_pwrite_past_the_capacity_extends_the_file_and_keeps_reserving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "p.meta"
    f = MmapDisk("pwrite").create(str(path), 8192)
    f.write_at(0, b"a" * 8192)
    f.write_at(8192, b"b" * 100)  # nothing left to reserve below the capacity: no fallocate
    f.grow(1 << 20)
    f.write_at(8292, b"c" * 70000)
    assert "cannot reserve space" not in caplog.text
    assert f.read_at(8100, 200) == b"a" * 92 + b"b" * 100 + b"c" * 8
    f.seal(8292 + 70000)
    f.close()
    assert path.stat().st_size == 8292 + 70000


@pytest.mark.parametrize("writes", WRITE_MODES)
def test_start_writeback_is_a_hint_that_changes_nothing(tmp_path: Path, writes: str) -> None:
    """The log starts a segment's writeback while its companion's write is under way
    (``storage.syncrange``): the bytes stay as written, and a closed file ignores it."""
    f = MmapDisk(writes).create(str(tmp_path / "s"), 1 << 20)
    f.write_at(0, b"x" * 10_000)
    f.start_writeback(0, 10_000)
    f.start_writeback(5_000, 1 << 30)  # past the end: nothing to write, no error
    assert f.read_at(0, 10_000) == b"x" * 10_000
    f.sync()
    f.close()
    f.start_writeback(0, 10)  # closed: a no-op
