"""A fault-injecting Disk for power-loss tests (TigerBeetle style).

It wraps the real :class:`MmapDisk` (so the broker works normally) and keeps, per file, the
image that an fsync made durable.  :meth:`FaultDisk.crash` simulates a power loss: every open
file is closed, and each file is rewritten to its durable image plus a torn (random-length)
prefix of the last unsynced write — every other unsynced write is dropped (a file that grows
by appends, like the transaction journal, keeps the torn write at its position: the dropped
writes before it read as zeros).  Files whose
directory entry was never fsynced disappear.  Model simplifications: a file created and then
covered by ``sync_dir`` exists with its preallocated size; unlink/rename are durable at once.
"""

from __future__ import annotations

import os
import random
import threading

from pymetaq.storage.disk import MmapDisk, SegmentFile


class _State:
    def __init__(self, image: bytes, listed: bool) -> None:
        self.image = bytearray(image)  # durable content
        self.pending: list[tuple[int, bytes]] = []
        self.size = len(image)  # current (volatile) size
        self.listed = listed  # directory entry durable


class FaultFile:
    def __init__(self, disk: FaultDisk, inner: SegmentFile, path: str) -> None:
        self.disk, self.inner, self.path = disk, inner, path

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        with self.disk.lock:
            self.disk.check()
            self.inner.write_at(pos, data)
            st = self.disk.states[self.path]
            st.pending.append((pos, bytes(data)))

    def sync(self) -> None:
        with self.disk.lock:
            self.disk.check()
            self.inner.sync()
            st = self.disk.states.get(self.path)
            if st is None:
                return
            size = self.inner.size()
            img = st.image[:size] + bytes(max(0, size - len(st.image)))
            for pos, data in st.pending:
                if pos < size:
                    img[pos : pos + len(data)] = data[: size - pos]
            st.image, st.pending, st.size = img, [], size
            self.disk.syncs += 1

    def start_writeback(self, pos: int, n: int) -> None:
        self.inner.start_writeback(pos, n)  # a hint: nothing becomes durable by it

    def seal(self, size: int) -> None:
        with self.disk.lock:
            self.disk.check()
            self.inner.seal(size)

    def truncate(self, size: int) -> None:
        with self.disk.lock:
            self.disk.check()
            self.inner.truncate(size)

    def grow(self, capacity: int) -> None:
        with self.disk.lock:
            self.disk.check()
            self.inner.grow(capacity)

    def read_at(self, pos: int, n: int) -> bytes:
        return self.inner.read_at(pos, n)

    def size(self) -> int:
        return self.inner.size()

    def dup_fd(self) -> int | None:
        return self.inner.dup_fd()

    def close(self) -> None:
        self.inner.close()


class FaultDisk:
    def __init__(self, rng: random.Random) -> None:
        self.real = MmapDisk()
        self.rng = rng
        self.lock = threading.RLock()
        self.states: dict[str, _State] = {}
        self.files: list[FaultFile] = []
        self.dead = False
        self.syncs = 0

    def check(self) -> None:
        if self.dead:
            raise OSError(5, "simulated power loss")

    def _track(self, inner: SegmentFile, path: str) -> FaultFile:
        f = FaultFile(self, inner, path)
        self.files.append(f)
        return f

    def create(self, path: str, capacity: int) -> SegmentFile:
        with self.lock:
            self.check()
            inner = self.real.create(path, capacity)
            self.states[path] = _State(bytes(capacity), listed=False)
            return self._track(inner, path)

    def open(self, path: str, *, writable: bool, capacity: int = 0) -> SegmentFile:
        with self.lock:
            self.check()
            inner = self.real.open(path, writable=writable, capacity=capacity)
            if path not in self.states:
                with open(path, "rb") as f:
                    self.states[path] = _State(f.read(), listed=True)
            return self._track(inner, path)

    def sync_dir(self, path: str) -> None:
        with self.lock:
            self.check()
            self.real.sync_dir(path)
            for p, st in self.states.items():
                if os.path.dirname(p) == path:
                    st.listed = True

    def unlink(self, path: str) -> None:
        with self.lock:
            self.check()
            self.real.unlink(path)
            self.states.pop(path, None)

    def rename(self, src: str, dst: str) -> None:
        with self.lock:
            self.check()
            self.real.rename(src, dst)
            st = self.states.pop(src, None)
            if st is not None:
                self.states[dst] = st
            for f in self.files:  # open files follow their inode
                if f.path == src:
                    f.path = dst

    def crash(self) -> dict[str, int]:
        """Power loss now.  Returns the number of torn bytes kept per file (for debugging)."""
        with self.lock:
            self.dead = True
            for f in self.files:
                f.inner.close()
            torn: dict[str, int] = {}
            for path, st in self.states.items():
                if not st.listed:
                    os.unlink(path)
                    continue
                img = bytearray(st.image)
                if st.pending:
                    pos, data = st.pending[-1]
                    keep = self.rng.randrange(len(data) + 1)
                    if pos + keep > len(img):  # an appended file (the tx journal) grows; the
                        img.extend(bytes(pos + keep - len(img)))  # dropped writes read as zeros
                    end = min(pos + keep, len(img))
                    img[pos:end] = data[: end - pos]
                    torn[path] = end - pos
                with open(path, "r+b") as fh:
                    fh.truncate(0)
                    fh.write(img)
            return torn
