"""Resource attacks on a real broker process, with a well-behaved client measured throughout.

Shared by ``tests/server/test_resources.py`` (which asserts bounds) and ``bench/attacks.py``
(which prints the before/after table).  Every attack runs against a broker subprocess
(``tests._broker.BrokerProcess``) from source address 127.0.0.1; the well-behaved client
(:class:`GoodClient`) connects from 127.0.0.2 (still loopback on Linux, but another IP to the
broker) and, for the whole attack, puts a checksummed message and reads it back, reconnecting
every ``RECONNECT_EVERY`` operations so accepts are exercised too.  A :class:`Sampler` reads the
broker's RSS (``/proc/<pid>/status``) and descriptor count (``/proc/<pid>/fd``) every 20 ms.

:func:`run_attack` returns an :class:`AttackReport`: inputs sent, the attack's own outcome
counts, the good client's acknowledged/lost/corrupt counts, hangs (a request without a reply
within ``GOOD_TIMEOUT_S``), refusals, latency percentiles, RSS and descriptors before / peak /
after, and whether the broker crashed.

Every loop is bounded by a deadline or a count; nothing sleeps to synchronise (the pauses in
the drip attack and the holds are the attack's timing, and the sampler is a measurement).
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire

GOOD_SOURCE = "127.0.0.2"
ATTACK_SOURCE = "127.0.0.1"
GOOD_TIMEOUT_S = 10.0
RECONNECT_EVERY = 25
GOOD_TOPIC = "good"
#: the topics every attack expects (``[topic=...]`` sections of the broker under attack)
TOPICS: dict[str, dict[str, str]] = {
    "good": {},
    "flood": {},
    "big": {},
    "drip": {},
    "auto-*": {},
    "st-*": {"stat": "true"},
}
#: the [system] limits the attacks meet (pymetaq extensions; defaults in server/config.py)
LIMITS: dict[str, int] = {
    "maxAutoCreatedPartitions": 100,
    "requestTimeoutMs": 2000,
    "maxBufferedBodyBytes": 64 << 20,
    "maxConnectionsPerIp": 100,
}
#: RLIMIT_NOFILE the broker starts with: a common soft/hard pair (the broker raises the soft
#: limit to the hard one)
NOFILE = (1024, 4096)


# --------------------------------------------------------------------------- measurement


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except FileNotFoundError:
        return 0


class Sampler(threading.Thread):
    """Samples a process's RSS and descriptor count until stopped; keeps the peaks."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid, self.period_s = pid, period_s
        self.peak_rss_kb = self.peak_fds = 0
        self.fds: list[int] = []  # every sample, for percentiles
        self._stop_event = threading.Event()

    def sample(self) -> tuple[int, int]:
        try:
            rss, fds = rss_kb(self.pid), fd_count(self.pid)
        except (FileNotFoundError, ProcessLookupError):
            return 0, 0
        self.peak_rss_kb = max(self.peak_rss_kb, rss)
        self.peak_fds = max(self.peak_fds, fds)
        self.fds.append(fds)
        return rss, fds

    def run(self) -> None:
        while not self._stop_event.wait(self.period_s):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


# --------------------------------------------------------------------------- connections


def connect(address: tuple[str, int], source: str = ATTACK_SOURCE, timeout: float = 20.0) -> Wire:
    """A blocking connection from ``source`` that parses replies with the codec."""
    return Wire(address, timeout, source)


def put_frame(topic: str, partition: int, data: bytes, opaque: int) -> bytes:
    head = b"put %s %d %d 0 %d %d\r\n" % (
        topic.encode(),
        partition,
        len(data),
        checksum(data),
        opaque,
    )
    return head + data


# --------------------------------------------------------------------------- the good client


