"""Retention by consumer progress (``deletePolicy=consumed,...``): the parser, the pure
decision per segment, the record count of a loss, and the store applying it with an in-memory
offset source (the real ZooKeeper and PostgreSQL stores: tests/server/test_consumed_retention.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from pymetaq.storage import MessageStoreManager, StoreConfig, TopicStoreConfig
from pymetaq.storage.config import (
    DeletePolicy,
    RetentionKind,
    parse_delete_policy,
    parse_duration,
)
from pymetaq.storage.consumed import (
    Decision,
    Verdict,
    count_records_from,
    decide,
    is_consumed,
    unconsumed_from,
)
from tests.storage._helpers import batch

H = 3600.0


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("consumed,*", DeletePolicy(RetentionKind.CONSUMED, 0.0, groups=None)),
        ("consumed,billing", DeletePolicy(RetentionKind.CONSUMED, 0.0, groups=("billing",))),
        ("consumed,a+b,2", DeletePolicy(RetentionKind.CONSUMED, 2 * H, groups=("a", "b"))),
        ("consumed, a + b ,0.5", DeletePolicy(RetentionKind.CONSUMED, 0.5 * H, groups=("a", "b"))),
        ("CONSUMED,*,30s", DeletePolicy(RetentionKind.CONSUMED, 30.0, groups=None)),
        ("consumed,a,1.5m", DeletePolicy(RetentionKind.CONSUMED, 90.0, groups=("a",))),
    ],
)
def test_parse_consumed_policy(text: str, policy: DeletePolicy) -> None:
    assert parse_delete_policy(text) == policy


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("consumed", "expected"),
        ("consumed,a,b", "several groups are joined with '+' (consumed,a+b)"),
        ("consumed,a,b,1", "too many fields"),
        ("consumed,24", "reads as an age, not a group"),
        ("consumed,a|b", "not '|'"),
        ("consumed,*+a", "cannot be combined"),
        ("consumed,a++b", "an empty group name"),
        ("consumed,a+a", "named twice"),
        ("consumed,,1", "an empty group name"),
        ("consumed,a,-1", "not a minimum age"),
        ("consumed,a,1d", "not a minimum age"),
    ],
)
def test_parse_consumed_policy_rejects_ambiguous_input(bad: str, why: str) -> None:
    with pytest.raises(ValueError, match="bad deletePolicy") as info:
        parse_delete_policy(bad)
    assert why in str(info.value)


def test_parse_duration() -> None:
    assert [parse_duration(t) for t in ("0", "168", "0.25", "30s", "2m", "1.5h")] == [
        0.0, 168 * H, 0.25 * H, 30.0, 120.0, 1.5 * H,
    ]  # fmt: skip
    for bad in ("", "x", "1d", "-1", "1.", ".5"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_consumed_means_every_group_at_or_past_the_end() -> None:
    assert is_consumed(100, {"a": 100, "b": 250})
    assert not is_consumed(100, {"a": 100, "b": 99})
    assert not is_consumed(100, {"a": 100, "b": None})  # no offset: consumed nothing of it
    assert not is_consumed(100, {})  # '*' and nobody committed: nothing counts as consumed


def test_unconsumed_from_each_lagging_group() -> None:
    offsets = {"fast": 500, "mid": 150, "slow": 20, "never": None}
    assert unconsumed_from(100, 200, offsets) == {"mid": 150, "slow": 100, "never": 100}


def _d(**kw: object) -> Decision:
    args: dict[str, object] = {
        "start": 100,
        "end": 200,
        "mutable": False,
        "age_s": 10.0,
        "min_age_s": 0.0,
        "cap_s": 100.0,
        "offsets": {"a": 200, "b": 300},
        "named": ("a", "b"),
    }
    args.update(kw)
    return decide(**args)  # type: ignore[arg-type]


def test_decide() -> None:
    assert _d().verdict is Verdict.CONSUMED
    assert _d(mutable=True, age_s=10**9).verdict is Verdict.KEEP  # the active segment: never
    assert _d(offsets={"a": 199, "b": 300}).verdict is Verdict.KEEP  # a is inside it
    assert _d(offsets={"a": None, "b": 300}).verdict is Verdict.KEEP
    assert _d(min_age_s=11.0).verdict is Verdict.KEEP  # consumed, but too young
    assert _d(min_age_s=10.0).verdict is Verdict.CONSUMED
    assert _d(offsets=None).verdict is Verdict.KEEP  # unreadable store: never deletes
    capped = _d(age_s=101.0, offsets={"a": 150, "b": None})
    assert capped == Decision(Verdict.CAPPED, {"a": 150, "b": 100})
    assert _d(age_s=101.0).unconsumed_from == {}  # capped, but everyone had consumed it
    # the cap applies without offsets too: every named group may have lost it
    assert _d(age_s=101.0, offsets=None) == Decision(Verdict.CAPPED, {"a": 100, "b": 100})
    assert _d(age_s=101.0, offsets=None, named=None) == Decision(Verdict.CAPPED, {})
    assert _d(age_s=10**9, cap_s=0.0, offsets={"a": 0, "b": 0}).verdict is Verdict.KEEP  # no cap


def test_count_records_from(tmp_path: Path) -> None:
    sizes = [10, 1, 33, 5]
    data = bytearray(batch([b"x" * n for n in sizes]))
    path = tmp_path / "seg.meta"
    path.write_bytes(bytes(data) + bytes(64))  # preallocated zeros after the records
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + 20 + n)
    base = 4000
    firsts = [0, base + starts[1], base + starts[3], base + len(data), base + starts[1]]
    assert count_records_from(str(path), base, firsts, len(data)) == [4, 3, 1, 0, 3]
    assert count_records_from(str(path), base, [base + 1], len(data)) == [3]  # inside one
    assert count_records_from(str(path), base, [0], len(data) + 64) == [4]  # zeros end it
    assert count_records_from(str(path), base, [0], len(data) - 1) == [3]  # a torn last one
    assert count_records_from(str(path), base, [], len(data)) == []


def test_count_records_across_reads(tmp_path: Path) -> None:
    """Segments larger than one header read, records larger than one read."""
    sizes = [1000] * 150 + [200_000, 7, 70_000] + [10] * 3000
    path = tmp_path / "big.meta"
    path.write_bytes(bytes(batch([b"y" * n for n in sizes])))
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + 20 + n)
    picks = [0, 149, 150, 151, 152, 153, 2000, len(sizes) - 1]
    got = count_records_from(str(path), 0, [starts[i] for i in picks], starts[-1])
    assert got == [len(sizes) - i for i in picks]


class FakeProgress:
    """In-memory committed offsets (the pure store-side test; real stores elsewhere)."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.fail: Exception | None = None
        self.calls = 0

    def committed(
        self, topic: str, partition: int, groups: tuple[str, ...] | None
    ) -> dict[str, int | None]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        names = groups if groups is not None else tuple(sorted(self.offsets))
        return {g: self.offsets.get(g) for g in names}

    def close(self) -> None:
        pass


