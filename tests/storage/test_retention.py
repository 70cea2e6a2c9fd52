"""Retention: MetaQ's delete/archive policies, pure predicates, the scheduler."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pymetaq.storage import (
    MessageStoreManager,
    ReadStatus,
    RetentionAction,
    RetentionActionKind,
    StoreConfig,
    TopicStoreConfig,
    iter_archived,
    parse_delete_policy,
    read_archived,
)
from pymetaq.storage.config import DeletePolicy, RetentionKind
from pymetaq.storage.retention import is_eligible, is_expired
from tests.storage._helpers import batch, file_bytes, read_all, wait_for


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("delete,168", DeletePolicy(RetentionKind.DELETE, 168 * 3600.0)),
        ("delete,10m", DeletePolicy(RetentionKind.DELETE, 600.0)),
        ("delete,30s", DeletePolicy(RetentionKind.DELETE, 30.0)),
        ("delete,2h", DeletePolicy(RetentionKind.DELETE, 7200.0)),
        ("archive,24", DeletePolicy(RetentionKind.ARCHIVE, 86400.0)),
        ("archive,1,true", DeletePolicy(RetentionKind.ARCHIVE, 3600.0, True)),
        ("archive,1,false", DeletePolicy(RetentionKind.ARCHIVE, 3600.0, False)),
    ],
)
def test_parse_policy(text: str, policy: DeletePolicy) -> None:
    assert parse_delete_policy(text) == policy


@pytest.mark.parametrize("bad", ["delete", "purge,1", "delete,x", "delete,1,true", "delete,-1"])
def test_parse_policy_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_delete_policy(bad)


def test_predicates() -> None:
    pol = parse_delete_policy("delete,10s")
    assert is_expired(100.0, 110.5, 10) and not is_expired(100.0, 110.0, 10)
    assert is_eligible(mutable=False, mtime=0, now=100, policy=pol)
    assert not is_eligible(mutable=True, mtime=0, now=10**9, policy=pol)  # never the active one
    assert not is_eligible(mutable=False, mtime=95, now=100, policy=pol)


def _fill(policy: str, path: Path, when: str = "0 0 6,18 * * ?") -> MessageStoreManager:
    cfg = TopicStoreConfig(unflush_threshold=0, delete_policy=policy, delete_when=when)
    m = MessageStoreManager(StoreConfig(str(path), max_segment_size=200), lambda t: cfg)
    m.open()
    m.start()
    plog = m.get_log("t", 0)
    assert plog is not None
    for i in range(12):
        plog.append_sync(batch([b"%02d" % i * 30]), timeout=10)  # 80-byte records, 2 per segment
    return m


def _age(m: MessageStoreManager, seconds: float, keep_last: int = 0) -> None:
    plog = m.get_log("t", 0)
    assert plog is not None
    segs = plog.segments[: len(plog.segments) - keep_last] if keep_last else plog.segments
    for s in segs:
        t = time.time() - seconds
        os.utime(s.path, (t, t))


@pytest.mark.parametrize("policy", ["delete,1h", "archive,1h", "archive,1h,true"])
def test_retention_removes_old_prefix_and_keeps_reads_consistent(
    tmp_path: Path, policy: str
) -> None:
    m = _fill(policy, tmp_path)
    plog = m.get_log("t", 0)
    assert plog is not None
    before = read_all(plog)
    n_segs = len(plog.segments)
    held = plog.read(0, 1000)  # a reader holding a region of the first segment
    _age(m, 7200, keep_last=3)  # all but the last 3 segments are old
    actions = m.run_retention()
    assert len(actions) == n_segs - 3
    assert plog.min_offset == plog.segments[0].start == actions[-1].start + actions[-1].size
    assert read_all(plog) == [r for r in before if r.offset >= plog.min_offset]
    res = plog.read(0, 100)
    assert (res.status, res.offset) == (ReadStatus.OUT_OF_RANGE, plog.min_offset)
    assert held.region is not None and len(held.region.read_bytes()) == held.region.length
    held.region.close()
    kind = {
        "delete,1h": RetentionActionKind.DELETED,
        "archive,1h": RetentionActionKind.ARCHIVED,
    }.get(policy, RetentionActionKind.COMPRESSED)
    assert {a.kind for a in actions} == {kind}
    names = sorted(n for n in os.listdir(tmp_path / "t-0") if n != "highwater")
    if kind is RetentionActionKind.DELETED:
        assert all(n.endswith(".meta") for n in names)
    else:
        suffix = ".meta.arc" if kind is RetentionActionKind.ARCHIVED else ".meta.lz4"
        archived = [n for n in names if n.endswith(suffix)]
        assert len(archived) == len(actions)
        recs = [r for a in actions for r in iter_archived(a.path)]
        assert [(r.offset, r.data) for r in recs] == [
            (r.offset, r.data) for r in before if r.offset < plog.min_offset
        ]
        if kind is RetentionActionKind.COMPRESSED:
            assert file_bytes(actions[0].path)[:4] == b"\x04\x22\x4d\x18"  # lz4 frame magic
        assert len(read_archived(actions[0].path)) == actions[0].size
    # young segments and the active one stay, however old the active one is
    _age(m, 10**7)
    m.run_retention()
    assert len(plog.segments) == 1 and plog.segments[0].mutable
    m.close()
    m2 = MessageStoreManager(
        StoreConfig(str(tmp_path), max_segment_size=200), lambda t: TopicStoreConfig()
    )
    [rep] = m2.open()
    assert rep.min_offset == plog.min_offset  # archives are not loaded back as live segments
    m2.close()


def test_scheduled_retention_runs_on_its_own(tmp_path: Path) -> None:
    m = _fill("delete,1s", tmp_path, when="every 1s")
    plog = m.get_log("t", 0)
    assert plog is not None
    _age(m, 60)
    m.reload_topic_config()  # wake the scheduler
    wait_for(lambda: len(plog.segments) == 1, 20)
    assert plog.min_offset == plog.write_offset - plog.segments[0].written
    m.close()


def test_scheduled_retention_covers_logs_created_after_start(tmp_path: Path) -> None:
    """A partition first written after start() (the broker's usual case) gets its schedule
    without any reload: the scheduler must not sleep forever on an empty schedule."""
    m = _fill("delete,1s", tmp_path, when="every 1s")  # the log is created after start()
    plog = m.get_log("t", 0)
    assert plog is not None
    _age(m, 60)
    wait_for(lambda: len(plog.segments) == 1, 20)
    assert plog.min_offset == plog.write_offset - plog.segments[0].written
    m.close()


def test_reload_topic_config_switches_flush_mode_and_policy(tmp_path: Path) -> None:
    current = {"cfg": TopicStoreConfig(unflush_threshold=10**6, unflush_interval_ms=10**7)}
    m = MessageStoreManager(
        StoreConfig(str(tmp_path), max_segment_size=200), lambda t: current["cfg"]
    )
    m.open()  # flusher not started yet: nothing can flush behind the test's back
    plog = m.get_log("t", 0)
    assert plog is not None
    r = plog.append(batch([b"x" * 50]))  # threshold mode: acked, not yet visible
    assert plog.max_offset == 0
    current["cfg"] = TopicStoreConfig(unflush_threshold=0, delete_policy="delete,1s")
    m.reload_topic_config()  # now group commit: the pending bytes are flushed at once
    m.start()
    wait_for(lambda: plog.max_offset == r.length)
    assert plog.config.group_commit and plog.config.delete_policy == "delete,1s"
    for i in range(6):
        plog.append_sync(batch([b"%d" % i * 60]), timeout=10)
    _age(m, 60)
    assert m.run_retention() and plog.min_offset > 0
    m.close()


def test_a_retention_action_is_logged_as_a_readable_line() -> None:
    action = RetentionAction("t", 1, 4096, 1000, RetentionActionKind.ARCHIVED, "/d/t-1/x.meta.lz4")
    assert action.describe() == (
        "t-1: archived the segment at offset 4096 (1000 bytes): /d/t-1/x.meta.lz4"
    )
