"""A failing transaction journal (fsync returns EIO): the broker's transaction manager answers
XAER_RMFAIL and plain put errors, never acknowledges what is not durable, and recovery after the
restart settles every transaction."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

from pymetaq.server.stats import Stats
from pymetaq.server.transaction.manager import TransactionManager, TxLimits
from pymetaq.server.transaction.xa import TxError
from pymetaq.storage import MessageStoreManager, StoreConfig, TopicStoreConfig
from pymetaq.storage.checksum import checksum
from pymetaq.storage.txjournal import JournalConfig, TxStore
from tests.storage.faultdisk import FaultDisk
from tests.transactions._store import open_env, read_records


class EioDisk(FaultDisk):
    """A FaultDisk whose file fsyncs fail with EIO once armed (writes still succeed)."""

    def __init__(self) -> None:
        super().__init__(random.Random(0))
        self.fail = False

    def create(self, path: str, capacity: int) -> Any:
        return _EioFile(self, super().create(path, capacity))

    def open(self, path: str, *, writable: bool, capacity: int = 0) -> Any:
        return _EioFile(self, super().open(path, writable=writable, capacity=capacity))


class _EioFile:
    def __init__(self, disk: EioDisk, inner: Any) -> None:
        self._disk, self._inner = disk, inner

    def sync(self) -> None:
        if self._disk.fail:
            raise OSError(5, "Input/output error (injected)")
        self._inner.sync()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def scenario(path: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    disk = EioDisk()
    cfg = TopicStoreConfig(num_partitions=1, unflush_threshold=0)
    m = MessageStoreManager(StoreConfig(path), lambda t: cfg)
    m.open()
    m.start()
    store = TxStore(
        JournalConfig(os.path.join(path, "transactions")), m.get_log, ids=m.ids, disk=disk
    )
    store.open()

    def post(fn: Any) -> None:
        loop.call_soon_threadsafe(fn)

    store.start(post)
    mgr = TransactionManager(store, TxLimits(), loop, Stats(), m.ids)
    out: dict[str, Any] = {}

    async def call(name: str, fn: Any, *args: Any) -> None:
        fut: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        try:
            fn(*args, lambda code, body: fut.set_result((code, body)))
        except TxError as exc:  # answered at once (the handler replies 500 with the body)
            fut.set_result((500, exc.body()))
        out[name] = await asyncio.wait_for(fut, 20)

    data = b"payload"
    mgr.begin("c", "TX:s:1", None)
    mgr.add(mgr.for_put("c", "TX:s:1"), "t", 0, data, 0, checksum(data))
    mgr.begin("c", "XID:1:aa:bb:q", None)
    mgr.add(mgr.for_put("c", "XID:1:aa:bb:q"), "t", 0, data, 0, checksum(data))
    disk.fail = True
    await call("prepare", mgr.prepare, "c", "XID:1:aa:bb:q")
    await call("commit", mgr.commit, "c", "TX:s:1", True)
    mgr.begin("c", "TX:s:2", None)
    try:
        mgr.add(mgr.for_put("c", "TX:s:2"), "t", 0, data, 0, checksum(data))
    except TxError as exc:
        out["put"] = str(exc)
    store.journal.close()
    m.close()
    return out


def test_a_failed_journal_fsync_is_never_acknowledged(tmp_path: Path) -> None:
    out = asyncio.run(scenario(str(tmp_path)))
    code, body = out["prepare"]  # written, but its fsync failed: not acknowledged
    assert code == 500 and body.startswith(
        b"XAException:code=-7,msg=prepare not durable: [Errno 5] Input/output error (injected)"
    ), body
    code, body = out["commit"]  # the journal refuses everything after a failed fsync
    assert code == 500 and body.startswith(
        b"XAException:code=-7,msg=Commit failed; the transaction is still open: "
        b"transaction journal failed earlier"
    ), body
    assert out["put"].startswith(
        "Put message failed: transaction log: transaction journal failed earlier"
    )
    env = open_env(str(tmp_path))  # the disk works again; the page cache kept the writes
    assert env.recovery.rolled_back == 1 and read_records(env.log("t", 0)) == []
    assert [t.key for t in env.recovery.prepared] == ["XID:1:aa:bb:q"]
    env.store.close()
    env.manager.close()
