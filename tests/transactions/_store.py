"""In-process helpers for the transaction store tests: a store manager + a TxStore whose
completions are posted to a queue that the test thread drains (the broker's event loop in
miniature)."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pymetaq.storage import MessageStoreManager, ReadStatus, StoreConfig, TopicStoreConfig
from pymetaq.storage.disk import Disk
from pymetaq.storage.record import HEADER, Record, iter_records
from pymetaq.storage.txjournal import JournalConfig, TxRecovery, TxStore
from tests.storage._helpers import abandon as abandon_store


@dataclass
class Env:
    manager: MessageStoreManager
    store: TxStore
    recovery: TxRecovery
    posted: queue.Queue[Callable[[], None]] = field(default_factory=queue.Queue)

    def drain(self, until: Callable[[], Any], timeout: float = 20.0) -> None:
        """Run posted completions on this thread until ``until()`` is true."""
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("completion not posted in time")
            try:
                self.posted.get(timeout=min(left, 0.05))()
            except queue.Empty:
                pass

    def drain_now(self) -> None:
        while True:
            try:
                self.posted.get_nowait()()
            except queue.Empty:
                return

    def record(self, data: bytes, flag: int = 0) -> bytes:
        from pymetaq.storage.checksum import checksum

        return HEADER.pack(len(data), checksum(data), self.manager.ids.next_id(), flag) + data

    def log(self, topic: str, partition: int) -> Any:
        return self.manager.get_log(topic, partition)


def open_env(
    path: str,
    *,
    disk: Disk | None = None,
    topic: TopicStoreConfig | None = None,
    file_size: int = 1 << 20,
    flush: int = 1,
    segment: int = 1 << 20,
) -> Env:
    cfg = topic or TopicStoreConfig(num_partitions=4, unflush_threshold=0)
    kwargs: dict[str, Any] = {"disk": disk} if disk is not None else {}
    m = MessageStoreManager(StoreConfig(path, max_segment_size=segment), lambda t: cfg, **kwargs)
    m.open()
    m.start()
    posted: queue.Queue[Callable[[], None]] = queue.Queue()
    jconf = JournalConfig(
        os.path.join(path, "transactions"), file_size=file_size, flush_at_commit=flush
    )
    store = TxStore(jconf, m.get_log, ids=m.ids, disk=disk, post=posted.put)
    recovery = store.open()
    store.start()
    return Env(m, store, recovery, posted)


def abandon(env: Env) -> None:
    """A process death: stop the threads; close nothing cleanly (no checkpoint, no marker)."""
    j = env.store.journal
    with j._lock:
        j._closed = True
        j._cond.notify_all()
    if j._thread is not None:
        j._thread.join()
    abandon_store(env.manager)
    for f in j._files:
        f.file.close()


def close(env: Env) -> None:
    env.drain_now()
    env.store.close()
    env.manager.close()


def read_records(plog: Any) -> list[Record]:
    """Every durable record of a log."""
    out: list[Record] = []
    pos = plog.min_offset
    while True:
        res = plog.read(pos, 1 << 20)
        if res.status is not ReadStatus.OK:
            return out
        with res.region as region:
            data = region.read_bytes()
        recs = list(iter_records(data, pos))
        if not recs:
            return out
        out += recs
        pos = recs[-1].offset + recs[-1].size
