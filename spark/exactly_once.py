"""The exactly-once streaming sink (``deliveryGuarantee=exactly-once``): each task sends its
rows inside a **prepared XA branch**, the driver commits the batch's branches and records the
batch id, so a replayed micro-batch is never applied twice.

**Ids.** A sink is identified by its state directory (``<checkpointLocation>/pymetaq-sink``,
or option ``sinkStateDir``); ``sink = sha1(dir)[:12]``. Every branch of the sink uses the XA
unique qualifier ``pymetaq-spark-<sink>`` (so ``recover()`` lists exactly this sink's
branches) and the xid ``(0x53504B31, b"<sink>-<batchId>", b"<partition>-<attempt>-<nonce>")``: it
derives from (query, batch id, task); the batch id and the task come from Spark's task context
(``streaming.sql.batchId``). The nonce keeps a replay's branches apart from the decided ones
(a committed xid may be used again on a broker).

**Task** (executor): ``start`` → send every row (bound to the branch) → ``end`` (waits for
every put's answer) → ``prepare``; its commit message carries the xid and the broker. A
failure rolls the branch back before the task fails.

**Driver** ``commit(messages, batchId)``, with the state file ``state.json`` (``{"batch": N,
"xids": [...], "done": bool}``, replaced atomically: temp file, fsync, rename, fsync of the
directory):

1. ``batch <= state.batch``: a **replay** of a batch already decided (Spark crashed after our
   commit, before its own commit log): finish the decided branches still prepared, roll back
   everything else prepared (the replay's branches). Nothing is applied twice.
2. otherwise: finish a previous decision that was not done (a driver crash mid-commit); roll
   back every other prepared branch of this sink that is not in ``messages`` (attempts that
   failed, batches of a crashed driver that were never decided); **record the decision**
   (durable) and only then commit the batch's branches; mark it done.

``abort`` rolls back the branches it is given; leftovers are rolled back by the next commit.
The sink's output is visible when the driver commits (read-committed: a consumer sees only
committed messages), one batch behind the tasks.

Thread-safety: a task's writer runs in one thread; commit/abort run on the driver, one batch
at a time (Spark's guarantee).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymetaq.client.errors import MetaClientError
from pymetaq.client.transaction.errors import TMFAIL, XA_RDONLY, XAER_NOTA, XAError
from pymetaq.client.transaction.xa import XAResource, Xid
from pymetaq.spark.options import SparkOptionError

FORMAT_ID = 0x53504B31  # "SPK1"
STATE_FILE = "state.json"


@dataclass(frozen=True)
class SinkIdentity:
    state_dir: str
    sink: str

    @property
    def qualifier(self) -> str:
        return f"pymetaq-spark-{self.sink}"

    def xid(self, batch: int, partition: int, attempt: int) -> Xid:
        """A new branch id of this (batch, task attempt): a nonce makes each run's branches
        distinct, so a replay's branches are never mistaken for the decided ones."""
        bqual = f"{partition}-{attempt}-{secrets.token_hex(8)}"
        return Xid(FORMAT_ID, f"{self.sink}-{batch}".encode(), bqual.encode())

    def batch_of(self, xid: Xid) -> int | None:
        prefix, _, batch = xid.gtrid.decode("ascii", "replace").rpartition("-")
        if xid.format_id != FORMAT_ID or prefix != self.sink or not batch.isdigit():
            return None
        return int(batch)


def sink_identity(options: dict[str, str]) -> SinkIdentity:
    """From option ``sinkStateDir`` or ``checkpointLocation`` (a local path or file: URI)."""
    raw = options.get("sinkstatedir")
    if raw is None:
        ck = options.get("checkpointlocation")
        if ck is None:
            raise SparkOptionError(
                "deliveryGuarantee=exactly-once needs a checkpointLocation (or option 'sinkStateDir')"
            )
        raw = os.path.join(ck.removeprefix("file://").removeprefix("file:"), "pymetaq-sink")
    if "://" in raw:
        raise SparkOptionError(
            f"the exactly-once sink keeps its state in a local directory, not {raw!r}: "
            "give option 'sinkStateDir' (a path on a disk that survives the driver)"
        )
    path = os.path.abspath(raw)
    return SinkIdentity(path, hashlib.sha1(path.encode()).hexdigest()[:12])


