"""Cutting a log back (a replaced master rejoining): exact counts, and crash safety."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from pymetaq.storage import MessageStoreManager, StorageError
from pymetaq.storage import truncate as trunc
from pymetaq.storage.disk import fsync_dir
from pymetaq.storage.producers import FILE_NAME, ProducerEntry, ProducerFile, decode_entries
from pymetaq.storage.record import Record
from tests.storage._helpers import abandon, batch, manager, read_all, segment_names

SEG = 4096
PIDS = ["0a" * 16, "0b" * 16]


def _fill(m: MessageStoreManager, rng: random.Random, batches: int) -> list[Record]:
    """``batches`` batches of 3 records, each recorded in ``producers.idem`` as an idempotent
    producer's batch (one of two producers, numbered per producer)."""
    plog = m.get_log("t", 0)
    assert plog is not None
    pfile = ProducerFile(plog.directory)
    pfile.load()
    seqs = [0, 0]
    for i in range(batches):
        res = plog.append_sync(batch(rng.randbytes(rng.randrange(1, 400)) for _ in range(3)))
        pid = i % 2
        entry = ProducerEntry(PIDS[pid], seqs[pid], 3, res.first_msg_id, res.offset, res.length)
        pfile.append(entry)
        seqs[pid] += 1
    pfile.close()
    return read_all(plog)


def _entries(directory: str) -> list[ProducerEntry]:
    with open(os.path.join(directory, FILE_NAME), "rb") as f:
        return decode_entries(f.read())[0]


def test_truncate_counts_what_it_discards_and_the_log_continues_at_the_cut(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    for round_ in range(6):
        path = str(tmp_path / f"r{round_}")
        m = manager(path, segment=SEG)
        records = _fill(m, rng, 40)
        plog = m.get_log("t", 0)
        assert plog is not None
        end = plog.max_offset
        k = rng.randrange(0, len(records))
        cut = records[k].offset
        before = _entries(plog.directory)
        report = m.truncate("t", 0, cut)
        assert (report.offset, report.old_end) == (cut, end)
        assert report.records == len(records) - k
        assert report.bytes == end - cut
        # the producers' entries of the batches past the cut are gone, the others kept
        kept = [e for e in before if e.offset + e.length <= cut]  # a cut batch goes too
        assert _entries(plog.directory) == kept
        assert report.producer_entries == len(before) - len(kept)
        assert all(e.offset + e.length <= cut for e in kept)
        plog = m.get_log("t", 0)
        assert plog is not None and plog.max_offset == cut
        assert read_all(plog) == records[:k]
        plog.append_sync(batch([b"after"]))
        m.close()
        m = manager(path, segment=SEG)  # reopened: the cut and the new record stay
        plog = m.get_log("t", 0)
        assert plog is not None
        again = read_all(plog)
        assert again[:k] == records[:k] and [r.data for r in again[k:]] == [b"after"]
        assert again[k].offset == cut
        m.close()


def test_truncate_refuses_an_offset_outside_the_log(tmp_path: Path) -> None:
    m = manager(str(tmp_path), segment=SEG)
    records = _fill(m, random.Random(1), 5)
    plog = m.get_log("t", 0)
    assert plog is not None
    with pytest.raises(StorageError, match="cannot truncate to"):
        m.truncate("t", 0, plog.max_offset + 1)
    plog = m.get_log("t", 0)
    assert plog is not None and read_all(plog) == records  # nothing changed, open again
    m.close()


def test_a_crash_anywhere_in_a_truncation_recovers_to_the_cut(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies at the k-th file operation of the cut (every k in turn): reopened,
    the log ends exactly at the cut (never at its old end, never with a torn record)."""
    rng = random.Random(seed)
    k = 0
    while True:
        path = str(tmp_path / f"k{k}")
        m = manager(path, segment=SEG)
        records = _fill(m, rng, 30)
        directory = m.get_log("t", 0).directory  # type: ignore[union-attr]
        assert len(segment_names(directory)) > 3
        cut = records[rng.randrange(1, len(records) // 2)].offset
        m.close()
        ops = 0

        class Crash(Exception):
            pass

        def counted(real, limit=k):  # type: ignore[no-untyped-def]
            def op(*a, **kw):  # type: ignore[no-untyped-def]
                nonlocal ops
                ops += 1
                if ops > limit:
                    raise Crash
                return real(*a, **kw)

            return op

        with monkeypatch.context() as mp:
            for name in ("unlink", "fsync", "replace"):
                mp.setattr(os, name, counted(getattr(os, name)))
            mp.setattr(trunc, "fsync_dir", counted(fsync_dir))
            try:
                trunc.truncate_partition(directory, cut)
                finished = True
            except Crash:
                finished = False
        m = manager(path, segment=SEG)
        plog = m.get_log("t", 0)
        assert plog is not None
        got = read_all(plog)
        expected = [r for r in records if r.offset < cut]
        if k < 2:  # died before the intent was renamed into place: nothing was cut
            assert got == records
        else:
            assert got == expected, f"crash after {k} operations"
            assert plog.max_offset == cut
            assert all(e.offset + e.length <= cut for e in _entries(directory))
            assert len(_entries(directory)) == len(expected) // 3  # whole batches
        assert not os.path.exists(os.path.join(directory, trunc.INTENT_FILE))
        abandon(m)
        if finished:
            break
        k += 1
    assert k > 5  # the cut took several steps, each one crashed into once
