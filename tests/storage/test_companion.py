"""The idempotent producers' file is made durable with its log, not after it.

``producers.idem`` must be durable before an idempotent batch is acknowledged (group commit).
The log tells its *companion* before each fdatasync (``before_flush``) and after it
(``after_flush``).  In place (ext4, XFS: ``producersSync=auto``) the file writes its new entries
to the device first, so the log's own flush covers them: no fdatasync of the file at all.
Otherwise (``producersSync=fdatasync``) its fdatasync runs on a helper thread beside the log's.
These tests count and hold the system calls to see which ran and in what order; what a power
loss keeps is in ``test_producers_in_place.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from pymetaq.storage import producers
from pymetaq.storage.producers import (
    ENTRY_SIZE,
    FILE_NAME,
    RESERVE_MIN,
    ProducerEntry,
    ProducerFile,
    decode_entries,
)
from tests.storage._helpers import batch, manager

PID = "0c" * 16


def _entry(seq: int) -> ProducerEntry:
    return ProducerEntry(PID, seq, 1, seq, seq * 100, 100)


def _record(monkeypatch: pytest.MonkeyPatch, name: str, calls: list[tuple[str, int]]) -> None:
    """Record every ``producers._io.<name>`` call as ``(name, fd)`` (each still made)."""
    real = getattr(producers._io, name)

    def recorded(fd: int, *args: int) -> object:
        calls.append((name, fd))
        return real(fd, *args)

    monkeypatch.setattr(producers._io, name, recorded)


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The file's fdatasyncs from now on."""
    calls: list[tuple[str, int]] = []
    _record(monkeypatch, "fdatasync", calls)
    return calls


@pytest.fixture
def in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """In place whatever filesystem the test directory is on (the logic, not the filesystem)."""
    monkeypatch.setattr(producers, "in_place_filesystem", lambda _path: "test")


# -- producersSync=fdatasync ---------------------------------------------------------------


def test_a_ticket_already_covered_costs_no_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pfile = ProducerFile(str(tmp_path), sync="fdatasync")
    pfile.load()
    assert pfile.in_place is None
    calls = _count_fsyncs(monkeypatch)
    first = pfile.append(_entry(0))
    second = pfile.append(_entry(1))
    assert (first, second) == (1, 2) and pfile.pending()
    pfile.sync(first)  # one fsync covers both entries written so far
    assert len(calls) == 1 and not pfile.pending()
    pfile.sync(second)
    pfile.sync()
    assert len(calls) == 1
    third = pfile.append(_entry(2))
    pfile.sync(second)  # still covered: no fsync for an entry written later
    assert len(calls) == 1 and pfile.pending()
    pfile.sync(third)
    assert len(calls) == 2
    pfile.close()


def test_appends_go_on_while_the_file_is_being_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pfile = ProducerFile(str(tmp_path), sync="fdatasync")
    pfile.load()
    entered, release = threading.Event(), threading.Event()
    real = producers._io.fdatasync

    def slow(fd: int) -> None:
        entered.set()
        assert release.wait(10)
        real(fd)

    monkeypatch.setattr(producers._io, "fdatasync", slow)
    first = pfile.append(_entry(0))
    syncer = threading.Thread(target=pfile.sync, args=(first,))
    syncer.start()
    assert entered.wait(10)
    tickets: list[int] = []
    appender = threading.Thread(target=lambda: tickets.append(pfile.append(_entry(1))))
    appender.start()
    appender.join(5)  # blocked if the file's lock were held during the fdatasync
    assert tickets == [2] and pfile.pending()
    second = tickets[0]
    release.set()
    syncer.join(10)
    assert not syncer.is_alive()
    assert pfile.pending()  # the fsync that ran covered only the first entry
    monkeypatch.setattr(producers._io, "fdatasync", real)
    pfile.sync(second)
    assert not pfile.pending()
    pfile.close()
    assert ProducerFile(str(tmp_path)).read() == [_entry(0), _entry(1)]