def _store(tmp_path: Path, policy: str, cap_s: float) -> tuple[MessageStoreManager, list[int]]:
    cfg = TopicStoreConfig(unflush_threshold=0, delete_policy=policy, max_retention_seconds=cap_s)
    m = MessageStoreManager(StoreConfig(str(tmp_path), max_segment_size=200), lambda t: cfg)
    m.open()
    m.start()
    plog = m.get_log("t", 0)
    assert plog is not None
    for i in range(9):  # 80-byte records, 2 a segment: 4 closed segments and the active one
        plog.append_sync(batch([b"%02d" % i * 30]), timeout=10)
    ends = [s.end for s in plog.segments]
    return m, ends


def _age_all(m: MessageStoreManager, seconds: float) -> None:
    plog = m.get_log("t", 0)
    assert plog is not None
    for s in plog.segments:
        t = time.time() - seconds
        os.utime(s.path, (t, t))


def test_store_deletes_only_what_every_group_passed(tmp_path: Path) -> None:
    m, ends = _store(tmp_path, "consumed,fast+slow,1m", 10 * H)
    plog = m.get_log("t", 0)
    assert plog is not None and len(ends) == 5  # 4 closed segments, the active one
    progress = FakeProgress()
    m.consumer_progress = progress
    progress.offsets = {"fast": ends[3], "slow": ends[0]}
    assert m.run_retention() == []  # younger than min-age: nothing, whatever was consumed
    assert progress.calls == 0  # nor was the offset store asked
    _age_all(m, 120)
    [gone] = m.run_retention()
    assert (gone.start, gone.reason, gone.lost) == (0, "consumed", ())
    assert plog.min_offset == ends[0]
    progress.offsets["slow"] = ends[2] - 1  # inside the third segment: it stays
    assert [a.start for a in m.run_retention()] == [ends[0]]
    progress.offsets["slow"] = ends[3]
    assert [a.start for a in m.run_retention()] == [ends[1], ends[2]]
    progress.offsets = {"fast": 10**9, "slow": 10**9}
    assert m.run_retention() == []  # the active segment is never deleted
    m.close()


def test_an_unreadable_store_deletes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pymetaq.storage.retention")
    m, ends = _store(tmp_path, "consumed,*", 10 * H)
    progress = FakeProgress()
    m.consumer_progress = progress
    progress.offsets = {"a": 10**9}
    progress.fail = ConnectionError("zookeeper down")
    _age_all(m, 120)
    assert m.run_retention() == []
    assert progress.calls == 1  # read once per partition and run
    assert m.run_retention() == []
    errors = [r for r in caplog.records if "cannot read the consumers' offsets" in r.message]
    assert len(errors) == 1  # the same reason is not repeated every run
    assert "t-0: cannot read the consumers' offsets (zookeeper down)" in errors[0].message
    m.consumer_progress = None  # no source at all: the same
    assert m.run_retention() == []
    progress.fail = None
    m.consumer_progress = progress
    assert len(m.run_retention()) == len(ends) - 1
    assert "t-0: the consumers' offsets can be read again" in caplog.text
    m.close()


def test_star_with_no_group_keeps_everything(tmp_path: Path) -> None:
    m, _ends = _store(tmp_path, "consumed,*", 10 * H)
    m.consumer_progress = FakeProgress()
    _age_all(m, 120)
    assert m.run_retention() == []
    m.close()


def test_the_cap_removes_and_counts_what_a_group_had_not_consumed(tmp_path: Path) -> None:
    m, ends = _store(tmp_path, "consumed,fast+stalled", 60.0)
    progress = FakeProgress()
    m.consumer_progress = progress
    progress.offsets = {"fast": ends[3], "stalled": 80}  # stalled read 1 of 8 records
    _age_all(m, 120)  # older than maxRetention (60 s)
    actions = m.run_retention()
    assert [(a.start, a.reason) for a in actions] == [(e - 160, "capped") for e in ends[:4]]
    assert [a.lost for a in actions] == [
        (("stalled", 80, 1),),
        (("stalled", 160, 2),),
        (("stalled", 160, 2),),
        (("stalled", 160, 2),),
    ]
    snap = m.metrics.snapshot()
    assert snap.unconsumed_removed == {("t", "stalled"): (4, 560, 7)}
    assert snap.retention_removed == {"deleted": (4, 640)}
    m.close()
