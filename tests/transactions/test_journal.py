"""The journal's byte format, replay (torn tails, dropped files, corruption), checkpoints and the
``flushTxLogAtCommit`` policies."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pymetaq.storage.txjournal import JournalConfig, JournalCorrupt, JournalPos, TxJournal
from pymetaq.storage.txjournal import checkpoint as cpfile
from pymetaq.storage.txjournal.format import (
    MAGIC,
    Applied,
    Begin,
    Commit,
    Forget,
    FormatError,
    Heuristic,
    Outcome,
    PartIntent,
    Prepare,
    Put,
    Record,
    Rollback,
    decode,
    encode,
    frame,
    read_frame,
)
from tests.storage.faultdisk import FaultDisk

NAME = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=20)
U64 = st.integers(0, (1 << 64) - 1)
I32 = st.integers(-(1 << 31), (1 << 31) - 1)
RECORDS: st.SearchStrategy[Record] = st.one_of(
    st.builds(Begin, U64, st.booleans(), NAME),
    st.builds(Put, U64, NAME, I32, st.binary(max_size=64)),
    st.builds(Prepare, U64),
    st.builds(Rollback, U64),
    st.builds(
        Commit,
        U64,
        st.booleans(),
        st.lists(
            st.builds(
                PartIntent,
                NAME,
                I32,
                st.integers(-(1 << 63), (1 << 63) - 1),
                st.integers(0, (1 << 32) - 1),
                st.integers(0, (1 << 64) - 1),
                st.integers(0, (1 << 32) - 1),
            ),
            max_size=4,
        ).map(tuple),
    ),
    st.builds(
        Applied, U64, st.lists(st.tuples(NAME, I32, st.integers(0, 1 << 62)), max_size=4).map(tuple)
    ),
    st.builds(Heuristic, st.sampled_from(Outcome), st.integers(0, 1 << 50), NAME),
    st.builds(Forget, NAME),
)


@given(RECORDS)
def test_every_record_round_trips(rec: Record) -> None:
    data = encode(rec)
    body = read_frame(data, 0)
    assert body is not None and len(data) == 8 + len(body)
    assert decode(body) == rec


@given(RECORDS, st.data())
def test_a_torn_or_flipped_frame_is_never_read(rec: Record, data: st.DataObject) -> None:
    raw = bytearray(encode(rec))
    cut = data.draw(st.integers(0, len(raw) - 1))
    assert read_frame(bytes(raw[:cut]), 0) is None
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    assert read_frame(bytes(raw), 0) is None


def test_zeros_end_the_journal_and_bad_bodies_are_format_errors() -> None:
    assert read_frame(bytes(64), 0) is None
    with pytest.raises(FormatError, match="unknown journal record type 99"):
        decode(memoryview(b"\x63"))
    with pytest.raises(FormatError, match="trailing bytes"):
        decode(memoryview(encode(Prepare(1))[8:] + b"x"))


def journal(path: Path, disk: object = None, **kw: object) -> TxJournal:
    from pymetaq.storage.disk import MmapDisk

    return TxJournal(JournalConfig(str(path), **kw), disk or MmapDisk())  # type: ignore[arg-type]


def replay(j: TxJournal) -> list[tuple[JournalPos, Record]]:
    seen: list[tuple[JournalPos, Record]] = []
    j.replay(lambda pos, rec: seen.append((pos, rec)))
    return seen


def test_replay_returns_records_with_positions_and_cuts_a_torn_tail(tmp_path: Path) -> None:
    j = journal(tmp_path)
    assert replay(j) == []
    spans = [j.append(encode(Prepare(n))) for n in range(3)]
    j.close()
    with open(tmp_path / "redo.1", "ab") as f:
        f.write(encode(Prepare(99))[:5])  # a torn last record
    j = journal(tmp_path)
    seen = replay(j)
    assert seen == [(spans[n][0], Prepare(n)) for n in range(3)]
    assert os.path.getsize(tmp_path / "redo.1") == spans[-1][1].offset
    j.append(encode(Prepare(3)))
    j.close()
    assert [r for _, r in replay(journal(tmp_path))] == [Prepare(n) for n in range(4)]


def test_a_bad_frame_in_an_older_file_drops_the_later_files(tmp_path: Path) -> None:
    j = journal(tmp_path, file_size=64)
    rolls: list[int] = []
    j.on_roll = lambda: rolls.append(1)
    replay(j)
    for n in range(12):
        j.append(encode(Prepare(n)))
    j.close()
    assert len(rolls) >= 2
    raw = bytearray((tmp_path / "redo.2").read_bytes())
    raw[len(MAGIC) + 9] ^= 0xFF  # damage the first record of redo.2
    (tmp_path / "redo.2").write_bytes(bytes(raw))
    j = journal(tmp_path, file_size=64)
    report = j.replay(lambda pos, rec: None)
    assert report.files_dropped == [f"redo.{n}" for n in range(3, len(rolls) + 2)]
    assert sorted(os.listdir(tmp_path)) == ["redo.1", "redo.2"]
    j.close()


def test_a_checksummed_record_that_does_not_decode_stops_startup(tmp_path: Path) -> None:
    j = journal(tmp_path)
    replay(j)
    j.append(frame(b"\x63junk"))
    j.close()
    with pytest.raises(JournalCorrupt, match="unknown journal record type 99"):
        replay(journal(tmp_path))


def test_checkpoint_skips_replayed_records_and_keeps_max_checkpoints(tmp_path: Path) -> None:
    j = journal(tmp_path, max_checkpoints=2)
    replay(j)
    first = j.append(encode(Prepare(1)))
    second = j.append(encode(Prepare(2)))
    for n in range(4):
        j.force()
        j.write_checkpoint(second[0], 7 + n)
    j.close()
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("checkpoint")) == [
        "checkpoint.3",
        "checkpoint.4",
    ]
    (tmp_path / "checkpoint.4").write_bytes(b'{"file": 1, "offset": 8, "next_tid": 1}\nbad\n')
    j = journal(tmp_path)
    assert [r for _, r in replay(j)] == [Prepare(2)]  # checkpoint.3 (damaged .4 ignored)
    assert j.checkpoint == cpfile.Checkpoint(1, second[0].offset, 9)
    assert first[1] == second[0]
    j.close()


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_flush_policy_decides_when_a_commit_is_durable(tmp_path: Path, mode: int) -> None:
    disk = FaultDisk(random.Random(1))
    j = journal(tmp_path, disk=disk, flush_at_commit=mode, flush_every_s=0.05)
    replay(j)
    j.start()
    synced_before = disk.syncs
    done = threading.Event()
    seen: list[int] = []

    def cb(exc: BaseException | None) -> None:
        assert exc is None
        seen.append(disk.syncs)
        done.set()

    _, end = j.append(encode(Prepare(1)))
    j.sync(end, cb)
    assert done.wait(10)
    if mode == 1:  # after the fsync that covers it
        assert seen[0] > synced_before
    else:  # at once; mode 2 fsyncs within its period anyway
        assert seen[0] == synced_before
    if mode == 2:
        deadline = threading.Event()
        for _ in range(400):
            if disk.syncs > synced_before:
                break
            deadline.wait(0.005)
        assert disk.syncs > synced_before
    j.close()


def test_power_loss_keeps_every_fsynced_record_and_invents_none(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    forced: list[Record] = []  # covered by a completed force()
    written: list[Record] = []  # appended (maybe lost)
    for round_ in range(25):
        disk = FaultDisk(random.Random(rng.random()))
        j = journal(tmp_path, disk=disk, file_size=rng.choice([64, 256, 4096]))
        got = [r for _, r in replay(j)]
        assert got == written[: len(got)] and len(got) >= len(forced)
        forced, written = list(got), list(got)
        for n in range(rng.randrange(1, 30)):
            rec = Prepare(round_ * 1000 + n)
            j.append(encode(rec))
            written.append(rec)
            if rng.random() < 0.3:
                j.force()
                forced = list(written)
        disk.crash()