def test_the_files_fsync_runs_alongside_the_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fdatasync mode: the log starts the file's fdatasync on a helper thread and does not
    wait for it; the durable callback's ``sync(ticket)`` does."""
    started, release = threading.Event(), threading.Event()
    threads: list[str] = []
    real = producers._io.fdatasync

    def held(fd: int) -> None:
        threads.append(threading.current_thread().name)
        started.set()
        assert release.wait(10)
        real(fd)

    m = manager(str(tmp_path))  # group commit
    try:
        plog = m.get_log("t", 0)
        assert plog is not None
        pfile = ProducerFile(plog.directory, sync="fdatasync")
        pfile.load()
        plog.companion = pfile
        monkeypatch.setattr(producers._io, "fdatasync", held)
        ticket = pfile.append(_entry(0))
        durable = threading.Event()
        plog.append(batch([b"a"]), on_durable=lambda result, exc: durable.set())
        # the log's own fsync completes (its callback runs) while the file's is still held
        assert started.wait(10)
        assert durable.wait(10)
        assert pfile.pending() and threads[0].startswith("pymetaq-producers-sync")
        release.set()
        pfile.sync(ticket)
        assert not pfile.pending()
        pfile.close()
    finally:
        release.set()
        m.close()


def test_without_a_spare_descriptor_the_file_is_still_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pfile = ProducerFile(str(tmp_path), sync="fdatasync")
    pfile.load()
    ticket = pfile.append(_entry(0))

    def no_fd(fd: int) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(producers._io, "dup", no_fd)
    synced = _count_fsyncs(monkeypatch)
    pfile.sync(ticket)  # no error: the file's own descriptor is fsynced instead
    assert len(synced) == 1 and not pfile.pending()
    monkeypatch.undo()
    pfile.close()


def test_fdatasync_mode_cuts_the_reserve_an_in_place_life_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(producers, "in_place_filesystem", lambda _path: "test")
        pfile = ProducerFile(str(tmp_path))
        pfile.load()
        pfile.append(_entry(0))
        pfile.close()
    path = tmp_path / FILE_NAME
    assert path.stat().st_size == RESERVE_MIN
    pfile = ProducerFile(str(tmp_path), sync="fdatasync")
    assert pfile.load() == [_entry(0)]
    assert path.stat().st_size == ENTRY_SIZE
    pfile.close()


# -- in place --------------------------------------------------------------------------


