"""The producer's XA resource: MetaQ's ``TransactionContext`` as an ``XAResource``.

```python
xa = producer.xa_resource()                 # a broker serving every published topic
xid = Xid(1, b"order-42", b"mq")
xa.start(xid)                               # BEGIN [<timeout>] <qualifier>; binds the branch
producer.send("orders", b"created")         # a put with the XID key, on xa's broker
xa.end(xid)                                 # END (no reply), unbinds
assert xa.prepare(xid) == XA_OK             # 0, or XA_RDONLY (3): no message, finished
xa.commit(xid)                              # COMMIT_TWO_PHASE (one_phase=True: ONE_PHASE)
```

MetaQ's semantics: the **unique qualifier** (default ``XAMessageProducer-<hostname>``) is sent
with every command and is part of the branch key ``XID:<formatId>:<gtrid hex>:<bqual hex>:
<qualifier>``; it must be unique per resource manager user and never change (a coordinator's
recovery finds its branches by it). The resource's **broker** is picked at random among the
brokers serving every published topic (``SimpleXAMessageProducer.getXAResource``), and the
branch's messages go to that broker's partitions. ``recover()`` asks **every** candidate broker
and returns only xids with this qualifier; a broker that cannot be asked is logged and skipped
(``last_recover_failures`` names it). Commands about a recovered xid go to the broker that
listed it.

Association (which branch a send joins) is per context, as for local transactions (see
:mod:`.bound`): ``start`` binds the branch to the calling thread or task, ``end`` unbinds it.
MetaQ's checks: ``prepare``/``commit`` of the associated xid (``end`` not called) and any call
with ``xid=None`` are XAER_PROTO; ``start`` inside a local transaction XAER_PROTO, while
another xid is associated XAER_DUPID; ``end`` with TMSUSPEND/TMFAIL of a non-associated xid
XAER_PROTO, with no TMSUCCESS/TMSUSPEND/TMFAIL flag XAER_INVAL. pymetaq additions: ``end``
waits for the branch's messages to be answered, and raises ``XA_RBROLLBACK`` when one was not
taken (roll the branch back); ``start(xid, TMJOIN | TMRESUME)`` re-associates a branch of this
resource that was ended (MetaQ refused every join/resume).

Thread-safety: :class:`XAResource` may be shared by threads (association is per context);
:class:`AsyncXAResource` belongs to its producer's loop.
"""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pymetaq.client.errors import MetaClientError
from pymetaq.client.protocol import TransactionType, XidKey, format_tx_key, parse_tx_key
from pymetaq.client.transaction.bound import (
    BoundTransaction,
    Item,
    PutDone,
    PutPipe,
    TransactionBinding,
    closed_error,
)
from pymetaq.client.transaction.errors import (
    TMFAIL,
    TMJOIN,
    TMNOFLAGS,
    TMRESUME,
    TMSUCCESS,
    TMSUSPEND,
    XA_RBROLLBACK,
    XAER_DUPID,
    XAER_INVAL,
    XAER_NOTA,
    XAER_PROTO,
    XAER_RMFAIL,
    XAError,
)
from pymetaq.client.transaction.wire import DEFAULT_TX_REQUEST_TIMEOUT_S, tx_command, xa_request
from pymetaq.client.transport.connection import BrokerConnection
from pymetaq.client.types import TopicPartition

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_QUALIFIER_PREFIX = "XAMessageProducer"
MAX_XID_PART = 64  # XA's MAXGTRIDSIZE / MAXBQUALSIZE


@dataclass(frozen=True)
class Xid:
    """An XA transaction branch id (``javax.transaction.xa.Xid``)."""

    format_id: int
    gtrid: bytes
    bqual: bytes

    def __post_init__(self) -> None:
        if not -(1 << 31) <= self.format_id < (1 << 31):
            raise ValueError(f"format_id {self.format_id} is not a 32-bit integer")
        for name in ("gtrid", "bqual"):
            v = getattr(self, name)
            if not isinstance(v, bytes) or len(v) > MAX_XID_PART:
                raise ValueError(f"{name} must be bytes of at most {MAX_XID_PART}, not {v!r}")

    def key(self, qualifier: str) -> str:
        """The broker's key ``XID:<formatId>:<gtrid hex>:<bqual hex>:<qualifier>``."""
        return format_tx_key(XidKey(self.format_id, self.gtrid, self.bqual, qualifier))

    @classmethod
    def from_key(cls, key: str) -> tuple[Xid, str]:
        """(xid, qualifier) of a broker key; ValueError if it is not an XA key."""
        parsed = parse_tx_key(key)
        if not isinstance(parsed, XidKey):
            raise ValueError(f"{key!r} is not an XA transaction key")
        return cls(parsed.format_id, parsed.gtrid, parsed.bqual), parsed.unique_qualifier


