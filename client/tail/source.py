"""One source of ``pymetaq tail``: its files followed into one topic with one checkpoint.

The cycle (:meth:`Source.poll`, every ``poll_interval`` or at once while there is work):

1. **Acknowledgements** (``_reap``): per partition, the sent chunks in send order; a chunk
   the broker acknowledged moves its file's acknowledged position; the partition's ``scan``
   offset becomes the offset of the last chunk acknowledged with all before it. A failed
   chunk raises :class:`SendFailed`: the agent starts the source again from the checkpoint
   (the readback finds what the broker did store).
2. **Truncation** of each file (``copytruncate``): once the file's chunks in flight are
   acknowledged, it starts again at 0 in the next generation, and the copy (a file in the same
   directory whose head is the old head) is followed from where the original was.
3. **Discovery**: the configured globs / directory + regex; a file not seen before starts at 0
   (``start_position=end``: at its end, for the files found at the agent's very first start);
   a file whose name no longer matches (renamed by rotation) is read to its end and closed.
   A file is written into the checkpoint before anything of it is sent.
4. **Reading**: whole records from each file's position, at most ``max_buf_size`` bytes per
   chunk and ``MAX_BATCH_MESSAGES`` records, sent with ``send_many`` to the file's partition
   (``ordered``: ``crc32(identity) % partitions``; else round-robin per chunk), while the
   bytes in flight stay under ``8 x max_buf_size`` (the unacknowledged window).
5. **Checkpoint**: written (atomically, fsynced) at most every ``CHECKPOINT_INTERVAL_S`` when
   positions moved, and when a file is added.

At start (:meth:`Source.start`) the partitions are read from the checkpoint's ``scan``
offsets (:mod:`.readback`) and each file's position moves past its chunks the broker already
holds: after ``kill -9`` nothing is lost and nothing is sent twice.

Thread-safety: one thread runs a ``Source``.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
import zlib
from collections import deque
from dataclasses import dataclass, field

from pymetaq.client.producer.batch import BatchHandle
from pymetaq.client.producer.config import MAX_BATCH_MESSAGES
from pymetaq.client.producer.sync import Producer
from pymetaq.client.tail import checkpoint
from pymetaq.client.tail.config import SourceConfig
from pymetaq.client.tail.files import (
    FollowedFile,
    Matcher,
    identity,
    locate,
    split_lines,
    split_records,
)
from pymetaq.client.tail.readback import Ranges, attribute, chase, end_offsets, scan_partitions
from pymetaq.client.types import TopicPartition

log = logging.getLogger("pymetaq.tail")

CHECKPOINT_INTERVAL_S = 0.2
#: a renamed-away file that stopped growing this long (and is read to its end) is closed
DETACHED_LINGER_S = 2.0
WINDOW_CHUNKS = 8


class SendFailed(Exception):
    """The broker refused or lost a chunk; the source restarts from its checkpoint."""


@dataclass
class _Chunk:
    file: FollowedFile
    gen: int
    end: int
    sig: int | None
    nbytes: int
    handle: BatchHandle
    done: bool = False


@dataclass
class _Stats:
    lines: int = 0
    bytes: int = 0
    chunks: int = 0
    acked_lines: int = 0
    files: set[str] = field(default_factory=set)


class Source:
    def __init__(
        self,
        cfg: SourceConfig,
        servers: str,
        producer: Producer,
        max_buf_size: int,
        host: str,
    ) -> None:
        self.cfg = cfg
        self.servers = servers
        self.producer = producer
        self.buf = max_buf_size
        self.host = host
        self.matcher = Matcher(
            list(cfg.globs),
            cfg.base_dir,
            re.compile(cfg.name_regex) if cfg.name_regex else None,
        )
        self.start_rx = re.compile(cfg.multiline_start.encode()) if cfg.multiline_start else None
        self.files: dict[str, FollowedFile] = {}
        self.by_file: dict[str, deque[_Chunk]] = {}
        self.by_part: dict[TopicPartition, deque[_Chunk]] = {}
        self.inflight = 0
        self.rr = 0
        self.parts: list[TopicPartition] = []
        self.ranges: Ranges = {}
        self.cp = checkpoint.Checkpoint(cfg.topic)
        self.first_run = False
        self.dirty = False
        self.last_save = 0.0
        self.lock_fd = -1
        self.stats = _Stats()

    # ------------------------------------------------------------------ start / stop

    def start(self) -> None:
        cfg = self.cfg
        if self.lock_fd < 0:
            self.lock_fd = checkpoint.lock(cfg.checkpoint)
        self.first_run = not os.path.exists(cfg.checkpoint)
        self.cp = checkpoint.load(cfg.checkpoint, cfg.topic)
        if not self.cp.agent:
            self.cp.agent = uuid.uuid4().hex[:16]
        self.parts = self.producer.partitions(cfg.topic)
        missing = [tp for tp in self.parts if tp.key not in self.cp.scan]
        if missing or self.first_run:
            for tp, end in end_offsets(self.servers, missing).items():
                self.cp.scan[tp.key] = end
            checkpoint.save(cfg.checkpoint, self.cp)
        scan = {tp: self.cp.scan[tp.key] for tp in self.parts}
        self.ranges = scan_partitions(self.servers, scan, self.cp.agent)
        for ident, mark in list(self.cp.files.items()):
            self._restore(ident, mark)
        self._discover()
        self._save()

    def _restore(self, ident: str, mark: checkpoint.FileMark) -> None:
        path = locate(ident, mark.path)
        f = FollowedFile.open(path, mark.pos, mark.gen) if path else None
        if f is None or f.ident != ident:
            if f is not None:
                f.close()
            del self.cp.files[ident]
            return
        f.pos, f.sig = chase(self.ranges, ident, mark.gen, mark.pos, mark.sig)
        head = mark.head
        changed = f.head[: len(head)] != head
        while changed or f.truncated():
            # truncated while the agent was away (maybe more than once: each generation whose
            # start was sent has its copy followed from where the sending stopped)
            was, was_sig = f.pos, f.sig
            f.restart_truncated()
            self._adopt_copy(f, head, was, was_sig)
            f.pos, f.sig = chase(self.ranges, ident, f.gen, 0, None)
            head, changed = b"", False
            if f.pos == 0:
                break
        f.acked, f.acked_sig = f.pos, f.sig
        self._track(f)

    def close(self) -> None:
        """Wait for what is in flight, write the checkpoint, close the files."""
        try:
            self.producer.flush(self.cfg.timeout_ms / 1000 + 5)
            self._reap()
        except SendFailed:
            pass
        finally:
            self._save(force=True)
            for f in self.files.values():
                f.close()
            self.files.clear()
            if self.lock_fd >= 0:
                os.close(self.lock_fd)
                self.lock_fd = -1

    # ------------------------------------------------------------------ the cycle

    def poll(self) -> bool:
        """One cycle; True when it sent something (call again at once)."""
        self._reap()
        for f in list(self.files.values()):
            if not self.by_file[f.ident] and f.truncated():
                was, was_sig, old_head = f.pos, f.sig, f.head
                f.restart_truncated()
                f.acked_sig = None
                log.info("%s was truncated at %d: generation %d", f.path, was, f.gen)
                self._adopt_copy(f, old_head, was, was_sig)
                self._save(force=True)  # the new generation is recorded before it is sent
        self._discover()
        sent = False
        for f in list(self.files.values()):
            sent |= self._read(f)
        self._drop_detached()
        self._save()
        return sent

    def caught_up(self) -> bool:
        """Nothing in flight and (after a cycle that sent nothing) nothing whole left to read;
        with multi-line records, a file's last record is sent first (after
        ``multiline_timeout`` without growth)."""
        if self.inflight or any(self.by_part.values()):
            return False
        if self.start_rx is not None:
            now = time.monotonic()
            for f in self.files.values():
                if f.pos < f.size() and (
                    not f.idle_since or now - f.idle_since < self.cfg.multiline_timeout_s
                ):
                    return False
        return True

    def wait_acks(self, timeout_s: float) -> None:
        """Block until the oldest chunk in flight is answered (or ``timeout_s``)."""
        oldest = next((q[0] for q in self.by_part.values() if q), None)
        if oldest is not None:
            try:
                oldest.handle.wait(timeout_s)
            except TimeoutError:
                pass  # still pending: the next cycle looks again

    def _reap(self) -> None:
        for tp, q in self.by_part.items():
            while q and q[0].handle.done():
                c = q.popleft()
                results = c.handle.result(0)
                bad = [r for r in results if not r.success]
                if bad:
                    raise SendFailed(f"{tp}: {bad[0].error}")
                c.done = True
                self.cp.scan[tp.key] = results[0].offset
                self.inflight -= c.nbytes
                self.stats.acked_lines += len(results)
        for fq in self.by_file.values():
            while fq and fq[0].done:
                c = fq.popleft()
                if c.gen == c.file.gen:
                    c.file.acked = c.end
                    c.file.acked_sig = c.sig
                self.dirty = True

    def _track(self, f: FollowedFile) -> None:
        self.files[f.ident] = f
        self.by_file.setdefault(f.ident, deque())
        self.cp.files[f.ident] = self._mark(f)
        self.dirty = True

    def _mark(self, f: FollowedFile) -> checkpoint.FileMark:
        return checkpoint.FileMark(f.path, f.acked, f.gen, f.head, f.acked_sig)

    def _adopt_copy(self, f: FollowedFile, head: bytes, pos: int, sig: int | None) -> None:
        """Follow, from ``pos``, the copy ``copytruncate`` made of ``f`` before truncating it: a
        file of the same directory that holds, before ``pos``, the bytes ``f`` held there
        (``sig``), and starts with ``f``'s old head. With ``pos`` 0 nothing of ``f``'s content was
        sent: a copy that matches the source's names is then read whole as a new file."""
        if pos == 0 or sig is None:
            return
        directory = os.path.dirname(f.path) or "."
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return
        for name in names:
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            ident = identity(st)
            if ident in self.files or ident == f.ident or not os.path.isfile(path):
                continue
            copy = FollowedFile.open(path)
            if copy is None:
                continue
            if (
                copy.ident == ident
                and copy.head[: len(head)] == head
                and copy.size() >= pos
                and copy.sig_at(pos) == sig
            ):
                copy.pos, copy.sig = chase(self.ranges, ident, 0, pos, copy.sig_at(pos))
                copy.acked, copy.acked_sig = copy.pos, copy.sig
                log.info("%s is the copy of %s: read from %d", path, f.path, copy.pos)
                self._track(copy)
                self._save(force=True)
                return
            copy.close()

    def _looks_like_copy(self, nf: FollowedFile) -> bool:
        directory = os.path.dirname(nf.path)
        for f in self.files.values():
            n = min(len(f.head), len(nf.head))
            if n and os.path.dirname(f.path) == directory and f.head[:n] == nf.head[:n]:
                return True
        return False

    def _discover(self) -> None:
        seen: set[str] = set()
        added = False
        for path in self.matcher.paths():
            try:
                ident = identity(os.stat(path))
            except OSError:
                continue
            seen.add(ident)
            known = self.files.get(ident)
            if known is not None:
                known.path = path
                known.detached = False
                continue
            nf = FollowedFile.open(path)
            if nf is None or nf.ident != ident:
                if nf is not None:
                    nf.close()
                continue
            if not nf.head or self._looks_like_copy(nf):
                # empty (it may be a copy being made), or a copytruncate copy (adopted when
                # its original is seen truncated): looked at again at the next discovery
                nf.close()
                continue
            start = 0
            if self.first_run and self.cfg.start_at_end:
                start = _line_start_before(nf, nf.size())
            nf.pos, nf.sig = chase(self.ranges, ident, 0, start, nf.sig_at(start))
            nf.acked, nf.acked_sig = nf.pos, nf.sig
            log.info("new file %s: from %d", path, nf.pos)
            self._track(nf)
            added = True
        for ident, f in self.files.items():
            if ident not in seen:
                f.detached = True
        self.first_run = False
        if added:
            self._save(force=True)

    def _drop_detached(self) -> None:
        now = time.monotonic()
        for ident, f in list(self.files.items()):
            if not f.detached or self.by_file[ident] or f.pos < f.size():
                continue
            if f.idle_since and now - f.idle_since >= DETACHED_LINGER_S:
                f.close()
                del self.files[ident]
                del self.by_file[ident]
                self.cp.files.pop(ident, None)
                self.dirty = True

    # ------------------------------------------------------------------ reading

    def _partition(self, f: FollowedFile) -> int:
        n = len(self.parts)
        if self.cfg.ordered:
            return zlib.crc32(f.ident.encode()) % n
        self.rr += 1
        return self.rr % n

    def _read(self, f: FollowedFile) -> bool:
        sent = False
        while self.inflight < WINDOW_CHUNKS * self.buf:
            data = f.read_chunk(self.buf)
            now = time.monotonic()
            if not data:
                f.idle_since = f.idle_since or now
                return sent
            records, used = self._split(f, data, now)
            if not used:
                f.idle_since = f.idle_since or now
                return sent
            while len(records) > MAX_BATCH_MESSAGES:  # many short lines: a smaller chunk
                data = data[: len(data) // 2]
                records, used = self._split(f, data, now)
            if f.truncated():  # cut while we read: those bytes may be the new content
                return sent
            f.idle_since = 0.0
            self._send(f, records, data[:used])
            sent = True
        return sent

    def _split(self, f: FollowedFile, data: bytes, now: float) -> tuple[list[bytes], int]:
        if self.start_rx is None:
            records, used = split_lines(data)
        else:
            idle = bool(f.idle_since) and now - f.idle_since >= self.cfg.multiline_timeout_s
            records, used = split_records(data, self.start_rx, final=idle)
        if not used and len(data) >= self.buf:  # a line longer than the buffer: cut it
            return [data], len(data)
        if not used and f.detached and f.idle_since and now - f.idle_since >= DETACHED_LINGER_S:
            return [data], len(data)  # a rotated file's last line that never got its newline
        if self.cfg.encoding is not None:
            enc = self.cfg.encoding
            records = [r.decode(enc, "replace").encode("utf-8") for r in records]
        return records, used

    def _send(self, f: FollowedFile, records: list[bytes], data: bytes) -> None:
        start = f.pos
        used = len(data)
        f.advance(data)
        attr = attribute(
            self.cp.agent,
            f.ident,
            f.gen,
            start,
            f.pos,
            len(records),
            f.sig,
            self.host if self.cfg.attributes else None,
            f.path if self.cfg.attributes else None,
        )
        index = self._partition(f)
        handle = self.producer.send_many(self.cfg.topic, records, partition=index, attribute=attr)
        c = _Chunk(f, f.gen, f.pos, f.sig, used, handle)
        self.by_file[f.ident].append(c)
        self.by_part.setdefault(self.parts[index], deque()).append(c)
        self.inflight += used
        self.stats.lines += len(records)
        self.stats.bytes += used
        self.stats.chunks += 1

    # ------------------------------------------------------------------ checkpoint

    def _save(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and (not self.dirty or now - self.last_save < CHECKPOINT_INTERVAL_S):
            return
        for ident, f in self.files.items():
            self.cp.files[ident] = self._mark(f)
        checkpoint.save(self.cfg.checkpoint, self.cp)
        self.dirty = False
        self.last_save = now


def _line_start_before(f: FollowedFile, size: int) -> int:
    """The start of the last (possibly partial) line before ``size``: where tailing from the end
    begins without cutting a line."""
    tail = f.read_tail(size)
    return size - len(tail) + (tail.rfind(b"\n") + 1)
