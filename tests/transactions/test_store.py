"""The transaction store in-process: the commit protocol, recovery's exactly-once cases,
relog + checkpoint + deletion, pending commits."""

from __future__ import annotations

import os
from pathlib import Path

from pymetaq.storage import TopicStoreConfig
from pymetaq.storage.txjournal import CommitResult, HeldState, JournalPos, Outcome
from pymetaq.storage.txjournal.format import Commit, PartIntent, encode
from tests.transactions._store import Env, abandon, close, open_env, read_records


def commit(env: Env, tx: object) -> tuple[CommitResult | None, BaseException | None]:
    """Commit and wait until the outcome is final (acknowledged, then durable in the logs)."""
    out: list[tuple[CommitResult | None, BaseException | None]] = []
    env.store.commit(tx, lambda r, e: out.append((r, e)))  # type: ignore[arg-type]
    env.drain(lambda: out and (out[0][1] is not None or tx.state is HeldState.DONE))  # type: ignore[attr-defined]
    return out[0]


def write_intent_only(env: Env, tx: object) -> list[bytes]:
    """Journal and fsync a COMMIT record for ``tx`` without appending (a crash right after)."""
    recs = tx.parts[("t", 0)]  # type: ignore[attr-defined]
    buf = b"".join(recs)
    import zlib

    plog = env.log("t", 0)
    intent = PartIntent("t", 0, plog.write_offset, len(recs), len(buf), zlib.crc32(buf))
    env.store.journal.append(encode(Commit(tx.tid, False, (intent,))))  # type: ignore[attr-defined]
    env.store.journal.force()
    return list(recs)


def test_commit_appends_each_partition_contiguously_with_put_time_ids(tmp_path: Path) -> None:
    env = open_env(str(tmp_path))
    tx = env.store.begin("TX:s:1", False)
    recs = [env.record(b"m%d" % i) for i in range(5)]
    for i, r in enumerate(recs):
        env.store.add(tx, "t", i % 2, r)
    env.log("t", 0).append_sync(bytearray(env.record(b"plain")))
    result, exc = commit(env, tx)
    assert exc is None and result is not None
    assert sorted(result.ranges) == [("t", 0, 25, 3), ("t", 1, 0, 2)]
    got0 = [r.data for r in read_records(env.log("t", 0))]
    assert got0 == [b"plain", b"m0", b"m2", b"m4"]
    assert [r.msg_id for r in read_records(env.log("t", 1))] == [
        int.from_bytes(recs[i][8:16], "big") for i in (1, 3)
    ]
    assert tx.state is HeldState.DONE and env.store.held_bytes == 0
    close(env)


def test_intent_without_append_is_applied_once_at_restart(tmp_path: Path) -> None:
    env = open_env(str(tmp_path))
    tx = env.store.begin("TX:s:1", False)
    for i in range(3):
        env.store.add(tx, "t", 0, env.record(b"i%d" % i))
    recs = write_intent_only(env, tx)
    abandon(env)
    env = open_env(str(tmp_path))
    assert env.recovery.committed["appended"] == 1
    assert [bytes(r.data) for r in read_records(env.log("t", 0))] == [b"i0", b"i1", b"i2"]
    assert [r.msg_id for r in read_records(env.log("t", 0))] == [
        int.from_bytes(r[8:16], "big") for r in recs
    ]
    abandon(env)
    env = open_env(str(tmp_path))  # a second restart finds it present: nothing twice
    assert env.recovery.committed["present"] + env.recovery.committed["appended"] == 0
    assert len(read_records(env.log("t", 0))) == 3
    close(env)


def test_a_torn_append_is_completed_not_duplicated(tmp_path: Path) -> None:
    env = open_env(str(tmp_path))
    tx = env.store.begin("TX:s:1", False)
    for i in range(4):
        env.store.add(tx, "t", 0, env.record(b"p%d" % i))
    recs = write_intent_only(env, tx)
    env.log("t", 0).append_sync(bytearray(b"".join(recs[:2])), stamp_ids=False)  # half of it
    abandon(env)
    env = open_env(str(tmp_path))
    assert env.recovery.committed["completed"] == 1
    assert [r.data for r in read_records(env.log("t", 0))] == [b"p0", b"p1", b"p2", b"p3"]
    close(env)


