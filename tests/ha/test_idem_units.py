"""Unit tests of the replicated producer state: the master's entries by range (memory, then
the file), a replica adopting them, an async replica paging through full replies, and the
pieces a promoted master cuts a rejoining replica's gap into."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client.protocol import ProducersCommand, ResultReply
from pymetaq.ha.replica import PartitionReplica, ReplicaError
from pymetaq.server import idempotence
from pymetaq.server.idempotence import PartitionProducers, next_piece
from pymetaq.storage.producers import ProducerEntry

A = "aa" * 16
B = "bb" * 16


class _Dir:
    """What PartitionProducers needs of a log until a producer is checked against it."""

    def __init__(self, path: Path) -> None:
        self.directory = str(path)
        self.name = "t-0"


def entry(pid: str, seq: int, offset: int, length: int = 40) -> ProducerEntry:
    return ProducerEntry(pid, seq, 2, 1000 + offset, offset, length)


def producers(path: Path) -> PartitionProducers:
    return PartitionProducers(_Dir(path))  # type: ignore[arg-type]


def test_between_is_by_batch_end_oldest_first_and_capped(tmp_path: Path) -> None:
    p = producers(tmp_path)
    for i in range(6):
        p.adopt(entry(A if i % 2 else B, i // 2, i * 40))
    got = p.between(40, 160, 10)  # batches ending at 80, 120, 160
    assert [e.offset for e in got] == [40, 80, 120]
    assert [e.offset for e in p.between(39, 240, 2)] == [0, 40]  # 0..40 ends past 39
    assert p.between(240, 400, 10) == []


def test_between_reads_the_file_for_ranges_memory_no_longer_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idempotence, "RECENT", 4)
    p = producers(tmp_path)
    for i in range(10):
        p.adopt(entry(A, i, i * 40))
    assert [e.sequence for e in p.between(0, 120, 10)] == [0, 1, 2]  # from the file
    assert [e.sequence for e in p.between(320, 400, 10)] == [8, 9]  # from memory
    p.file.close()
    again = producers(tmp_path)  # loaded: the newest 4 in memory, the rest from the file
    assert [e.sequence for e in again.between(40, 400, 10)] == list(range(1, 10))


def test_adopting_a_sequence_again_replaces_it_and_the_later_ones(tmp_path: Path) -> None:
    p = producers(tmp_path)
    for seq in range(3):
        p.adopt(entry(A, seq, seq * 40))
    p.adopt(entry(A, 1, 120))  # the master failed batch 1 and stored its retry at 120
    assert p.check(A, 2) is None  # batch 2 is the next one again
    dup = p.check(A, 1)
    assert dup is not None and dup.entry.offset == 120


def test_a_rejoining_replicas_gap_sends_each_idempotent_batch_alone(tmp_path: Path) -> None:
    p = producers(tmp_path)
    p.adopt(entry(A, 0, 100))
    p.adopt(entry(B, 0, 140))
    assert next_piece(None, 0, 500, 1000) == (500, None)
    assert next_piece(p, 0, 500, 1000) == (100, None)  # the bytes before the first batch
    assert next_piece(p, 100, 400, 1000) == (40, (A, 0))
    assert next_piece(p, 140, 360, 1000) == (40, (B, 0))
    assert next_piece(p, 180, 320, 1000) == (320, None)  # no batch of a producer after it
    assert next_piece(p, 100, 30, 1000) == (30, None)  # not all of the batch was read


class _Conn:
    """Answers ``producers`` requests from a list of entries, as a master would."""

    def __init__(self, entries: list[ProducerEntry], most: int, honest: bool = True) -> None:
        self.entries, self.most, self.honest = entries, most, honest
        self.asked: list[tuple[int, int]] = []

    def send_request(self, cmd: Any, timeout: float) -> asyncio.Future[Any]:
        assert isinstance(cmd, ProducersCommand)
        self.asked.append((cmd.after, cmd.upto))
        found = [
            e
            for e in self.entries
            if not self.honest or cmd.after < e.offset + e.length <= cmd.upto
        ]
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        body = b"".join(e.encode() for e in found[: self.most])
        fut.set_result(ResultReply(200, body, cmd.opaque))
        return fut


def test_replica_asks_again_past_a_full_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    from pymetaq.ha import replica

    monkeypatch.setattr(replica, "PRODUCERS_MAX_ENTRIES", 3)
    rep = PartitionReplica(
        None,  # type: ignore[arg-type]
        "t",
        0,
        "g",
        fetch_size=1024,
        max_wait_ms=10,
        master_min=0,
        master_max=0,
    )
    entries = [entry(A, i, i * 40) for i in range(7)]
    conn = _Conn(entries, 3)

    async def run() -> list[ProducerEntry]:
        return await rep._entries(conn, rep._ask_entries(conn, 0, 280), 0, 280)

    assert asyncio.run(run()) == entries
    assert conn.asked == [(0, 280), (120, 280), (240, 280)]
    bad = _Conn([entry(A, 0, 400)], 3, honest=False)  # an entry outside the range asked

    async def run_bad() -> list[ProducerEntry]:
        return await rep._entries(bad, rep._ask_entries(bad, 0, 280), 0, 280)

    with pytest.raises(ReplicaError, match="out of range"):
        asyncio.run(run_bad())


def test_compaction_checks_the_size_before_counting_every_producer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """maybe_compact runs after every acknowledged batch: below COMPACT_BYTES it does not
    walk the producers (a walk over 1,000 producers: 52 us per ack); above it, and above four
    times the live entries, it rewrites the file with the live entries only."""
    import collections

    class NoWalk(collections.OrderedDict[str, Any]):
        def values(self) -> Any:
            raise AssertionError("walked the producers below COMPACT_BYTES")

    p = producers(tmp_path)
    for i in range(30):
        p.adopt(entry(A, i, i * 40))
    p._producers = NoWalk(p._producers)
    p.maybe_compact()  # 30 entries: far below COMPACT_BYTES, nothing counted
    p._producers = collections.OrderedDict(p._producers)
    monkeypatch.setattr(idempotence, "COMPACT_BYTES", 10 * 48)
    size = p.file.size
    p.maybe_compact()  # 30 entries written, the last WINDOW live: rewritten
    assert p.file.size < size
    assert [e.sequence for e in p.file.read()] == list(range(30 - idempotence.WINDOW, 30))