class GoodClient(threading.Thread):
    """Put a message, read it back; measure each round trip; reconnect now and then."""

    def __init__(self, address: tuple[str, int], partition: int = 0) -> None:
        super().__init__(daemon=True)
        self.address, self.partition = address, partition
        self.latencies_ms: list[float] = []
        self.acked: dict[int, bytes] = {}  # offset -> data
        self.errors: collections.Counter[str] = collections.Counter()
        self.hangs = 0
        self.corrupt = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        n = 0
        conn: Wire | None = None
        while not self._stop_event.is_set():
            if conn is None or n % RECONNECT_EVERY == 0:
                if conn is not None:
                    conn.close()
                conn = self._connect()
                if conn is None:
                    self._stop_event.wait(0.05)
                    continue
            n += 1
            data = b"good-%d-" % n + b"x" * (n % 64)
            start = time.perf_counter()
            try:
                self._round_trip(conn, data, n)
            except TimeoutError:
                self.hangs += 1
                conn.close()
                conn = None
                continue
            except (OSError, ConnectionError) as exc:
                self.errors[f"connection: {type(exc).__name__}"] += 1
                conn.close()
                conn = None
                continue
            self.latencies_ms.append((time.perf_counter() - start) * 1000)
        if conn is not None:
            conn.close()

    def _connect(self) -> Wire | None:
        try:
            return connect(self.address, GOOD_SOURCE, GOOD_TIMEOUT_S)
        except TimeoutError:
            self.hangs += 1
        except OSError as exc:
            self.errors[f"connect: {type(exc).__name__}"] += 1
        return None

    def _round_trip(self, conn: Wire, data: bytes, n: int) -> None:
        reply = conn.call(put_frame(GOOD_TOPIC, self.partition, data, n))
        if not (isinstance(reply, ResultReply) and reply.code == 200):
            self.errors[f"put {getattr(reply, 'code', 'value')}"] += 1
            return
        offset = int(reply.body.split()[2])
        self.acked[offset] = data
        got = conn.call(
            b"get %s g %d %d 65536 %d\r\n" % (GOOD_TOPIC.encode(), self.partition, offset, n)
        )
        if not isinstance(got, ValueReply):
            self.errors[f"get {got.code}"] += 1
            return
        records = list(iter_records(got.data, offset, verify=False))
        if not records or records[0].data != data:
            self.corrupt += 1

    def stop(self) -> None:
        self._stop_event.set()
        self.join(GOOD_TIMEOUT_S * 3)

    def verify(self) -> tuple[int, int]:
        """(lost, corrupt) over every acknowledged message, read back from offset 0."""
        conn = connect(self.address, GOOD_SOURCE)
        stored: dict[int, bytes] = {}
        offset, bad = 0, 0
        try:
            for op in range(1_000_000):  # bounded: each step advances by >= 1 record
                got = conn.call(
                    b"get %s g %d %d 1048576 %d\r\n"
                    % (GOOD_TOPIC.encode(), self.partition, offset, op)
                )
                if not isinstance(got, ValueReply):
                    break
                try:
                    records = list(iter_records(got.data, offset, verify=True))
                except ValueError:
                    bad += 1
                    break
                if not records:
                    break
                stored.update((r.offset, r.data) for r in records)
                offset = records[-1].offset + records[-1].size
        finally:
            conn.close()
        lost = sum(1 for off in self.acked if off not in stored)
        corrupt = bad + sum(
            1 for off, d in self.acked.items() if off in stored and stored[off] != d
        )
        return lost, corrupt


# --------------------------------------------------------------------------- the report


@dataclass
class AttackReport:
    name: str
    inputs: str
    outcome: dict[str, int] = field(default_factory=dict)
    acked: int = 0
    lost: int = 0
    corrupt: int = 0
    crashed: bool = False
    hangs: int = 0
    good_errors: dict[str, int] = field(default_factory=dict)
    good_ops: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    rss_base_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_after_mb: float = 0.0
    fds_base: int = 0
    fds_peak: int = 0
    fds_p90: int = 0  # held, as opposed to a burst of accepted-then-refused connections
    fds_after: int = 0

    def row(self) -> dict[str, object]:
        return dict(self.__dict__)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


