"""The per-record size limit: a batch with one record over ``max_record_size`` is refused whole
and nothing is written (before the fix, ``append`` had no limit).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pymetaq.storage import InvalidRecords
from pymetaq.storage.record import encode_record
from tests.storage._helpers import (
    batch,
    manager,
    read_all,
)


@pytest.mark.parametrize("uniform", [True, False], ids=["uniform", "mixed"])
def test_max_record_size_rejects_the_batch_and_writes_nothing(
    tmp_path: Path, uniform: bool
) -> None:
    m = manager(str(tmp_path), threshold=0)
    plog = m.get_log("t", 0)
    assert plog is not None
    plog.append_sync(batch([b"first"]), timeout=10)
    end = plog.write_offset
    payloads = [b"x" * 101] * 3 if uniform else [b"ok", b"x" * 101, b"fine"]
    with pytest.raises(InvalidRecords) as info:
        plog.append(batch(payloads), max_record_size=100)
    assert info.value.offset == (0 if uniform else 22)  # the oversized record's position
    assert "101 bytes exceeds the limit of 100" in info.value.reason
    assert plog.write_offset == end
    # a record of exactly the limit is fine, in both paths
    ok = [b"y" * 100] * 2 if uniform else [b"y" * 100, b"z"]
    r = plog.append_sync(batch(ok), timeout=10)
    assert r.offset == end and r.count == 2
    assert [rec.data for rec in read_all(plog)] == [b"first", *ok]
    m.close()


def test_max_record_size_also_checked_without_stamping(tmp_path: Path) -> None:
    m = manager(str(tmp_path), threshold=0)
    plog = m.get_log("t", 0)
    assert plog is not None
    with pytest.raises(InvalidRecords, match="exceeds the limit"):
        records = bytearray(encode_record(b"a", msg_id=7) + encode_record(b"b" * 9, msg_id=8))
        plog.append(records, stamp_ids=False, max_record_size=8)
    assert plog.write_offset == 0
    m.close()
