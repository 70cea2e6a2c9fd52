"""The idempotent producers' file is fsynced alongside its log, not after it.

``producers.idem`` must be durable before an idempotent batch is acknowledged (group commit).
Its fdatasync used to run after the log's, in the durable callback, so an ack waited for two
fsyncs in a row; the log now starts it on a helper thread at the same time as its own
(:attr:`PartitionLog.companion`).  These tests hold the fsyncs with events to see the order.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pymetaq.storage.producers import ProducerEntry, ProducerFile
from tests.storage._helpers import batch, manager

PID = "0c" * 16


def _entry(seq: int) -> ProducerEntry:
    return ProducerEntry(PID, seq, 1, seq, seq * 100, 100)


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors ``os.fdatasync`` is called with from now on (each still fsynced)."""
    real = os.fdatasync
    calls: list[int] = []

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    return calls


def test_a_ticket_already_covered_costs_no_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pfile = ProducerFile(str(tmp_path))
    pfile.load()
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
    pfile = ProducerFile(str(tmp_path))
    pfile.load()
    entered, release = threading.Event(), threading.Event()
    real = os.fdatasync

    def slow(fd: int) -> None:
        entered.set()
        assert release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
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
    monkeypatch.setattr(os, "fdatasync", real)
    pfile.sync(second)
    assert not pfile.pending()
    pfile.close()
    assert ProducerFile(str(tmp_path)).read() == [_entry(0), _entry(1)]


class HeldCompanion:
    """A companion whose fsync waits for ``release`` (records the thread it ran on)."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.threads: list[str] = []

    def pending(self) -> bool:
        return True

    def sync(self) -> None:
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.release.wait(10)


def test_the_companion_fsync_runs_alongside_the_logs(tmp_path: Path) -> None:
    m = manager(str(tmp_path))  # group commit
    try:
        plog = m.get_log("t", 0)
        assert plog is not None
        companion = HeldCompanion()
        plog.companion = companion
        durable = threading.Event()
        plog.append(batch([b"a"]), on_durable=lambda result, exc: durable.set())
        # the log's own fsync completes (its callback runs) while the companion's is still
        # held: they run at the same time, on different threads
        assert companion.started.wait(10)
        assert durable.wait(10)
        assert not companion.release.is_set()
        assert companion.threads[0].startswith("pymetaq-companion-sync")
        companion.release.set()
    finally:
        m.close()


def test_no_companion_fsync_in_threshold_mode(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=1)  # every append waits for an fsync
    try:
        plog = m.get_log("t", 0)
        assert plog is not None
        companion = HeldCompanion()
        companion.release.set()
        plog.companion = companion
        durable = threading.Event()
        plog.append(batch([b"a"]), on_durable=lambda result, exc: durable.set())
        assert durable.wait(10)
        assert companion.threads == []
    finally:
        m.close()


def test_without_a_spare_descriptor_the_file_is_still_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pfile = ProducerFile(str(tmp_path))
    pfile.load()
    ticket = pfile.append(_entry(0))

    def no_fd(fd: int) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "dup", no_fd)
    synced = _count_fsyncs(monkeypatch)
    pfile.sync(ticket)  # no error: the file's own descriptor is fsynced instead
    assert len(synced) == 1 and not pfile.pending()
    monkeypatch.undo()
    pfile.close()