@dataclass
class Branch:
    """A prepared branch, as a task reports it (plain data: pickled to the driver)."""

    gtrid: str
    bqual: str
    broker_id: int
    rdonly: bool = False

    @property
    def xid(self) -> Xid:
        return Xid(FORMAT_ID, bytes.fromhex(self.gtrid), bytes.fromhex(self.bqual))

    @classmethod
    def of(cls, xid: Xid, broker_id: int, rdonly: bool) -> Branch:
        return cls(xid.gtrid.hex(), xid.bqual.hex(), broker_id, rdonly)


@dataclass
class SinkState:
    batch: int = -1
    xids: list[tuple[str, str, int]] = field(default_factory=list)
    done: bool = True


def load_state(ident: SinkIdentity) -> SinkState:
    path = Path(ident.state_dir) / STATE_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return SinkState()
    return SinkState(int(doc["batch"]), [tuple(x) for x in doc["xids"]], bool(doc["done"]))


def save_state(ident: SinkIdentity, state: SinkState) -> None:
    """Replace the state file durably (temp file, fsync, rename, fsync of the directory)."""
    d = Path(ident.state_dir)
    d.mkdir(parents=True, exist_ok=True)
    doc = {"batch": state.batch, "xids": [list(x) for x in state.xids], "done": state.done}
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".state-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / STATE_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


#: XA requests of the sink: PREPARE of a large branch and COMMIT wait for the broker's journal
XA_TIMEOUT_S = 120.0


def _rollback_quietly(xa: XAResource, xid: Xid, cause: BaseException) -> None:
    """Roll ``xid`` back after ``cause``; if that fails too, say so on ``cause`` (the branch is
    then rolled back by the sink's next commit, which rolls back every undecided branch)."""
    try:
        xa.rollback(xid)
    except MetaClientError as e:
        cause.add_note(f"rolling back {xid} failed too ({e}): the next batch's commit does it")


def run_branch(xa: XAResource, xid: Xid, send: Any) -> Branch:
    """Task side: ``send()`` inside branch ``xid``, prepared; rolled back on failure."""
    xa.start(xid)
    try:
        send()
    except BaseException as e:
        try:
            xa.end(xid, TMFAIL)
        except MetaClientError as end_error:
            e.add_note(f"ending {xid} failed too: {end_error}")
        _rollback_quietly(xa, xid, e)
        raise
    try:
        xa.end(xid)
        rdonly = xa.prepare(xid) == XA_RDONLY
    except BaseException as e:
        _rollback_quietly(xa, xid, e)
        raise
    return Branch.of(xid, xa.broker_id, rdonly)


def _finish(xa: XAResource, branches: list[tuple[str, str, int]], prepared: set[Xid]) -> None:
    for gtrid, bqual, broker_id in branches:
        xid = Xid(FORMAT_ID, bytes.fromhex(gtrid), bytes.fromhex(bqual))
        if xid in prepared:
            xa.locate(xid, broker_id)
            xa.commit(xid)
            prepared.discard(xid)


def _rollback_all(xa: XAResource, xids: set[Xid]) -> None:
    for xid in xids:
        try:
            xa.rollback(xid)
        except XAError as e:  # already gone (rolled back by a concurrent recovery): fine
            if e.code != XAER_NOTA:
                raise


def commit_batch(xa: XAResource, ident: SinkIdentity, batch: int, branches: list[Branch]) -> None:
    """Driver side (see the module docstring)."""
    state = load_state(ident)
    prepared = {x for x in xa.recover() if ident.batch_of(x) is not None}
    mine = [b for b in branches if not b.rdonly]
    if batch <= state.batch:
        _finish(xa, state.xids if batch == state.batch else [], prepared)
        _rollback_all(xa, prepared)
        return
    if not state.done:
        _finish(xa, state.xids, prepared)
    ours = {b.xid for b in mine}
    _rollback_all(xa, prepared - ours)
    decided = SinkState(batch, [(b.gtrid, b.bqual, b.broker_id) for b in mine], done=False)
    save_state(ident, decided)
    for b in mine:
        xa.locate(b.xid, b.broker_id)
        try:
            xa.commit(b.xid)
        except MetaClientError as e:
            raise MetaClientError(
                f"batch {batch}: commit of {b.xid} failed ({e}); the decision is recorded, "
                "the next batch (or a restart) finishes it"
            ) from e
    decided.done = True
    save_state(ident, decided)


def abort_batch(xa: XAResource, branches: list[Branch]) -> None:
    for b in branches:
        if not b.rdonly:
            xa.locate(b.xid, b.broker_id)
            _rollback_all(xa, {b.xid})
