"""Load and ground truth for the monitoring tests: raw MetaQ puts and gets whose offsets the test
knows exactly, a background producer, ``stats``/``/metrics`` readers.

``Ledger`` records every acknowledged put (offset, size, msg id) per partition, so the truth of
any lag is computable: end = offset + size of the last record; the record starting at an
offset gives the age of the first message not fetched.  ``RawGroup`` is MetaQ's wire ``get``
on a socket: it fetches a partition from an offset, walks the records it got (complete ones
only, as MetaQ's MessageIterator) and remembers the offset of its last get.
"""

from __future__ import annotations

import random
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.ids import id_time_ms
from tests._helpers import wait_for
from tests.server._helpers import Wire, put_line

HEADER = struct.Struct(">iiqi")


@dataclass
class Ledger:
    """Acknowledged puts per (topic, partition): offset -> (size on disk, msg id)."""

    records: dict[tuple[str, int], dict[int, tuple[int, int]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, topic: str, partition: int, offset: int, data_len: int, msg_id: int) -> None:
        with self.lock:
            self.records.setdefault((topic, partition), {})[offset] = (20 + data_len, msg_id)

    def end(self, topic: str, partition: int) -> int:
        with self.lock:
            recs = self.records.get((topic, partition), {})
            return max((o + s for o, (s, _) in recs.items()), default=0)

    def count(self, topic: str, partition: int) -> int:
        with self.lock:
            return len(self.records.get((topic, partition), {}))

    def nbytes(self, topic: str, partition: int) -> int:
        with self.lock:
            return sum(s for s, _ in self.records.get((topic, partition), {}).values())

    def born(self, topic: str, partition: int, offset: int) -> float:
        """Epoch seconds of the record starting at ``offset`` (from its acknowledged id)."""
        with self.lock:
            _, msg_id = self.records[(topic, partition)][offset]
        return id_time_ms(msg_id) / 1000.0


def put(wire: Wire, ledger: Ledger, topic: str, partition: int, data: bytes, opaque: int) -> None:
    reply = wire.call(put_line(topic, partition, data, opaque))
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    msg_id, part, offset = (int(x) for x in reply.body.split())
    assert part == partition
    ledger.add(topic, partition, offset, len(data), msg_id)


def fill(
    address: tuple[str, int],
    ledger: Ledger,
    topic: str,
    partitions: int,
    n: int,
    rng: random.Random,
) -> None:
    """``n`` puts of random sizes, round-robin over the partitions."""
    with Wire(address) as w:
        for i in range(n):
            put(w, ledger, topic, i % partitions, rng.randbytes(rng.randrange(10, 300)), i + 1)


class Producer(threading.Thread):
    """Background puts to ``topic`` until stopped (bounded: at most ``limit`` puts)."""

    def __init__(self, address: tuple[str, int], ledger: Ledger, topic: str, partitions: int,
                 seed: int, limit: int = 200_000) -> None:  # fmt: skip
        super().__init__(daemon=True, name=f"producer-{topic}")
        self.address, self.ledger, self.topic, self.partitions = address, ledger, topic, partitions
        self.rng = random.Random(seed)
        self.limit = limit
        self.stopping = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Wire(self.address) as w:
                while not self.stopping.is_set() and self.sent < self.limit:
                    data = self.rng.randbytes(self.rng.randrange(50, 500))
                    put(
                        w, self.ledger, self.topic, self.sent % self.partitions, data, self.sent + 1
                    )
                    self.sent += 1
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        assert not self.is_alive() and self.error is None, self.error


class RawGroup:
    """A consumer group speaking MetaQ's 7-token ``get`` on a plain socket."""

    def __init__(self, address: tuple[str, int], group: str) -> None:
        self.wire = Wire(address)
        self.group = group
        self.next: dict[tuple[str, int], int] = {}  # where the next get starts
        self.last_get: dict[tuple[str, int], int] = {}  # offset of the latest get
        self.bytes_got: dict[tuple[str, int], int] = {}
        self._opaque = 0

    def fetch(self, topic: str, partition: int, max_size: int = 4096) -> int:
        """One get at the current position; advances past the complete records; records got."""
        key = (topic, partition)
        offset = self.next.get(key, 0)
        self._opaque += 1
        line = b"get %s %s %d %d %d %d\r\n" % (
            topic.encode(), self.group.encode(), partition, offset, max_size, self._opaque
        )  # fmt: skip
        reply = self.wire.call(line)
        self.last_get[key] = offset
        if isinstance(reply, ResultReply):
            assert reply.code == 404, reply  # nothing there yet
            return 0
        assert isinstance(reply, ValueReply)
        self.bytes_got[key] = self.bytes_got.get(key, 0) + len(reply.data)
        pos, n = 0, 0
        while pos + 20 <= len(reply.data):
            length = HEADER.unpack_from(reply.data, pos)[0]
            if pos + 20 + length > len(reply.data):
                break
            pos += 20 + length
            n += 1
        self.next[key] = offset + pos
        return n

    def close(self) -> None:
        self.wire.close()


# -- what the broker says -----------------------------------------------------------------------


@dataclass(frozen=True)
class LagLine:
    group: str
    topic: str
    partition: int
    fetch_offset: int
    max_offset: int
    lag_bytes: int
    lag_seconds: float | None
    idle_seconds: float


def stats_lag(wire: Wire) -> dict[tuple[str, str, int], LagLine]:
    reply = wire.call(b"stats lag 77\r\n")
    assert isinstance(reply, ResultReply) and reply.code == 200
    lines = reply.body.decode().split("\r\n")
    assert lines[0] == "STATS" and lines[-2:] == ["END", ""], lines
    out = {}
    for line in lines[1:-2]:
        t = line.split(" ")
        assert [t[2], t[4], t[6], t[8], t[10], t[12]] == [
            "part", "fetch_offset", "max_offset", "lag_bytes", "lag_seconds", "idle_seconds"
        ], line  # fmt: skip
        lag_s = None if t[11] == "unknown" else float(t[11])
        row = LagLine(t[0], t[1], int(t[3]), int(t[5]), int(t[7]), int(t[9]), lag_s, float(t[13]))
        out[(row.group, row.topic, row.partition)] = row
    return out


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``/metrics`` parsed by prometheus_client: sample name -> sorted labels -> value."""
    with urllib.request.urlopen(url + "metrics", timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = reply.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def labels(**kw: object) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in kw.items()))


def settle(cond: object, what: str, timeout: float = 30.0) -> None:
    """``wait_for`` with the monitoring tests' default timeout."""
    wait_for(cond, timeout, what)  # type: ignore[arg-type]


def within(value: float | None, lo: float, hi: float, slack: float = 0.05) -> bool:
    return value is not None and lo - slack <= value <= hi + slack


def each_key(ledger: Ledger) -> Iterator[tuple[str, int]]:
    with ledger.lock:
        keys = list(ledger.records)
    yield from sorted(keys)


def now() -> float:
    return time.time()
