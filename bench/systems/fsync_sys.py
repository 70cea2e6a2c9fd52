"""The disk floor: group commit in process, no network, no broker (``--systems fsync``).

What is the lowest publish→ack latency a durable acknowledgement can have on this machine's
disk at the offered rate? This "system" answers it in the same run as the real ones. The
runner thread follows the same open-loop schedule as every other system and hands each message
to a committer thread (one lock, one list). The committer does what the ideal group commit
does and nothing else:
1. take every message handed over since its last round;
2. write them as one record batch into a preallocated file with ``os.pwrite``;
3. ``fdatasync`` the file;
4. record every message of the round as acked at that moment.

It has no protocol, no parsing, no event loop, no second process, no future per message and no
copy but the one write: nothing a broker and client could do in less time. The modes:
* ``group`` syncs one file per round, its space reserved with ``posix_fallocate`` as the
  broker reserves a segment's.
* ``group-idem`` also appends a 48-byte entry to a second file and fdatasyncs both, started
  together, the way pymetaq's broker makes an idempotent producer's batch durable with
  ``producersSync=fdatasync``.
* ``group-idem-inplace`` writes that entry into zeros written (and synced) ahead of time and
  sends it to the device with ``sync_file_range`` (started together with the log's own write,
  then waited for) before the log's fdatasync, whose cache flush covers it: the broker's
  default (``producersSync=auto``) on ext4 and XFS (:mod:`pymetaq.storage.syncrange`).
* ``group-prewritten`` writes zeros over the whole file (and syncs them) before the run,
  as RocketMQ's ``warmMapedFileEnable`` does. A fallocated block is *unwritten* until
  the first fdatasync after data lands in it, and that fdatasync also commits the extent's
  conversion to the journal; a prewritten block has none to commit.

Only ``ack_latency`` runs: it is a floor for durable acknowledgements, not a message queue.

Thread-safety: the runner thread hands over under ``_lock``; the committer thread owns the files
and the recorder (the runner reads it only after the committer has stopped).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import NS, Latency, LatencyRecorder, Mode, OpenLoop, Throughput, stamped
from bench.systems.base import System
from pymetaq.storage.syncrange import range_sync, start_writeback

#: the floor's segment: preallocated like a broker segment, so no write extends the file (a
#: round that would pass the end starts again at 0: 100k msgs/s of 100 bytes fill it in 5 s)
_SEGMENT_BYTES = 64 << 20
#: MetaQ's record header (length, CRC, id, flag): the floor writes it too, zeroed
_HEADER = bytes(20)
#: one producers-file entry, as big as the broker's
_IDEM_ENTRY = bytes(48)
#: ``group-idem-inplace``: the zeros written ahead for the entries (wrapping around)
_IDEM_RESERVE = 1 << 20


class FsyncSystem(System):
    name = "fsync"
    modes = (
        Mode(
            "group", "disk floor: pwrite + fdatasync per round into a fallocated file, in process"
        ),
        Mode(
            "group-idem", "disk floor as group, plus a 48-byte append to a second file, synced too"
        ),
        Mode(
            "group-idem-inplace",
            "disk floor as group, plus a 48-byte entry written in place and sent to the device "
            "before the log's fdatasync",
        ),
        Mode("group-prewritten", "disk floor as group, the file's blocks written with zeros first"),
    )
    cases = ("ack_latency",)

    def __init__(self) -> None:
        self._dir: Path | None = None

    def start(self, workdir: Path) -> None:
        self._dir = workdir / "fsync-floor"
        self._dir.mkdir(parents=True, exist_ok=True)

    def stop(self) -> None:
        pass

    def produce(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        raise NotImplementedError("the fsync floor runs ack_latency only")

    def consume(self, msg_bytes: int, batch: int, seconds: float, mode: str) -> Throughput:
        raise NotImplementedError("the fsync floor runs ack_latency only")

    def e2e_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        raise NotImplementedError("the fsync floor runs ack_latency only")

    def ack_latency(
        self, rate: int, msg_bytes: int, batch: int, seconds: float, mode: str
    ) -> Latency:
        assert self._dir is not None, "start() first"
        with _Committer(self._dir, mode) as committer:
            loop = OpenLoop(rate, seconds)
            rec = committer.start(LatencyRecorder(loop.record_from_ns))
            sent = 0
            for due in loop.batches(batch):
                committer.send([(t, stamped(t, msg_bytes)) for t in map(loop.scheduled_ns, due)])
                sent = due.stop
        elapsed = (time.perf_counter_ns() - loop.start_ns) / NS
        return rec.result(rate, sent, elapsed, note=loop.shortfall_note(sent))


class _Committer:
    """One committer thread doing ideal group commit (see the module docstring)."""

    def __init__(self, directory: Path, mode: str) -> None:
        self._rec: LatencyRecorder | None = None
        self._lock = threading.Condition()
        self._pending: list[tuple[int, bytes]] = []
        self._closed = False
        self._log = os.open(directory / "log", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        if mode == "group-prewritten":
            zeros = bytes(1 << 20)
            for k in range(_SEGMENT_BYTES >> 20):
                os.pwrite(self._log, zeros, k << 20)
        else:
            os.posix_fallocate(self._log, 0, _SEGMENT_BYTES)
        os.fsync(self._log)
        self._pos = 0
        self._idem = -1
        self._idem_pos = 0
        self._in_place = mode == "group-idem-inplace"
        self._pool: ThreadPoolExecutor | None = None
        if mode == "group-idem":  # appended to, as the broker appends to producers.idem
            path = directory / "producers"
            self._idem = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="fsync-floor-idem")
        elif self._in_place:  # a reserve of zeros, written and synced ahead (as the broker's)
            path = directory / "producers"
            self._idem = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.pwrite(self._idem, bytes(_IDEM_RESERVE), 0)
            os.fdatasync(self._idem)
        self._thread = threading.Thread(target=self._run, name="fsync-floor", daemon=True)

    def start(self, rec: LatencyRecorder) -> LatencyRecorder:
        """Starts the committer thread, recording acks in ``rec`` (returned)."""
        self._rec = rec
        self._thread.start()
        return rec

    def __enter__(self) -> _Committer:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        if self._rec is not None:
            self._thread.join()
        if self._pool is not None:
            self._pool.shutdown()
        if self._idem >= 0:
            os.close(self._idem)
        os.close(self._log)

    def send(self, messages: list[tuple[int, bytes]]) -> None:
        """Hands over ``(scheduled_ns, value)`` pairs: acked when a round has synced them."""
        with self._lock:
            if not self._pending:
                self._lock.notify()
            self._pending += messages

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
            data = b"".join(part for _, value in batch for part in (_HEADER, value))
            if self._pos + len(data) > _SEGMENT_BYTES:
                self._pos = 0
            os.pwrite(self._log, data, self._pos)
            self._pos += len(data)
            if self._pool is not None:
                os.write(self._idem, _IDEM_ENTRY)
                other = self._pool.submit(os.fdatasync, self._idem)
                os.fdatasync(self._log)
                other.result()
            elif self._in_place:
                if self._idem_pos + len(_IDEM_ENTRY) > _IDEM_RESERVE:
                    self._idem_pos = 0
                os.pwrite(self._idem, _IDEM_ENTRY, self._idem_pos)
                # as the broker: the log's write started, the entry's written and waited
                # for, then the flush
                start_writeback(self._log, self._pos - len(data), len(data))
                range_sync(self._idem, self._idem_pos, len(_IDEM_ENTRY))
                self._idem_pos += len(_IDEM_ENTRY)
                os.fdatasync(self._log)
            else:
                os.fdatasync(self._log)
            now = time.perf_counter_ns()
            assert self._rec is not None
            record = self._rec.record
            for scheduled_ns, _ in batch:
                record(scheduled_ns, now)
