"""The client cases of ``bench/transactions.py``: the same work through pymetaq's client.

* ``client send``: ``Producer.send`` (waits for each ack: the broker's group-commit fsync);
  ``client send_async x1000``: 1000 ``send_async`` then every result (pipelined: the peer of
  the ``x1000 async`` transaction cases);
* ``local xk``: ``with producer.transaction(): k x producer.send(...)``, then ``tx.commit()``
  (each send waits for its answer, as MetaQ's Java producer does; ``async``: ``send_async``,
  pipelined, the commit waits for the answers);
* ``XA+PG xk``: ``with coordinator.transaction() as g:`` one row INSERT into PostgreSQL and
  ``k`` sends, then the two-phase commit of both (END, PREPARE on the broker and in
  PostgreSQL, the decision log's fsync, COMMIT_TWO_PHASE, COMMIT PREPARED); ``x1000 async``:
  the sends are ``send_async`` (pipelined, the commit waits for the answers).

``--clients`` threads share one producer (one connection for plain sends; each open
transaction has its own). Commit latency: ``tx.commit()`` for local transactions, the block's
exit (the whole two-phase commit) for XA. Without ``--pg-url`` a throw-away PostgreSQL from
``tests/_services.py`` is started — it runs with ``fsync=off`` (a test server), so the
database's share of the XA commit is lower than on a durable server.

Thread-safety: each case runs its threads and joins them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CLIENT_CASES = [
    ("client send", "plain", 1),
    ("client send_async x1000", "plain-async", 1000),
    ("local x1000 async", "local-async", 1000),
    ("XA+PG x1000 async", "xa-async", 1000),
    ("local x1", "local", 1),
    ("local x10", "local", 10),
    ("local x100", "local", 100),
    ("local x100 async", "local-async", 100),
    ("XA+PG x1", "xa", 1),
    ("XA+PG x10", "xa", 10),
    ("XA+PG x100", "xa", 100),
]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


class Out:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.commit: list[float] = []
        self.tx: list[float] = []
        self.msgs = 0

    def add(self, commit: float, whole: float, msgs: int) -> None:
        with self.lock:
            self.commit.append(commit)
            self.tx.append(whole)
            self.msgs += msgs


def run_threads(clients: int, seconds: float, body: Callable[[int, Out], None]) -> dict[str, float]:
    out = Out()
    stop_at = time.perf_counter() + seconds
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            while time.perf_counter() < stop_at:
                body(n, out)
        except BaseException as e:  # reported after the join
            errors.append(e)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    wall = time.perf_counter() - start
    return {
        "msgs_per_s": out.msgs / wall,
        "commit_p50_ms": _pct(out.commit, 0.50),
        "commit_p99_ms": _pct(out.commit, 0.99),
        "tx_p50_ms": _pct(out.tx, 0.50),
        "tx_p99_ms": _pct(out.tx, 0.99),
        "requests": float(len(out.commit)),
    }


@contextlib.contextmanager
def postgres(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from tests import _helpers
    from tests._services import PostgresServer

    _helpers.set_current_test("bench", True)
    with PostgresServer(max_prepared_transactions=64) as pg:
        yield pg.url_for(pg.create_database())


def run_client_cases(
    port: int, workdir: Path, clients: int, seconds: float, payload: bytes, pg_url: str | None
) -> Iterator[tuple[str, int, dict[str, float]]]:
    import sqlalchemy as sa

    from pymetaq.client import Producer
    from pymetaq.client.transaction import Coordinator

    server = f"meta://127.0.0.1:{port}"
    with postgres(pg_url) as url, Producer(server) as p:
        p.partitions("bench")
        engine = sa.create_engine(url, pool_size=clients + 2)
        rows = sa.Table(
            "bench_orders",
            sa.MetaData(),
            sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
            sa.Column("note", sa.String(40)),
        )
        rows.metadata.create_all(engine)
        coordinator = Coordinator("bench", workdir / "decisions.log", p, engine)
        try:
            for name, kind, k in CLIENT_CASES:
                body = _body(kind, k, p, coordinator, rows, payload)
                yield (
                    name,
                    (0 if kind.startswith("plain") else k),
                    run_threads(clients, seconds, body),
                )
        finally:
            coordinator.close()
            engine.dispose()


def _body(
    kind: str, k: int, p: Any, coordinator: Any, rows: Any, payload: bytes
) -> Callable[[int, Out], None]:
    def plain(n: int, out: Out) -> None:
        t0 = time.perf_counter()
        r = p.send("bench", payload)
        if not r.success:
            raise RuntimeError(f"send failed: {r.error}")
        out.add(time.perf_counter() - t0, time.perf_counter() - t0, 1)

    def plain_async(n: int, out: Out) -> None:
        t0 = time.perf_counter()
        handles = [p.send_async("bench", payload) for _ in range(k)]
        t1 = time.perf_counter()
        if not all(h.result().success for h in handles):
            raise RuntimeError("send failed")
        t2 = time.perf_counter()
        out.add(t2 - t1, t2 - t0, k)

    def local(n: int, out: Out) -> None:
        t0 = time.perf_counter()
        with p.transaction() as tx:
            for _ in range(k):
                p.send("bench", payload)
            t1 = time.perf_counter()
            tx.commit()
        t2 = time.perf_counter()
        out.add(t2 - t1, t2 - t0, k)

    def local_async(n: int, out: Out) -> None:
        t0 = time.perf_counter()
        with p.transaction() as tx:
            for _ in range(k):
                p.send_async("bench", payload)
            t1 = time.perf_counter()
            tx.commit()
        t2 = time.perf_counter()
        out.add(t2 - t1, t2 - t0, k)

    def xa(n: int, out: Out, pipelined: bool = False) -> None:
        t0 = time.perf_counter()
        with coordinator.transaction() as g:
            g.connection.execute(rows.insert().values(note=f"order from {n}"))
            send = p.send_async if pipelined else p.send
            for _ in range(k):
                send("bench", payload)
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        out.add(t2 - t1, t2 - t0, k)

    def xa_async(n: int, out: Out) -> None:
        xa(n, out, pipelined=True)

    bodies: dict[str, Callable[[int, Out], None]] = {
        "plain": plain,
        "plain-async": plain_async,
        "local": local,
        "local-async": local_async,
        "xa": xa,
        "xa-async": xa_async,
    }
    return bodies[kind]