def default_qualifier(prefix: str = DEFAULT_QUALIFIER_PREFIX) -> str:
    """MetaQ's default unique qualifier: ``<prefix>-<hostname>``."""
    return check_qualifier(f"{check_qualifier(prefix)}-{socket.gethostname()}")


def check_qualifier(q: str) -> str:
    """MetaQ's rule: not blank, no newline, tab, ``:`` or space."""
    if not q or not q.strip() or any(c in q for c in "\r\n\t: "):
        raise ValueError(
            f"invalid unique qualifier {q!r}: it must not be blank or contain a newline, "
            f"':' or blank characters"
        )
    return q


class XAHost(Protocol):
    """What the resource needs from its producer (provided by the producer's glue)."""

    binding: TransactionBinding

    async def connection(self, broker_id: int) -> BrokerConnection: ...

    def broker_url(self, broker_id: int) -> str: ...


class XABranch(BoundTransaction):
    """An XA branch associated with a context: its messages are puts with the XID key."""

    kind = "XA"

    def __init__(self, xid: Xid, key: str, broker_id: int, host: XAHost, pipe: PutPipe) -> None:
        super().__init__()
        self.xid, self.key = xid, key
        self.pin(broker_id, host.broker_url(broker_id))
        self.pipe = pipe

    def put(self, tp: TopicPartition, items: list[Item], done: PutDone) -> None:
        if self.finished:
            done(-1, closed_error(self))
            return
        self.pipe.write(self.key, tp, items, done)


class _SharedPipe(PutPipe):
    """XA puts on the producer's own connection to the broker (XA branches belong to the
    broker, not to a connection)."""

    def __init__(self, host: XAHost, broker_id: int, loop: Any, timeout_s: float) -> None:
        super().__init__(loop, timeout_s)
        self._host, self._broker_id = host, broker_id

    async def open_connection(self) -> BrokerConnection:
        try:
            return await self._host.connection(self._broker_id)
        except MetaClientError as e:
            raise XAError(XAER_RMFAIL, f"broker {self._broker_id}: {e}") from e


