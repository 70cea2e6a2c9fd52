"""Many partitions appended and read concurrently; exact on-disk bytes."""

from __future__ import annotations

import random
import threading
from pathlib import Path

from pymetaq.storage import ReadStatus
from pymetaq.storage.record import iter_records
from tests.storage._helpers import batch, file_bytes, manager, read_all, segment_files


def test_exact_bytes_on_disk_are_the_stamped_batch(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0)
    plog = m.get_log("t", 0)
    assert plog is not None
    b1 = batch([b"one", b"two"])
    b2 = batch([b"three" * 10])
    plog.append_sync(b1)
    plog.append_sync(b2)  # the caller's buffers were stamped in place
    m.close()
    [seg] = segment_files(str(tmp_path / "t-0"))
    assert file_bytes(seg) == bytes(b1 + b2)  # trimmed to the written length at clean close


def test_concurrent_appends_and_reads(tmp_path: Path, seed: int) -> None:
    m = manager(str(tmp_path), threshold=0, segment=2048)
    parts = 4
    expected: dict[int, list[bytes]] = {p: [] for p in range(parts)}
    errors: list[BaseException] = []
    done = threading.Event()

    def writer(p: int, rng: random.Random) -> None:
        try:
            plog = m.get_log("t", p)
            assert plog is not None
            for i in range(150):
                payloads = [
                    b"%d-%d-%d-" % (p, i, k) + rng.randbytes(rng.randrange(40))
                    for k in range(rng.randrange(1, 4))
                ]
                if rng.random() < 0.5:
                    plog.append_sync(batch(payloads), timeout=30)
                else:
                    plog.append(batch(payloads))
                expected[p] += payloads
        except BaseException as e:
            errors.append(e)

    def reader(rng: random.Random) -> None:
        try:
            while not done.is_set():
                plog = m.get_log("t", rng.randrange(parts))
                assert plog is not None
                pos = plog.min_offset
                while True:
                    res = plog.read(pos, rng.choice([64, 512, 4096]))
                    if res.status is not ReadStatus.OK:
                        assert res.status is ReadStatus.NO_DATA
                        break
                    assert res.region is not None
                    with res.region as region:
                        assert region.position + region.length <= 2048 or region.position == 0
                        data = region.read_bytes()
                    recs = list(iter_records(data, pos))  # verifies every CRC: nothing torn
                    assert recs[-1].offset + recs[-1].size <= plog.max_offset if recs else True
                    if not recs:
                        break
                    pos = recs[-1].offset + recs[-1].size
        except BaseException as e:
            errors.append(e)

    rng = random.Random(seed)
    writers = [
        threading.Thread(target=writer, args=(p, random.Random(rng.random()))) for p in range(parts)
    ]
    readers = [
        threading.Thread(target=reader, args=(random.Random(rng.random()),)) for _ in range(2)
    ]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    for t in readers:
        t.join()
    assert not errors, errors
    for p in range(parts):
        plog = m.get_log("t", p)
        assert plog is not None
        assert [r.data for r in read_all(plog)] == expected[p]
    m.close()