Attack = Callable[[tuple[str, int], Sampler], tuple[str, dict[str, int]]]


def run_attack(
    broker: BrokerProcess, name: str, attack: Attack, settle_s: float = 1.0
) -> AttackReport:
    """Measure ``attack`` against ``broker`` with a good client running alongside."""
    assert broker.proc is not None
    pid = broker.proc.pid
    sampler = Sampler(pid)
    base_rss, base_fds = sampler.sample()
    sampler.peak_rss_kb, sampler.peak_fds = base_rss, base_fds
    good = GoodClient(broker.address)
    good.start()
    sampler.start()
    try:
        inputs, outcome = attack(broker.address, sampler)
    finally:
        good.stop()
    # after the attack's connections are closed: let the broker notice, then sample once more
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        sampler.sample()
        time.sleep(0.05)
    rss_after, fds_after = sampler.sample()
    sampler.stop()
    crashed = broker.proc.poll() is not None
    lost = corrupt = 0
    if not crashed:
        lost, corrupt = good.verify()
    lat = good.latencies_ms
    return AttackReport(
        name=name,
        inputs=inputs,
        outcome=outcome,
        acked=len(good.acked),
        lost=lost,
        corrupt=corrupt + good.corrupt,
        crashed=crashed,
        hangs=good.hangs,
        good_errors=dict(good.errors),
        good_ops=len(lat),
        p50_ms=_pct(lat, 0.5),
        p99_ms=_pct(lat, 0.99),
        max_ms=round(max(lat), 2) if lat else 0.0,
        rss_base_mb=round(base_rss / 1024, 1),
        rss_peak_mb=round(sampler.peak_rss_kb / 1024, 1),
        rss_after_mb=round(rss_after / 1024, 1),
        fds_base=base_fds,
        fds_peak=sampler.peak_fds,
        fds_p90=int(_pct([float(f) for f in sampler.fds], 0.9)),
        fds_after=fds_after,
    )


# --------------------------------------------------------------------------- the attacks


def _codes(conn: Wire, n: int, counts: collections.Counter[str]) -> None:
    for _ in range(n):
        reply = conn.reply()
        counts[str(reply.code) if isinstance(reply, ResultReply) else "value"] += 1


def _pipeline(
    address: tuple[str, int], n: int, window: int, frame: Callable[[int], bytes]
) -> dict[str, int]:
    """Send ``frame(i)`` for i < n in pipelined windows on one connection; count reply codes."""
    counts: collections.Counter[str] = collections.Counter()
    conn = connect(address, timeout=60)
    try:
        for base in range(0, n, window):
            conn.send(b"".join(frame(i) for i in range(base, min(n, base + window))))
            _codes(conn, min(window, n - base), counts)
    finally:
        conn.close()
    return dict(counts)


def pattern_topics(n: int = 2000, window: int = 200) -> Attack:
    """Puts to ``n`` distinct names of the pattern topic ``auto-*`` (one connection)."""

    def attack(address: tuple[str, int], sampler: Sampler) -> tuple[str, dict[str, int]]:
        counts = _pipeline(address, n, window, lambda i: put_frame(f"auto-{i}", 0, b"hello", i))
        return f"{n} puts to distinct auto-* topics", counts

    return attack


def pipelined_gets(n: int = 20_000, hold_s: float = 2.0) -> Attack:
    """One connection pipelines ``n`` gets and does not read for ``hold_s``; then reads all."""

    def attack(address: tuple[str, int], sampler: Sampler) -> tuple[str, dict[str, int]]:
        conn = connect(address, timeout=60)
        counts: collections.Counter[str] = collections.Counter()
        try:
            reply = conn.call(put_frame("flood", 0, b"f" * 100, 1))
            assert isinstance(reply, ResultReply) and reply.code == 200, reply
            frames = b"".join(b"get flood g 0 0 4096 %d\r\n" % (10 + i) for i in range(n))
            sender = threading.Thread(target=conn.send, args=(frames,), daemon=True)
            sender.start()  # the broker may stop reading: send from a thread
            time.sleep(hold_s)  # the attack: do not read the replies for a while
            _codes(conn, n, counts)
            sender.join(30)
        finally:
            conn.close()
        return f"{n} pipelined gets, replies unread for {hold_s:g} s", dict(counts)

    return attack