def test_a_whole_append_without_applied_record_is_found(tmp_path: Path) -> None:
    env = open_env(str(tmp_path))
    tx = env.store.begin("TX:s:1", False)
    env.store.add(tx, "t", 0, env.record(b"whole"))
    recs = write_intent_only(env, tx)
    env.log("t", 0).append_sync(bytearray(env.record(b"other")))
    env.log("t", 0).append_sync(bytearray(b"".join(recs)), stamp_ids=False)
    abandon(env)
    env = open_env(str(tmp_path))
    assert env.recovery.committed["present"] == 1
    assert [r.data for r in read_records(env.log("t", 0))] == [b"other", b"whole"]
    close(env)


def test_a_range_deleted_by_retention_is_not_reapplied(tmp_path: Path) -> None:
    topic = TopicStoreConfig(num_partitions=1, unflush_threshold=0, delete_policy="delete,0")
    env = open_env(str(tmp_path), topic=topic, segment=4096)
    tx = env.store.begin("TX:s:1", False)
    env.store.add(tx, "t", 0, env.record(b"old"))
    recs = write_intent_only(env, tx)
    plog = env.log("t", 0)
    plog.append_sync(bytearray(b"".join(recs)), stamp_ids=False)
    for _ in range(12):
        plog.append_sync(bytearray(env.record(b"x" * 1000)))
    env.manager.run_retention(now=2**40)
    assert plog.min_offset > 0
    abandon(env)
    env = open_env(str(tmp_path), topic=topic, segment=4096)
    assert env.recovery.committed["expired"] == 1
    assert b"old" not in [r.data for r in read_records(env.log("t", 0))]
    close(env)


def test_restart_rolls_back_open_restores_prepared_and_heuristics(tmp_path: Path) -> None:
    env = open_env(str(tmp_path))
    local = env.store.begin("TX:s:1", False)
    env.store.add(local, "t", 0, env.record(b"open"))
    xa = env.store.begin("XID:1:aa:bb:q", True)
    env.store.add(xa, "t", 1, env.record(b"prepared"))
    done: list[BaseException | None] = []
    env.store.prepare(xa, done.append)
    env.drain(lambda: done)
    decided = env.store.begin("XID:1:cc:dd:q", True)
    env.store.add(decided, "t", 1, env.record(b"decided"))
    env.store.prepare(decided, done.append)
    env.drain(lambda: len(done) == 2)
    assert commit(env, decided)[1] is None
    env.store.heuristic("XID:1:cc:dd:q", Outcome.COMMIT, done.append)
    env.drain(lambda: len(done) == 3)
    abandon(env)
    env = open_env(str(tmp_path))
    assert env.recovery.rolled_back == 1
    assert [t.key for t in env.recovery.prepared] == ["XID:1:aa:bb:q"]
    assert env.recovery.prepared[0].parts[("t", 1)][0].endswith(b"prepared")
    assert list(env.store.heuristics) == ["XID:1:cc:dd:q"]
    assert [r.data for r in read_records(env.log("t", 1))] == [b"decided"]
    assert read_records(env.log("t", 0)) == []
    close(env)


def test_checkpoint_relogs_live_transactions_and_deletes_old_files(tmp_path: Path) -> None:
    env = open_env(str(tmp_path), file_size=4096)
    keep = env.store.begin("XID:1:01:02:q", True)
    env.store.add(keep, "t", 0, env.record(b"held-for-long"))
    done: list[BaseException | None] = []
    env.store.prepare(keep, done.append)
    env.drain(lambda: done)
    for n in range(40):  # enough traffic to roll several files
        tx = env.store.begin(f"TX:s:{n}", False)
        env.store.add(tx, "t", 1, env.record(b"y" * 300))
        assert commit(env, tx)[1] is None
    assert len(env.store.journal.files()) > 2
    job = env.store.checkpoint_begin()
    assert job is not None
    job.run()
    env.store.checkpoint_end(job, None)
    files = env.store.journal.files()
    assert len(files) == 1 and keep.first is not None and keep.first.file == files[0]
    assert sorted(os.listdir(tmp_path / "transactions")) == [
        "checkpoint.1",
        "checkpoint.2",
        f"redo.{files[0]}",
    ]
    abandon(env)
    env = open_env(str(tmp_path), file_size=4096)
    assert [t.key for t in env.recovery.prepared] == ["XID:1:01:02:q"]
    assert env.recovery.replay.checkpoint == JournalPos(files[0], job.position.offset)
    assert len(read_records(env.log("t", 1))) == 40
    close(env)


