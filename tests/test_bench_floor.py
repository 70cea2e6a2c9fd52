"""``--systems fsync``, the disk floor for durable acks: every scheduled message is acked once,
only after an fdatasync that covers it, and the bytes acked are on the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.common import stamp_of
from bench.systems import create
from bench.systems.fsync_sys import _HEADER, FsyncSystem


@pytest.mark.parametrize("mode", [m.name for m in FsyncSystem.modes])
def test_the_floor_acks_every_message_after_its_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    synced: list[int] = []  # the log's size written when each fdatasync of it started
    written = [0]
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync

    def pwrite(fd: int, data: bytes, pos: int) -> int:
        n = real_pwrite(fd, data, pos)
        if fd == floor_fd[0] and len(data) < 1 << 20:  # the log, not the prewritten zeros
            written[0] = pos + n
        return n

    def fdatasync(fd: int) -> None:
        if fd == floor_fd[0]:
            synced.append(written[0])
        real_fdatasync(fd)

    system = create("fsync")
    assert isinstance(system, FsyncSystem)
    system.start(tmp_path)
    floor_fd = [-1]
    real_open = os.open

    def open_(path: object, flags: int, mode_: int = 0o777) -> int:
        fd = real_open(path, flags, mode_)  # type: ignore[arg-type]
        if str(path).endswith("log"):
            floor_fd[0] = fd
        return fd

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    result = system.ack_latency(2000, 100, 50, 0.5, mode)
    system.stop()

    assert result.sent == 1000 and result.completed == 1000, result
    assert result.recorded > 0 and result.p50_us > 0
    assert synced and synced[-1] == 1000 * (len(_HEADER) + 100)  # the last round synced all
    log = (tmp_path / "fsync-floor" / "log").read_bytes()[: synced[-1]]
    stamps = [stamp_of(log[p + 20 : p + 120]) for p in range(0, len(log), 120)]
    assert stamps == sorted(stamps) and len(set(stamps)) == 1000  # each once, in order