def unknown_stat_topics(n: int = 60_000, window: int = 2000) -> Attack:
    """Gets for ``n`` distinct names matching the ``stat=true`` pattern ``st-*``."""

    def attack(address: tuple[str, int], sampler: Sampler) -> tuple[str, dict[str, int]]:
        counts = _pipeline(address, n, window, lambda i: b"get st-%d g 0 0 1024 %d\r\n" % (i, i))
        return f"{n} gets for distinct unknown st-* topics", counts

    return attack


def half_bodies(
    k: int = 16, declared: int = 16 << 20, sent: int = 8 << 20, hold_s: float = 2.0
) -> Attack:
    """``k`` connections each declare a ``declared``-byte bput, send ``sent`` bytes, hold."""

    def attack(address: tuple[str, int], sampler: Sampler) -> tuple[str, dict[str, int]]:
        conns = [connect(address, timeout=hold_s + 5) for _ in range(k)]
        chunk = b"\0" * (1 << 20)
        stalled: list[int] = []

        def send(c: Wire) -> None:
            c.sock.sendall(b"bput big 0 %d 1 -1 1\r\n" % declared)
            done = 0
            try:
                while done < sent:
                    c.sock.sendall(chunk[: min(len(chunk), sent - done)])
                    done += min(len(chunk), sent - done)
            except (TimeoutError, OSError):
                stalled.append(done)  # the broker stopped reading this connection

        threads = [threading.Thread(target=send, args=(c,), daemon=True) for c in conns]
        for t in threads:
            t.start()
        time.sleep(hold_s)  # the attack: hold the half-sent bodies
        sampler.sample()
        for c in conns:
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
        for t in threads:
            t.join(10)
        return (
            f"{k} connections x {sent >> 20} MiB of a {declared >> 20} MiB bput, held {hold_s:g} s",
            {"stalled_senders": len(stalled)},
        )

    return attack


def drip(n: int = 1030, period_s: float = 2.0, duration_s: float = 6.0) -> Attack:
    """``n`` connections each dripping one byte of a put line every ``period_s``."""

    def attack(address: tuple[str, int], sampler: Sampler) -> tuple[str, dict[str, int]]:
        socks: list[socket.socket] = []
        counts: collections.Counter[str] = collections.Counter()
        line = b"put drip 0 5 0 -1 123456789\r\nhello"
        try:
            for _ in range(n):
                try:
                    s = socket.create_connection(
                        address, timeout=5, source_address=(ATTACK_SOURCE, 0)
                    )
                except OSError:
                    counts["connect_failed"] += 1
                    continue
                s.setblocking(False)
                socks.append(s)
            pos = 0
            deadline = time.monotonic() + duration_s
            while time.monotonic() < deadline:
                for s in list(socks):
                    try:
                        s.send(line[pos % len(line) : pos % len(line) + 1])
                    except BlockingIOError:
                        pass
                    except OSError:
                        counts["closed_by_broker"] += 1
                        socks.remove(s)
                        s.close()
                pos += 1
                time.sleep(period_s)  # the attack's pace
            for s in socks:  # still open at the end?
                counts["open_at_end" if _still_open(s) else "closed_by_broker"] += 1
        finally:
            for s in socks:
                s.close()
        return f"{n} connections dripping a byte every {period_s:g} s for {duration_s:g} s", dict(
            counts
        )

    return attack


def _still_open(s: socket.socket) -> bool:
    """A non-blocking socket the broker has not closed (replies, if any, are drained)."""
    for _ in range(100):
        try:
            if s.recv(65536) == b"":
                return False
        except BlockingIOError:
            return True
        except OSError:
            return False
    return True
