"""``producers.idem`` in place: an entry is durable with the log's flush, across power losses.

In place mode (:mod:`pymetaq.storage.producers`) an entry is written to the device with
``sync_file_range`` before the log's fdatasync, whose device-cache flush then makes it durable;
it relies on the entry landing in a reserve of zeros that an fdatasync of the file made durable
before.  A power loss cannot be pulled on this machine, so these tests replace the file's system
calls (``producers._io``) by a model of the kernel and the device, page by page:

- a write lands in the page cache (the real file is written too, so the file reads back);
- ``sync_file_range`` moves the range's dirty pages to the device's volatile cache;
- ``fdatasync`` of any file moves that file's dirty pages and size to the device, then flushes
  the whole device cache to stable storage (every file's); the log's flush is such a call;
- a power loss keeps the stable pages, and - the adversary - any page that was in the page
  cache or the device cache may or may not have been written back too, and the size may be
  anything between the durable size and the written one.

Each case runs random lives of appends, log flushes (``before_flush``, the flush,
``after_flush``), fallback fdatasyncs and reserve renewals (the helper thread's work, run at
random moments or never), then loses power, loads the file again and checks that every entry
the file had called durable is there, in order, and nothing but written entries.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from pymetaq.storage import producers
from pymetaq.storage.producers import ENTRY_SIZE, RESERVE_MIN, ProducerEntry, ProducerFile

PAGE = 4096


class _Inode:
    def __init__(self, data: bytes) -> None:
        self.cache = bytearray(data)
        self.size = len(data)
        self.dirty: set[int] = set()  # pages changed since they last went to the device
        self.device: dict[int, bytes] = {}  # pages in the device's volatile cache
        self.stable = bytearray(data)
        self.stable_size = len(data)

    def page(self, p: int) -> bytes:
        return bytes(self.cache[p * PAGE : (p + 1) * PAGE])


class Kernel:
    """The model of the page cache and the device (the module docstring)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.inodes: dict[str, _Inode] = {}
        self.fds: dict[int, _Inode] = {}
        self.deferred: list[Callable[[], None]] = []  # the helper thread's queue

    # -- producers._io ------------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        fd = os.open(path, flags, mode)
        if path not in self.inodes:
            with open(path, "rb") as f:
                self.inodes[path] = _Inode(f.read())  # what a fresh boot reads is stable
        self.fds[fd] = self.inodes[path]
        return fd

    def pwrite(self, fd: int, data: bytes | memoryview, pos: int) -> int:
        n = os.pwrite(fd, data, pos)
        ino = self.fds[fd]
        if pos + n > len(ino.cache):
            ino.cache.extend(bytes(pos + n - len(ino.cache)))
        ino.cache[pos : pos + n] = bytes(data[:n])
        ino.size = max(ino.size, pos + n)
        ino.dirty.update(range(pos // PAGE, (pos + n - 1) // PAGE + 1))
        return n

    def dup(self, fd: int) -> int:
        new = os.dup(fd)
        self.fds[new] = self.fds[fd]
        return new

    def close(self, fd: int) -> None:
        os.close(fd)
        del self.fds[fd]

    def range_sync(self, fd: int, offset: int, nbytes: int) -> None:
        ino = self.fds[fd]
        for p in range(offset // PAGE, (offset + nbytes - 1) // PAGE + 1):
            if p in ino.dirty:
                ino.device[p] = ino.page(p)
                ino.dirty.discard(p)

    def fdatasync(self, fd: int) -> None:
        ino = self.fds[fd]
        for p in sorted(ino.dirty):
            ino.device[p] = ino.page(p)
        ino.dirty.clear()
        ino.stable_size = ino.size
        self.flush()

    # -- the rest of the machine --------------------------------------------------------
    def flush(self) -> None:
        """A device cache flush (the log's fdatasync): every file's device pages are stable."""
        for ino in self.inodes.values():
            for p, data in ino.device.items():
                end = p * PAGE + len(data)
                if end > len(ino.stable):
                    ino.stable.extend(bytes(end - len(ino.stable)))
                ino.stable[p * PAGE : end] = data
            ino.device.clear()

    def power_loss(self, path: str) -> bytes:
        """What the file holds after a power loss (the adversary's choices seeded)."""
        ino = self.inodes[path]
        image = bytearray(ino.stable)
        image.extend(bytes(max(0, ino.size - len(image))))
        for p in set(ino.device) | ino.dirty:
            if self.rng.random() < 0.5:  # written back anyway, from the newest copy
                image[p * PAGE : (p + 1) * PAGE] = ino.page(p)
        size = ino.stable_size  # the size the journal holds, or one writeback committed since
        if self.rng.random() < 0.5:
            size = self.rng.randint(ino.stable_size, max(ino.stable_size, ino.size))
        return bytes(image[:size])


def _entry(seq: int) -> ProducerEntry:
    return ProducerEntry("ab" * 16, seq, 1, seq, seq * 100, 100)


def _life(
    rng: random.Random, kernel: Kernel, directory: str, first_seq: int, steps: int
) -> tuple[list[int], int, ProducerFile]:
    """One life of the file until the power goes: (the sequences appended, how many of them
    the file called durable, the file)."""
    pfile = ProducerFile(directory)
    pfile.load()
    assert pfile.in_place
    seqs: list[int] = []
    for _ in range(steps):
        action = rng.random()
        if action < 0.6:
            for _ in range(rng.randint(1, 40)):
                seqs.append(first_seq + len(seqs))
                pfile.append(_entry(seqs[-1]))
        elif action < 0.85:  # a log round: range sync, the log's fdatasync, after_flush
            ticket = pfile.before_flush()
            if rng.random() < 0.9:  # else the log's sync was postponed (a transient shortage)
                kernel.flush()
                if ticket is not None:
                    pfile.after_flush(ticket)
        elif action < 0.92 and kernel.deferred:  # the helper thread gets to run
            kernel.deferred.pop(0)()
        else:  # a waiter the log's flush did not cover syncs the file itself
            pfile.sync(rng.randint(0, max(1, len(seqs))))
    return seqs, pfile._durable, pfile


@pytest.mark.parametrize("case", range(40))
def test_every_entry_called_durable_survives_a_power_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, case: int
) -> None:
    rng = random.Random(seed + case)
    monkeypatch.setattr(producers, "in_place_filesystem", lambda _path: "model")
    # small reserves (256 entries, whole pages), so lives run past several of them
    monkeypatch.setattr(producers, "RESERVE_MIN", 256 * ENTRY_SIZE)
    monkeypatch.setattr(producers, "RESERVE_MAX", 1024 * ENTRY_SIZE)
    directory = str(tmp_path)
    held: list[int] = []  # the sequences the file held when it was last loaded
    must = 0  # how many of them (from the start) a power loss must not take
    next_seq = 0
    kernel = Kernel(rng)
    for life in range(6):
        monkeypatch.setattr(producers, "_io", kernel)
        monkeypatch.setattr(producers, "_start_sync", kernel.deferred.append)
        seqs, durable, pfile = _life(rng, kernel, directory, next_seq, rng.randint(5, 120))
        next_seq += len(seqs) + 1000
        content = held + seqs
        must = max(must, len(held) + durable)
        for fd in list(kernel.fds):
            kernel.close(fd)
        power = rng.random() < 0.5
        if power:
            image = kernel.power_loss(pfile.path)
            with open(pfile.path, "wb") as f:
                f.write(image)
            kernel = Kernel(rng)  # a fresh boot
        else:  # a process crash: the page cache keeps everything, the helper's work is lost
            kernel.deferred.clear()
        monkeypatch.setattr(producers, "_io", producers._OS())
        got = [e.sequence for e in ProducerFile(directory).read()]
        what = f"life {life} ({'power loss' if power else 'process crash'})"
        assert got == content[: len(got)], f"{what}: not a prefix of what was written"
        assert len(got) >= must, f"{what}: {must} entries had to survive, {len(got)} did"
        if not power:
            assert got == content, f"{what}: a process crash lost an entry"
        held = got
        must = len(got)  # the next load fdatasyncs what it keeps


def test_the_model_loses_an_entry_when_the_flush_comes_before_the_range_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model is strict enough to catch the order it exists for: an entry whose range sync
    came after the log's flush is not durable (the adversary never writes it back here)."""
    rng = random.Random(0)
    rng.random = lambda: 1.0  # type: ignore[method-assign]  # no page is written back
    monkeypatch.setattr(producers, "in_place_filesystem", lambda _path: "model")
    kernel = Kernel(rng)
    monkeypatch.setattr(producers, "_io", kernel)
    pfile = ProducerFile(str(tmp_path))
    pfile.load()
    pfile.append(_entry(0))
    kernel.flush()  # the log's flush first
    ticket = pfile.before_flush()  # then the range sync: nothing flushes it
    assert ticket == 1
    image = kernel.power_loss(pfile.path)
    assert image[:ENTRY_SIZE] == bytes(ENTRY_SIZE)  # lost
    kernel2 = Kernel(rng)
    monkeypatch.setattr(producers, "_io", kernel2)
    pfile2 = ProducerFile(str(tmp_path / "ok"))
    (tmp_path / "ok").mkdir()
    pfile2.load()
    pfile2.append(_entry(0))
    assert pfile2.before_flush() == 1
    kernel2.flush()  # the right order
    assert kernel2.power_loss(pfile2.path)[:ENTRY_SIZE] == _entry(0).encode()
    for k in (kernel, kernel2):
        for fd in list(k.fds):
            os.close(fd)


def test_an_entry_past_the_prepared_reserve_is_not_durable_by_the_logs_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries beyond the reserve's durable end (its renewal still on the helper thread) are
    not covered by the log's flush: the waiters get an fdatasync of the file."""
    monkeypatch.setattr(producers, "in_place_filesystem", lambda _path: "model")
    kernel = Kernel(random.Random(0))
    monkeypatch.setattr(producers, "_io", kernel)
    monkeypatch.setattr(producers, "_start_sync", kernel.deferred.append)
    pfile = ProducerFile(str(tmp_path))
    pfile.load()
    per_reserve = RESERVE_MIN // ENTRY_SIZE
    for seq in range(per_reserve + 1):  # one past the first reserve
        pfile.append(_entry(seq))
    assert len(kernel.deferred) == 1  # the renewal, not run yet
    assert pfile.before_flush() is None  # the log's flush would not cover the last entry
    assert len(kernel.deferred) == 2  # the file's fdatasync was started instead
    kernel.deferred.pop()()
    assert not pfile.pending()
    for fd in list(kernel.fds):
        os.close(fd)