class XACore:
    """The resource's logic: checks in the caller's context, commands on the loop."""

    def __init__(
        self,
        host: XAHost,
        loop: Any,
        broker_id: int,
        candidates: list[int],
        qualifier: str,
        session_id: str,
        request_timeout_s: float = DEFAULT_TX_REQUEST_TIMEOUT_S,
    ) -> None:
        self.host, self.loop = host, loop
        self.broker_id = broker_id
        self.candidates = candidates
        self.qualifier = check_qualifier(qualifier)
        self.session_id = session_id
        self.request_timeout_s = request_timeout_s
        self.timeout_s = 0
        #: broker of each xid this resource started or recovered
        self.where: dict[Xid, int] = {}
        #: brokers the last ``recover`` could not ask (broker id -> why)
        self.last_recover_failures: dict[int, str] = {}
        self._ended: dict[Xid, XABranch] = {}

    # -- caller-context checks ----------------------------------------------------------------
    def associated(self) -> XABranch | None:
        bound = self.host.binding.current()
        if bound is None or bound.finished:
            return None
        if not isinstance(bound, XABranch):
            raise XAError(XAER_PROTO, f"a local transaction ({bound.key}) is in progress")
        return bound

    def check_start(self, xid: Xid, flags: int) -> XABranch | None:
        """The ended branch to re-associate (TMJOIN/TMRESUME), None for a new one."""
        _need(xid)
        current = self.associated()
        if current is not None:
            raise XAError(XAER_DUPID, f"{current.key} is associated with this context")
        if flags & (TMJOIN | TMRESUME):
            branch = self._ended.get(xid)
            if branch is None:
                raise XAError(XAER_NOTA, f"{xid} was not started and ended by this resource")
            return branch
        if flags != TMNOFLAGS:
            raise XAError(XAER_INVAL, f"start flags {flags:#x}")
        return None

    def branch_of(self, xid: Xid) -> XABranch | None:
        """The branch of ``xid`` if it is associated with the calling context."""
        bound = self.host.binding.current()
        if isinstance(bound, XABranch) and not bound.finished and bound.xid == xid:
            return bound
        return None

    def check_unassociated(self, xid: Xid | None, what: str) -> Xid:
        xid = _need(xid)
        current = self.branch_of(xid)
        if current is not None:
            raise XAError(XAER_PROTO, f"{what} of {current.key} before end()")
        return xid

    def check_end(self, xid: Xid, flags: int) -> XABranch | None:
        """The branch to end, or None (TMSUCCESS of a non-associated xid: nothing to do)."""
        _need(xid)
        current = self.associated()
        matches = current is not None and current.xid == xid
        if flags & (TMSUSPEND | TMFAIL):
            if not matches:
                raise XAError(XAER_PROTO, f"end({xid}) with TMSUSPEND/TMFAIL: not associated")
        elif not flags & TMSUCCESS:
            raise XAError(XAER_INVAL, f"end flags {flags:#x}")
        return current if matches else None

    # -- commands (loop) ----------------------------------------------------------------------
    def new_branch(self, xid: Xid) -> XABranch:
        pipe = _SharedPipe(self.host, self.broker_id, self.loop, self.request_timeout_s)
        branch = XABranch(xid, xid.key(self.qualifier), self.broker_id, self.host, pipe)
        self.where[xid] = self.broker_id
        return branch

    async def call(
        self, xid: Xid | None, kind: TransactionType, broker_id: int | None = None, **kw: Any
    ) -> bytes:
        key = "null" if xid is None else xid.key(self.qualifier)
        target = broker_id if broker_id is not None else self.broker_for(xid)
        try:
            conn = await self.host.connection(target)
        except MetaClientError as e:
            raise XAError(XAER_RMFAIL, f"{kind.value}: broker {target}: {e}") from e
        cmd = tx_command(key, self.session_id, kind, qualifier=self.qualifier, **kw)
        return await xa_request(conn, cmd, self.request_timeout_s)

    def broker_for(self, xid: Xid | None) -> int:
        return self.where.get(xid, self.broker_id) if xid is not None else self.broker_id

    async def begin(self, xid: Xid) -> None:
        timeout = self.timeout_s if self.timeout_s > 0 else None
        await self.call(xid, TransactionType.BEGIN, timeout_s=timeout)

    async def end(self, branch: XABranch) -> MetaClientError | None:
        """Wait for the branch's messages, then send END (no reply); the first put failure."""
        failure = await branch.pipe.settle()
        try:
            conn = await self.host.connection(branch.broker_id or self.broker_id)
            cmd = tx_command(
                branch.key, self.session_id, TransactionType.END, qualifier=self.qualifier
            )
            conn.send_oneway(cmd)
        except MetaClientError as e:
            log.warning("END of %s could not be sent: %s", branch.key, e)
        return failure

    async def prepare(self, xid: Xid) -> int:
        body = await self.call(xid, TransactionType.PREPARE)
        try:
            return int(body)
        except ValueError:
            raise XAError(XAER_RMFAIL, f"unexpected PREPARE reply {body[:40]!r}") from None

    async def commit(self, xid: Xid, one_phase: bool) -> None:
        kind = TransactionType.COMMIT_ONE_PHASE if one_phase else TransactionType.COMMIT_TWO_PHASE
        try:
            await self.call(xid, kind)
        finally:
            self._ended.pop(xid, None)

    async def rollback(self, xid: Xid, branch: XABranch | None) -> None:
        if branch is not None:
            await branch.pipe.settle()
        try:
            await self.call(xid, TransactionType.ROLLBACK)
        finally:
            self._ended.pop(xid, None)

    async def forget(self, xid: Xid) -> None:
        await self.call(xid, TransactionType.FORGET)
        self.where.pop(xid, None)

    async def recover(self) -> list[Xid]:
        """Every candidate broker's prepared (and heuristically decided) branches of this
        qualifier."""
        out: list[Xid] = []
        self.last_recover_failures = {}
        for broker_id in self.candidates:
            try:
                body = await self.call(None, TransactionType.RECOVER, broker_id=broker_id)
            except XAError as e:
                log.warning("recover from broker %s failed: %s", broker_id, e)
                self.last_recover_failures[broker_id] = str(e)
                continue
            for line in body.decode("utf-8", "replace").split("\r\n"):
                if not line.strip():
                    continue
                try:
                    xid, qualifier = Xid.from_key(line.strip())
                except ValueError:
                    log.warning("broker %s recovered a bad key %r", broker_id, line)
                    continue
                if qualifier == self.qualifier and xid not in out:
                    out.append(xid)
                    self.where[xid] = broker_id
        return out


def _need(xid: Xid | None) -> Xid:
    if xid is None:
        raise XAError(XAER_PROTO, "xid is None")
    if not isinstance(xid, Xid):
        raise XAError(XAER_INVAL, f"xid must be an Xid, not {type(xid).__name__}")
    return xid


def pick_broker(
    serving: list[set[int]], known: list[int], rng: random.Random
) -> tuple[int, list[int]]:
    """MetaQ's choice: the brokers serving every topic (all known ones if no topic), sorted;
    one of them at random. Raises if no broker serves them all."""
    common = set(known)
    for s in serving:
        common &= s
    candidates = sorted(common)
    if not candidates:
        raise XAError(XAER_RMFAIL, "no broker serves every published topic")
    return rng.choice(candidates), candidates