@pytest.mark.usefixtures("in_place")
def test_in_place_the_logs_flush_covers_the_entries_without_an_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real log in group commit: the entries go to the device (one ``sync_file_range`` of
    exactly the new entries that writes and waits, after the segment's own writeback was
    started) before the segment's fdatasync, and the durable callback finds them covered: no
    fdatasync of the file."""
    m = manager(str(tmp_path))  # group commit
    try:
        plog = m.get_log("t", 0)
        assert plog is not None
        pfile = ProducerFile(plog.directory)
        pfile.load()
        plog.companion = pfile
        order: list[str] = []
        seg = plog.segments[-1].file
        real_seg_sync = seg.sync

        def seg_sync() -> None:
            order.append("log fdatasync")
            real_seg_sync()

        monkeypatch.setattr(seg, "sync", seg_sync)
        real_seg_writeback = seg.start_writeback

        def seg_writeback(pos: int, n: int) -> None:
            order.append("log writeback")
            real_seg_writeback(pos, n)

        monkeypatch.setattr(seg, "start_writeback", seg_writeback)
        ranges: list[tuple[int, int]] = []
        real_range = producers._io.range_sync

        def range_sync(fd: int, offset: int, n: int) -> None:
            order.append("range sync")
            ranges.append((offset, n))
            real_range(fd, offset, n)

        monkeypatch.setattr(producers._io, "range_sync", range_sync)
        fsyncs = _count_fsyncs(monkeypatch)
        done = threading.Event()
        for round_ in range(3):
            tickets = [pfile.append(_entry(2 * round_ + k)) for k in range(2)]
            done.clear()
            plog.append(batch([b"a"]), on_durable=lambda result, exc: done.set())
            assert done.wait(10)
            assert not pfile.pending()
            pfile.sync(tickets[-1])  # what the durable callback does: nothing left to do
        assert order == ["log writeback", "range sync", "log fdatasync"] * 3
        assert ranges == [(2 * r * ENTRY_SIZE, 2 * ENTRY_SIZE) for r in range(3)]
        assert fsyncs == []
        pfile.close()
        assert ProducerFile(plog.directory).read() == [_entry(s) for s in range(6)]
    finally:
        m.close()


def test_no_companion_work_in_threshold_mode(tmp_path: Path) -> None:
    calls: list[str] = []

    class Recording:
        def before_flush(self, overlap: Callable[[], None]) -> int | None:
            calls.append("before")
            return 1

        def after_flush(self, ticket: int) -> None:
            calls.append("after")

    m = manager(str(tmp_path), threshold=1)  # every append waits for an fsync
    try:
        plog = m.get_log("t", 0)
        assert plog is not None
        plog.companion = Recording()
        durable = threading.Event()
        plog.append(batch([b"a"]), on_durable=lambda result, exc: durable.set())
        assert durable.wait(10)
        assert calls == []
    finally:
        m.close()


@pytest.mark.usefixtures("in_place")
def test_a_new_file_gets_a_durable_reserve_and_a_reload_fsyncs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = _count_fsyncs(monkeypatch)
    pfile = ProducerFile(str(tmp_path))
    assert pfile.load() == [] and pfile.in_place == "test"
    path = tmp_path / FILE_NAME
    assert path.read_bytes() == bytes(RESERVE_MIN) and len(fsyncs) == 1
    pfile.append(_entry(0))
    pfile.close()
    # a process crash may leave a reserve in the page cache that no fdatasync covered, so a
    # load fdatasyncs even when it writes nothing
    pfile = ProducerFile(str(tmp_path))
    assert pfile.load() == [_entry(0)]
    assert len(fsyncs) == 2  # a whole reserve after the entries again:
    assert path.read_bytes() == _entry(0).encode() + bytes(RESERVE_MIN)
    pfile.close()


@pytest.mark.usefixtures("in_place")
def test_load_clears_a_torn_entry_and_the_stale_ones_behind_it(tmp_path: Path) -> None:
    """A torn entry ends what is loaded; the valid entries behind it (written by a life that
    lost power) are cleared, so a later load cannot find them behind new entries."""
    good = [_entry(s) for s in range(3)]
    stale = [_entry(s) for s in (10, 11)]
    torn = bytearray(_entry(3).encode())
    torn[5] ^= 0xFF
    raw = b"".join(e.encode() for e in good) + bytes(torn) + b"".join(e.encode() for e in stale)
    (tmp_path / FILE_NAME).write_bytes(raw + bytes(100))
    pfile = ProducerFile(str(tmp_path))
    assert pfile.load() == good
    pfile.append(_entry(3))
    pfile.close()
    data = (tmp_path / FILE_NAME).read_bytes()
    assert decode_entries(data)[0] == [*good, _entry(3)]
    assert data.count(0, 4 * ENTRY_SIZE) == len(data) - 4 * ENTRY_SIZE  # zeros after them
    assert len(data) >= 4 * ENTRY_SIZE + RESERVE_MIN // 2


@pytest.mark.usefixtures("in_place")
def test_an_old_file_with_a_torn_tail_gets_a_reserve(tmp_path: Path) -> None:
    raw = _entry(0).encode() + _entry(1).encode()[:30]  # written before in place existed
    (tmp_path / FILE_NAME).write_bytes(raw)
    pfile = ProducerFile(str(tmp_path))
    assert pfile.load() == [_entry(0)]
    assert (tmp_path / FILE_NAME).read_bytes() == _entry(0).encode() + bytes(RESERVE_MIN)
    pfile.close()


@pytest.mark.usefixtures("in_place")
def test_the_reserve_is_renewed_ahead_on_a_helper_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Callable[[], None]] = []
    monkeypatch.setattr(producers, "_start_sync", started.append)
    pfile = ProducerFile(str(tmp_path))
    pfile.load()
    path = tmp_path / FILE_NAME
    half = RESERVE_MIN // ENTRY_SIZE // 2
    for seq in range(half):
        pfile.append(_entry(seq))
    assert started == [] and path.stat().st_size == RESERVE_MIN
    pfile.append(_entry(half))  # less than half a reserve left: the next one is written
    assert len(started) == 1 and path.stat().st_size == 2 * RESERVE_MIN
    for seq in range(half + 1, 3 * half):
        pfile.append(_entry(seq))
    assert len(started) == 1  # one renewal at a time
    assert pfile.before_flush() is None  # entries past the durable reserve: not in place
    assert len(started) == 2  # the file's own fdatasync instead
    fsyncs = _count_fsyncs(monkeypatch)
    started.pop(0)()  # the renewal's fdatasync: entries and the reserve durable
    assert len(fsyncs) == 1 and not pfile.pending()
    started.pop(0)()  # the other one finds nothing left to do
    assert len(fsyncs) == 1
    pfile.append(_entry(3 * half))  # in the durable reserve: in place again
    assert pfile.before_flush() == 3 * half + 1
    pfile.close()
    assert [e.sequence for e in ProducerFile(str(tmp_path)).read()] == list(range(3 * half + 1))


@pytest.mark.usefixtures("in_place")
def test_a_rewrite_keeps_a_reserve_and_appends_follow_the_kept_entries(
    tmp_path: Path,
) -> None:
    pfile = ProducerFile(str(tmp_path))
    pfile.load()
    for seq in range(10):
        pfile.append(_entry(seq))
    pfile.rewrite([_entry(8), _entry(9)])
    assert not pfile.pending()
    path = tmp_path / FILE_NAME
    assert path.stat().st_size == 2 * ENTRY_SIZE + RESERVE_MIN
    ticket = pfile.append(_entry(10))
    assert pfile.before_flush() == ticket
    pfile.after_flush(ticket)
    pfile.close()
    assert ProducerFile(str(tmp_path)).read() == [_entry(8), _entry(9), _entry(10)]


@pytest.mark.usefixtures("in_place")
def test_a_reserve_synced_across_a_rewrite_does_not_count_for_the_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal's fdatasync that began before a compaction (rewrite) must not mark the old
    file's larger reserve as prepared in the new file: entries past the new file's own reserve
    are not in place."""
    started: list[Callable[[], None]] = []
    monkeypatch.setattr(producers, "_start_sync", started.append)
    pfile = ProducerFile(str(tmp_path))
    pfile.load()
    half = RESERVE_MIN // ENTRY_SIZE // 2
    for seq in range(half + 1):  # the first renewal: the old file's zeros reach 2 reserves
        pfile.append(_entry(seq))
    assert len(started) == 1
    real = producers._io.fdatasync
    rewrote: list[bool] = []

    def rewrite_meanwhile(fd: int) -> None:
        if not rewrote:  # the renewal's fdatasync: a compaction happens while it runs
            rewrote.append(True)
            pfile.rewrite([_entry(half)])
        real(fd)

    monkeypatch.setattr(producers._io, "fdatasync", rewrite_meanwhile)
    started.pop()()
    monkeypatch.setattr(producers._io, "fdatasync", real)
    per_reserve = RESERVE_MIN // ENTRY_SIZE
    for seq in range(half + 1, half + per_reserve + 2):  # one past the new file's reserve
        pfile.append(_entry(seq))
    started.clear()  # its renewal, not run: the entries past it are not prepared
    assert pfile.before_flush() is None
    pfile.close()