def test_a_commit_whose_append_fails_is_pending_and_finished_at_restart(tmp_path: Path) -> None:
    env = open_env(str(tmp_path))
    tx = env.store.begin("TX:s:1", False)
    env.store.add(tx, "t", 0, env.record(b"later"))
    env.log("t", 0).close()  # the append will raise LogClosed
    result, exc = commit(env, tx)
    assert result is None and exc is not None
    assert tx.state is HeldState.COMMITTING and env.store.retry_pending() == 1
    abandon(env)
    env = open_env(str(tmp_path))
    assert env.recovery.committed["appended"] == 1
    assert [r.data for r in read_records(env.log("t", 0))] == [b"later"]
    close(env)


def test_ack_timing_follows_flush_tx_log_at_commit(tmp_path: Path) -> None:
    """1: acknowledged once the COMMIT record is fsynced and the appends are written (the
    journal can redo them); 0: only once the partition appends are durable (MetaQ)."""
    for flush in (1, 0):
        env = open_env(str(tmp_path / str(flush)), flush=flush)
        assert _state_at_ack(env) is (HeldState.COMMITTING if flush == 1 else HeldState.DONE)
        assert [r.data for r in read_records(env.log("t", 0))] == [b"m"]
        close(env)


def _state_at_ack(env: Env) -> HeldState:
    tx = env.store.begin("TX:s:1", False)
    env.store.add(tx, "t", 0, env.record(b"m"))
    states: list[HeldState] = []
    env.store.commit(tx, lambda r, e: states.append(tx.state))
    env.drain(lambda: states and tx.state is HeldState.DONE)
    return states[0]


def test_an_interrupted_heuristic_decision_is_carried_out_at_restart(tmp_path: Path) -> None:
    env = open_env(str(tmp_path))
    done: list[BaseException | None] = []
    branches = {}
    for name, outcome in (("aa", Outcome.COMMIT), ("bb", Outcome.ROLLBACK)):
        tx = env.store.begin(f"XID:1:{name}:01:q", True)
        env.store.add(tx, "t", 0, env.record(name.encode()))
        env.store.prepare(tx, done.append)
        env.store.heuristic(tx.key, outcome, done.append)  # the decision is journaled ...
        branches[tx.key] = outcome
        env.drain(lambda: len(done) == 2 * len(branches))
    abandon(env)  # ... and the broker dies before carrying it out
    env = open_env(str(tmp_path))
    assert env.recovery.heuristics_completed == 2 and env.recovery.prepared == []
    assert [r.data for r in read_records(env.log("t", 0))] == [b"aa"]
    assert {k: h.outcome for k, h in env.store.heuristics.items()} == branches
    close(env)


def test_a_torn_range_is_completed_before_later_journaled_commits_are_appended(
    tmp_path: Path,
) -> None:
    """Two commits reached the partition in the other order than their intents reached the
    journal, and a power loss cut the first one's range: recovery completes that range in place
    before it appends the other transaction (seen once in test_power_loss's threshold loop)."""
    env = open_env(str(tmp_path))
    a = env.store.begin("TX:s:1", False)
    b = env.store.begin("TX:s:2", False)
    for i in range(4):
        env.store.add(a, "t", 0, env.record(b"a%d" % i))
    env.store.add(b, "t", 0, env.record(b"b0"))
    write_intent_only(env, b)  # b's intent first in the journal ...
    recs = write_intent_only(env, a)
    env.log("t", 0).append_sync(bytearray(b"".join(recs[:2])), stamp_ids=False)  # ... a's first
    abandon(env)
    env = open_env(str(tmp_path))
    assert env.recovery.committed["completed"] == 1 and env.recovery.committed["appended"] == 1
    assert [r.data for r in read_records(env.log("t", 0))] == [b"a0", b"a1", b"a2", b"a3", b"b0"]
    close(env)