class _Face:
    _core: XACore

    @property
    def unique_qualifier(self) -> str:
        return self._core.qualifier

    @property
    def broker_id(self) -> int:
        """The broker this resource's new branches (and their messages) go to."""
        return self._core.broker_id

    @property
    def last_recover_failures(self) -> dict[int, str]:
        return dict(self._core.last_recover_failures)

    def get_transaction_timeout(self) -> int:
        return self._core.timeout_s

    def set_transaction_timeout(self, seconds: int) -> bool:
        """The timeout BEGIN carries (0 = none: the broker's cap applies)."""
        if seconds < 0:
            raise XAError(XAER_INVAL, f"timeout {seconds} < 0")
        self._core.timeout_s = seconds
        return True

    def locate(self, xid: Xid, broker_id: int) -> None:
        """Send this resource's commands about ``xid`` to ``broker_id`` (where the branch was
        started: a coordinator's log knows it after a restart)."""
        self._core.where[xid] = broker_id

    def is_same_rm(self, other: object) -> bool:
        """Same broker (MetaQ compares the server URL)."""
        if not isinstance(other, _Face):
            return False
        core, o = self._core, other._core
        return core.host.broker_url(core.broker_id) == o.host.broker_url(o.broker_id)

    def _bind(self, branch: XABranch) -> None:
        branch.finished = False
        self._core.host.binding.bind(branch)
        self._core._ended.pop(branch.xid, None)

    def _unbind(self, branch: XABranch, keep: bool) -> None:
        branch.finished = True
        self._core.host.binding.unbind(None)
        if keep:
            self._core._ended[branch.xid] = branch

    def _end_result(self, branch: XABranch, flags: int, failure: MetaClientError | None) -> None:
        if failure is not None and not flags & TMFAIL:
            raise XAError(
                XA_RBROLLBACK, f"{branch.key}: a message was not taken ({failure}); roll it back"
            )


class XAResource(_Face):
    """The thread face (``Producer.xa_resource()``): each call waits for its reply."""

    def __init__(self, core: XACore, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._core = core
        self._run = run

    def start(self, xid: Xid, flags: int = TMNOFLAGS) -> None:
        core = self._core
        branch = core.check_start(xid, flags)
        self._run(core.begin(xid))
        self._bind(branch or core.new_branch(xid))

    def end(self, xid: Xid, flags: int = TMSUCCESS) -> None:
        core = self._core
        branch = core.check_end(xid, flags)
        if branch is None:
            return
        failure = self._run(core.end(branch))
        self._unbind(branch, keep=bool(flags & TMSUSPEND))
        self._end_result(branch, flags, failure)

    def prepare(self, xid: Xid) -> int:
        """XA_OK (0), or XA_RDONLY (3): the branch had no message and is finished."""
        return int(self._run(self._core.prepare(self._core.check_unassociated(xid, "prepare"))))

    def commit(self, xid: Xid, one_phase: bool = False) -> None:
        core = self._core
        self._run(core.commit(core.check_unassociated(xid, "commit"), one_phase))

    def rollback(self, xid: Xid) -> None:
        core = self._core
        xid = _need(xid)
        branch = core.branch_of(xid)
        try:
            self._run(core.rollback(xid, branch))
        finally:
            if branch is not None:
                self._unbind(branch, keep=False)

    def forget(self, xid: Xid) -> None:
        self._run(self._core.forget(_need(xid)))

    def recover(self, flags: int = 0) -> list[Xid]:
        """Prepared branches with this qualifier on every candidate broker."""
        return list(self._run(self._core.recover()))


class AsyncXAResource(_Face):
    """The asyncio face (``AsyncProducer.xa_resource()``): the same calls, awaited."""

    def __init__(self, core: XACore) -> None:
        self._core = core

    async def start(self, xid: Xid, flags: int = TMNOFLAGS) -> None:
        core = self._core
        branch = core.check_start(xid, flags)
        await core.begin(xid)
        self._bind(branch or core.new_branch(xid))

    async def end(self, xid: Xid, flags: int = TMSUCCESS) -> None:
        core = self._core
        branch = core.check_end(xid, flags)
        if branch is None:
            return
        failure = await core.end(branch)
        self._unbind(branch, keep=bool(flags & TMSUSPEND))
        self._end_result(branch, flags, failure)

    async def prepare(self, xid: Xid) -> int:
        return await self._core.prepare(self._core.check_unassociated(xid, "prepare"))

    async def commit(self, xid: Xid, one_phase: bool = False) -> None:
        await self._core.commit(self._core.check_unassociated(xid, "commit"), one_phase)

    async def rollback(self, xid: Xid) -> None:
        core = self._core
        xid = _need(xid)
        branch = core.branch_of(xid)
        try:
            await core.rollback(xid, branch)
        finally:
            if branch is not None:
                self._unbind(branch, keep=False)

    async def forget(self, xid: Xid) -> None:
        await self._core.forget(_need(xid))

    async def recover(self, flags: int = 0) -> list[Xid]:
        return await self._core.recover()
