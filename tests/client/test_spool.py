"""The client's local spool: order, removal, restarts, torn tails, compaction, threads."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from pymetaq.client.errors import MetaClientError, SpoolFull, SpoolLocked
from pymetaq.client.spool import (
    FRAME_ADD,
    Spool,
    SpoolConfig,
    SpoolEntry,
    _encode_add,
)
from pymetaq.storage.record import encode_data, encode_record, iter_records

FAST = SpoolConfig(fsync=False)


def rec(i: int, attribute: str | None = None) -> bytes:
    data, flag = encode_data(f"payload-{i}".encode() * (1 + i % 5), attribute)
    return encode_record(data, flag, msg_id=1000 + i)


def test_pending_is_in_insertion_order_with_metadata(tmp_path: Path) -> None:
    with Spool(tmp_path / "s", FAST) as spool:
        keys = [spool.append(rec(i), topic="t", partition="0-3", offset=i * 100) for i in range(5)]
        k_attr = spool.append(rec(9, "tag"), topic="t", partition=2, attempts=4)
        assert keys == sorted(keys) and len(set(keys)) == 5
        pending = spool.pending()
        assert [e.key for e in pending] == [*keys, k_attr]
        assert pending[2] == SpoolEntry(keys[2], rec(2), "t", "0-3", 200, 0)
        assert pending[-1] == SpoolEntry(k_attr, rec(9, "tag"), "t", "2", -1, 4)
        assert pending[-1].message().msg_id == 1009
        assert list(spool) == pending
        assert len(spool) == 6


def test_remove_then_reopen_keeps_only_pending(tmp_path: Path) -> None:
    d = tmp_path / "s"
    with Spool(d) as spool:
        keys = [spool.append(rec(i), topic="t", partition="0-0") for i in range(10)]
        assert spool.remove(keys[3]) is True
        assert spool.remove(keys[3]) is False
        assert spool.remove(keys[0]) is True
        assert spool.remove(999_999) is False
    with Spool(d) as spool:
        assert [e.key for e in spool] == [k for k in keys if k not in (keys[0], keys[3])]
        assert [e.record for e in spool] == [rec(i) for i in range(10) if i not in (0, 3)]
        assert spool.recovery.truncated_bytes == 0
        new = spool.append(rec(10))
        assert new > keys[-1]  # keys never reused while entries remain
    with Spool(d) as spool:
        assert spool.pending()[-1] == SpoolEntry(new, rec(10))


def test_torn_tail_is_cut_and_reported(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    d = tmp_path / "s"
    with Spool(d) as spool:
        for i in range(6):
            spool.append(rec(i), topic="t")
        spool.remove(1)
        (path,) = spool.files()
    full = path.read_bytes()
    good = path.stat().st_size
    # a 7th ADD frame torn at a random point (crash mid-write)
    frame = _encode_add(SpoolEntry(7, rec(7), "t"))
    cut = rng.randrange(1, len(frame))
    path.write_bytes(full + frame[:cut])
    with Spool(d) as spool:
        assert [e.key for e in spool] == [2, 3, 4, 5, 6]
        assert spool.recovery.truncated_bytes == cut
        assert path.stat().st_size == good  # cut back, so later appends follow a clean frame
        k = spool.append(rec(8))
    with Spool(d) as spool:
        assert [e.key for e in spool] == [2, 3, 4, 5, 6, k]
        assert spool.recovery.truncated_bytes == 0


def test_corrupt_tail_checksum_is_cut(tmp_path: Path) -> None:
    d = tmp_path / "s"
    with Spool(d) as spool:
        spool.append(rec(1))
        spool.append(rec(2))
        (path,) = spool.files()
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # flip a bit in the last frame's body
    path.write_bytes(bytes(raw))
    with Spool(d) as spool:
        assert [e.record for e in spool] == [rec(1)]
        assert spool.recovery.truncated_files == (path.name,)


def test_files_roll_and_are_deleted_when_all_done(tmp_path: Path) -> None:
    d = tmp_path / "s"
    cfg = SpoolConfig(max_file_bytes=300, fsync=False)
    with Spool(d, cfg) as spool:
        keys = [spool.append(rec(i)) for i in range(12)]
        files = spool.files()
        assert len(files) >= 3
        first_file_keys = [
            r.msg_id for r in iter_records(files[0].read_bytes()) if r.flag == FRAME_ADD
        ]
        for k in first_file_keys:
            spool.remove(k)
        assert not files[0].exists()  # compacted
        assert spool.files() == files[1:]
        # removing from a later file writes its REMOVE frame there, not in the active file
        rest = [k for k in keys if k not in first_file_keys]
        spool.remove(rest[0])
    with Spool(d, cfg) as spool:
        assert [e.key for e in spool] == rest[1:]
        for k in rest[1:]:
            spool.remove(k)
        assert spool.files() == []
        assert len(spool) == 0
    assert sorted(p.name for p in d.iterdir()) == [".lock"]


def test_second_opener_is_refused(tmp_path: Path) -> None:
    with Spool(tmp_path / "s", FAST), pytest.raises(SpoolLocked) as info:
        Spool(tmp_path / "s", FAST)
    assert isinstance(info.value, MetaClientError) and info.value.retriable
    Spool(tmp_path / "s", FAST).close()  # released on close


def test_append_rejects_anything_but_one_record(tmp_path: Path) -> None:
    with Spool(tmp_path / "s", FAST) as spool:
        with pytest.raises(ValueError):
            spool.append(rec(1) + rec(2))
        with pytest.raises(ValueError):
            spool.append(rec(1)[:-1])
        bad = bytearray(rec(1))
        bad[-1] ^= 1
        with pytest.raises(ValueError):
            spool.append(bytes(bad))
        assert len(spool) == 0


def test_full_spool_refuses(tmp_path: Path) -> None:
    with Spool(tmp_path / "s", SpoolConfig(fsync=False, max_entries=2)) as spool:
        spool.append(rec(1))
        spool.append(rec(2))
        with pytest.raises(SpoolFull):
            spool.append(rec(3))
        spool.remove(1)
        spool.append(rec(3))


def test_retry_moves_to_end_with_one_more_attempt(tmp_path: Path) -> None:
    with Spool(tmp_path / "s", FAST) as spool:
        a = spool.append(rec(1), topic="t", partition="0-1", offset=5)
        b = spool.append(rec(2))
        new = spool.retry(a)
        assert new is not None
        assert [e.key for e in spool] == [b, new]
        assert spool.get(new) == SpoolEntry(new, rec(1), "t", "0-1", 5, 1)
        assert spool.retry(a) is None


def test_paths_follow_metaq_layout(tmp_path: Path) -> None:
    with Spool.for_consumer(tmp_path, "orders", "billing", FAST) as s:
        assert s.dir == tmp_path / "orders@billing"
    with Spool.for_producer(tmp_path, "orders", "0-2", FAST) as s:
        assert s.dir == tmp_path / "orders@0-2"


def test_concurrent_appends_and_removes_lose_nothing(tmp_path: Path, seed: int) -> None:
    d = tmp_path / "s"
    cfg = SpoolConfig(max_file_bytes=2000, fsync=False)
    threads_n, per_thread = 4, 150
    kept: list[list[bytes]] = [[] for _ in range(threads_n)]
    errors: list[BaseException] = []
    with Spool(d, cfg) as spool:

        def run(t: int) -> None:
            rng = random.Random(seed + t)
            try:
                for i in range(per_thread):
                    r = rec(t * 10_000 + i)
                    k = spool.append(r, topic=f"t{t}")
                    if rng.random() < 0.5:
                        assert spool.remove(k)
                    else:
                        kept[t].append(r)
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(t,)) for t in range(threads_n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        live = spool.pending()
    assert [e.key for e in live] == sorted(e.key for e in live)
    with Spool(d, cfg) as spool:
        assert spool.pending() == live
        for t in range(threads_n):  # per-thread order preserved, nothing lost
            assert [e.record for e in spool if e.topic == f"t{t}"] == kept[t]
