"""Power loss with a fault-injecting disk: unsynced writes dropped, the last one torn.

Group commit: every acknowledged record survives.  Threshold mode (N messages / T ms): an
append is acknowledged at once only while that leaves fewer than N acknowledged-but-unflushed
messages (else at its fsync), so at most **N - 1** acknowledged messages are lost, and nothing
acknowledged more than T ms (on the flusher's clock) before the crash is lost.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from pymetaq.storage import (
    AppendResult,
    MessageStoreManager,
    PartitionLog,
    StoreConfig,
    TopicStoreConfig,
)
from tests.storage._helpers import abandon, batch, read_all
from tests.storage.faultdisk import FaultDisk

SEG = 4096


def _open(
    path: str, disk: object, threshold: int, interval_ms: int = 10_000
) -> MessageStoreManager:
    cfg = TopicStoreConfig(unflush_threshold=threshold, unflush_interval_ms=interval_ms)
    m = MessageStoreManager(StoreConfig(path, max_segment_size=SEG), lambda t: cfg, disk=disk)  # type: ignore[arg-type]
    m.open()
    return m


def _payload(rng: random.Random) -> bytes:
    return rng.randbytes(rng.randrange(1, 200))


def _producer(
    plog: PartitionLog,
    prng: random.Random,
    stop: threading.Event,
    lock: threading.Lock,
    acked: dict[int, bytes],
) -> None:
    """Append until stopped; record every acknowledged record's (offset -> data)."""
    while not stop.is_set():
        payloads = [_payload(prng) for _ in range(prng.randrange(1, 5))]

        def cb(r: AppendResult, e: BaseException | None, payloads: list[bytes] = payloads) -> None:
            if e is None:
                with lock:
                    pos = r.offset
                    for p in payloads:
                        acked[pos] = p
                        pos += 20 + len(p)

        try:
            plog.append(batch(payloads), on_durable=cb)
        except Exception:
            return  # the disk died under us: the power is out


@pytest.mark.parametrize("rounds", [25])
def test_group_commit_every_ack_survives_power_loss(tmp_path: Path, seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path)
    acked: dict[int, bytes] = {}  # offset -> data of every acknowledged record
    for _ in range(rounds):
        disk = FaultDisk(random.Random(rng.random()))
        m = _open(path, disk, threshold=0)
        m.start()
        assert all(r.gap is None and r.fenced is None for r in m.recovery_reports)
        plog = m.get_log("t", 0)
        assert plog is not None
        # everything acknowledged before is still here, intact
        got = {r.offset: r.data for r in read_all(plog)}
        assert all(got.get(o) == d for o, d in acked.items())
        lock = threading.Lock()
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=_producer, args=(plog, random.Random(rng.random()), stop, lock, acked)
            )
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        target = disk.syncs + rng.randrange(1, 12)
        while disk.syncs < target:  # crash after a random number of fsyncs
            threading.Event().wait(0.0005)
        disk.crash()
        stop.set()
        for t in threads:
            t.join()
        abandon(m)
    m = _open(path, FaultDisk(rng), threshold=0)
    m.start()
    assert all(r.gap is None and r.fenced is None for r in m.recovery_reports)
    plog = m.get_log("t", 0)
    assert plog is not None
    got = {r.offset: r.data for r in read_all(plog)}
    missing = [o for o, d in acked.items() if got.get(o) != d]
    assert not missing and len(acked) > 0
    m.close()


def test_threshold_mode_loses_at_most_n_messages(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    n = 8
    for round_ in range(15):
        path = str(tmp_path / f"r{round_}")
        disk = FaultDisk(random.Random(rng.random()))
        m = _open(path, disk, threshold=n, interval_ms=60_000)
        m.start()
        plog = m.get_log("t", 0)
        assert plog is not None
        acked: list[tuple[int, bytes]] = []  # (offset, data) of every acknowledged record
        lock = threading.Lock()
        for _ in range(rng.randrange(1, 80)):
            ps = [_payload(rng) for _ in range(rng.choice([1, 1, 1, 2, 3, n]))]

            def cb(
                r: AppendResult,
                e: BaseException | None,
                ps: list[bytes] = ps,
                acked: list[tuple[int, bytes]] = acked,
                lock: threading.Lock = lock,
            ) -> None:
                if e is None:  # at once, or from the flusher at the covering fsync
                    with lock:
                        pos = r.offset
                        for p in ps:
                            acked.append((pos, p))
                            pos += 20 + len(p)

            plog.append(batch(ps), on_durable=cb)
        disk.crash()
        abandon(m)  # joins the flusher: no callback runs after this
        acked.sort()
        m2 = _open(path, FaultDisk(rng), threshold=n)
        m2.start()
        p2 = m2.get_log("t", 0)
        assert p2 is not None
        got = {r.offset: r.data for r in read_all(p2)}
        lost = [o for o, d in acked if got.get(o) != d]
        assert len(lost) <= n - 1, (len(lost), n)
        # what survives is a prefix of what was acknowledged
        assert lost == [o for o, _ in acked[len(acked) - len(lost) :]]
        m2.close()


def test_threshold_mode_interval_bound_on_the_flusher_clock(tmp_path: Path, seed: int) -> None:
    """Drive the flusher by hand with a fake clock: T = 100 ms, N = huge."""
    rng = random.Random(seed)
    for round_ in range(10):
        path = str(tmp_path / f"r{round_}")
        disk = FaultDisk(random.Random(rng.random()))
        m = _open(path, disk, threshold=10**9, interval_ms=100)  # flusher thread not started
        plog = m.get_log("t", 0)
        assert plog is not None
        now_ms = 1_000_000
        m._flusher.run_once(now_ms / 1000)

        def advance(to_ms: int, m: MessageStoreManager = m) -> None:
            nonlocal now_ms  # the flusher thread would wake every ms on the fake clock
            while now_ms < to_ms:
                now_ms += 1
                m._flusher.run_once(now_ms / 1000)

        acked: list[tuple[int, int, bytes]] = []
        for _ in range(rng.randrange(1, 60)):
            advance(now_ms + rng.choice([0, 10, 30, 70]))
            p = _payload(rng)
            r = plog.append(batch([p]))
            acked.append((now_ms, r.offset, p))
        crash_at = now_ms + rng.choice([0, 50, 100, 101, 150])
        advance(crash_at)
        disk.crash()
        abandon(m)
        m2 = _open(path, FaultDisk(rng), threshold=10**9)
        m2.start()
        p2 = m2.get_log("t", 0)
        assert p2 is not None
        got = {r.offset: r.data for r in read_all(p2)}
        for t, off, p in acked:
            if crash_at - t >= 100:  # acknowledged at least T before the crash: durable
                assert got.get(off) == p, (t, crash_at)
        m2.close()
