"""Helpers of the client-side transaction tests: reading what a real broker holds, and a TCP
tap that records what the client writes.

- :func:`open_transactions` — ``stats transactions`` of a broker, as ``{key: state}``;
- :func:`stored` — every record of a topic's partitions, ``[(partition, Record)]``;
- :func:`counters` — the general ``stats`` counters (``tx_begin``...);
- :class:`Tap` — a relay between a client and a real broker that records each connection's
  client-to-broker bytes (the client's exact requests), so a test can compare them with the
  bytes MetaQ's Java client writes. It forwards everything unchanged, in both directions.
"""

from __future__ import annotations

import re
import socket
import threading
from typing import Self

from pymetaq.client.transport.servers import parse_stats
from pymetaq.storage.record import Record
from tests.transactions._txwire import Wire, read_log


def open_transactions(address: tuple[str, int]) -> dict[str, str]:
    with Wire(address) as w:
        body = w.call(b"stats transactions 1\r\n").body.decode()
    out = {}
    for line in body.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1] == "state":
            out[parts[0]] = parts[2]
    return out


def counters(address: tuple[str, int]) -> dict[str, int]:
    with Wire(address) as w:
        stats = parse_stats(w.call(b"stats  1\r\n").body)
    return {k: int(v) for k, v in stats.items() if v.isdigit()}


def stored(address: tuple[str, int], topic: str, partitions: int) -> list[tuple[int, Record]]:
    return [(p, r) for p in range(partitions) for r in read_log(address, topic, p)]


def values(address: tuple[str, int], topic: str, partitions: int) -> list[bytes]:
    return [r.data for _, r in stored(address, topic, partitions)]


class Tap:
    """``meta://127.0.0.1:<tap.port>`` relays to ``target`` and records the requests."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.requests: list[bytearray] = []  # one per accepted connection, in accept order
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._run, daemon=True)
        self._accept.start()

    @property
    def url(self) -> str:
        return f"meta://127.0.0.1:{self.port}"

    def _run(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            record = bytearray()
            with self._lock:
                self.requests.append(record)
                self._socks += [client, upstream]
            for src, dst, rec in ((client, upstream, record), (upstream, client, None)):
                t = threading.Thread(target=_pump, args=(src, dst, rec, self._lock), daemon=True)
                t.start()
                self._threads.append(t)

    def lines(self, pattern: str = r"^transaction ") -> list[str]:
        """Every request line (all connections, each in order) matching ``pattern``."""
        with self._lock:
            raw = [bytes(r) for r in self.requests]
        return [t for data in raw for t in frames(data) if re.search(pattern, t)]

    def close(self) -> None:
        self.server.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def frames(data: bytes) -> list[str]:
    """The command lines of a client's byte stream (``put``/``bput`` bodies skipped)."""
    out, pos = [], 0
    while (end := data.find(b"\r\n", pos)) >= 0:
        line = data[pos:end].decode("latin-1")
        out.append(line)
        pos = end + 2
        tokens = line.split(" ")
        if tokens[0] in ("put", "bput") and len(tokens) > 3:
            pos += int(tokens[3])
    return out


def _pump(
    src: socket.socket, dst: socket.socket, record: bytearray | None, lock: threading.Lock
) -> None:
    try:
        while chunk := src.recv(1 << 16):
            if record is not None:
                with lock:
                    record += chunk
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


# -- the queue and the database agree ----------------------------------------------------------
def order_messages(address: tuple[str, int], topic: str, partitions: int) -> dict[int, list[int]]:
    """``b"order-<id>#<i>"`` messages of the topic: order id -> the ``i``\\ s, as stored."""
    out: dict[int, list[int]] = {}
    for _, r in stored(address, topic, partitions):
        head, _, i = r.data.decode().partition("#")
        out.setdefault(int(head.removeprefix("order-")), []).append(int(i))
    return out


def order_rows(url: str) -> set[int]:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return set(conn.exec_driver_sql("SELECT id FROM orders").scalars())
    finally:
        engine.dispose()


def prepared_gids(url: str) -> list[str]:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return list(conn.exec_driver_sql("SELECT gid FROM pg_prepared_xacts").scalars())
    finally:
        engine.dispose()


def assert_agree(rows: set[int], msgs: dict[int, list[int]], per_order: dict[int, int]) -> None:
    """Each order's row and all its messages exist, or none of them; no message twice."""
    for oid in rows | set(msgs):
        got = msgs.get(oid, [])
        assert len(got) == len(set(got)), f"order {oid}: a message appears twice: {got}"
        if oid in rows:
            assert sorted(got) == list(range(per_order[oid])), f"order {oid}: row, messages {got}"
        else:
            assert not got, f"order {oid}: messages {got} without its row"
