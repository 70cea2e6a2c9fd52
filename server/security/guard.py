"""Per-connection security: who a connection is, what it may run, and the ``auth`` verb.

The dispatcher calls :meth:`Guard.identify` when a connection opens (a verified client
certificate names it; otherwise it is ``anonymous``) and :meth:`Guard.denied` before every
command once ``[security] enable=true``; a denial is answered ``result 403`` with the text of
:mod:`.acl`.  What needs which right:

| command                                 | right                              |
|-----------------------------------------|------------------------------------|
| put, bput                               | publish on the topic               |
| get, offset                             | subscribe on the topic + the group |
| transaction                             | publish on some topic              |
| admin, txadmin, sync, stats config/reset| admin                              |
| stats (other items), version, quit, auth| none                               |

``auth PLAIN`` (:class:`~pymetaq.client.protocol.AuthCommand`): the connection stops reading
while the scrypt check runs on a worker thread (at most ``MAX_CHECKS`` at once: each holds
~16 MiB), so nothing pipelined behind it runs with the old identity.  Replies: ``200`` + the
identity's name; ``401 authentication failed`` (the same text for an unknown user and a wrong
password; an unknown user costs the same work); ``401 too many failed authentications from
<ip>: retry in <n> s`` once an IP has failed ``authFailureLimit`` times (locked for
``authLockoutMs``, its attempts not checked); ``400`` for a malformed body, an unknown
mechanism, a second ``auth`` or a broker without password users.  Failures are logged with the
user name and peer, never the password.

Thread-safety: the event-loop thread only (the scrypt check runs in the default executor and
its result comes back to the loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from pymetaq.client.protocol import (
    AdminCommand,
    AuthCommand,
    BatchPutCommand,
    BatchSyncCommand,
    GetCommand,
    OffsetCommand,
    ProducersCommand,
    PutCommand,
    StatsCommand,
    SyncCommand,
    TransactionCommand,
    TxAdminCommand,
)
from pymetaq.server.security import passwords
from pymetaq.server.security.acl import ANONYMOUS, Identity
from pymetaq.server.security.config import SecurityConfig
from pymetaq.server.security.tls import certificate_name

if TYPE_CHECKING:
    from pymetaq.server.connection import Connection

log = logging.getLogger("pymetaq.server.security")

MAX_CHECKS = 2
MAX_TRACKED_IPS = 10000
AUTH_FAILED = b"authentication failed"
ADMIN_STATS = frozenset({"config", "reset"})


#: commands only an identity with the admin right may run (replication's included)
_ADMIN_ONLY = frozenset({AdminCommand, TxAdminCommand, SyncCommand, BatchSyncCommand})


class _Failures:
    """Failed attempts per source IP, bounded (the oldest entry is forgotten)."""

    def __init__(self, limit: int, lockout_s: float) -> None:
        self.limit = limit
        self.lockout_s = lockout_s
        self._by_ip: OrderedDict[str, tuple[int, float]] = OrderedDict()  # ip -> (n, locked_until)

    def locked_for(self, ip: str, now: float) -> float:
        entry = self._by_ip.get(ip)
        if entry is None or entry[1] <= now:
            return 0.0
        return entry[1] - now

    def failed(self, ip: str, now: float) -> bool:
        """Count one failure; True if the IP is now locked out."""
        count, until = self._by_ip.pop(ip, (0, 0.0))
        count += 1
        locked = count >= self.limit
        self._by_ip[ip] = (0, now + self.lockout_s) if locked else (count, until)
        while len(self._by_ip) > MAX_TRACKED_IPS:
            self._by_ip.popitem(last=False)
        return locked

    def succeeded(self, ip: str) -> None:
        self._by_ip.pop(ip, None)


class Guard:
    """The broker's security checks (see the module docstring)."""

    def __init__(self, cfg: SecurityConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.loop = loop
        self.enabled = cfg.enable
        self.failures = _Failures(cfg.auth_failure_limit, cfg.auth_lockout_ms / 1000)
        self.checks = asyncio.Semaphore(MAX_CHECKS)  # scrypt checks running (also HTTP)
        self._anonymous = Identity(ANONYMOUS, cfg.anonymous)

    # -- identity --------------------------------------------------------------------------------
    def identify(self, conn: Connection) -> Identity:
        """The identity a new connection starts with: its certificate's, else anonymous."""
        transport = conn.transport
        if transport is not None and transport.get_extra_info("sslcontext") is not None:
            name = certificate_name(transport.get_extra_info("peercert"))
            if name is not None:
                user = self.cfg.user(name)
                rights = user.rights if user is not None else self.cfg.anonymous
                return Identity(name, rights, "certificate")
        return self._anonymous

    # -- authorization ---------------------------------------------------------------------------
    def denied(self, conn: Connection, cmd: object) -> bytes | None:
        """The 403 text if ``conn``'s identity may not run ``cmd``, else None."""
        ident = conn.identity
        kind = type(cmd)
        if kind is PutCommand or kind is BatchPutCommand:
            return ident.publish_denied(cmd.topic)  # type: ignore[attr-defined]
        if kind is GetCommand or kind is OffsetCommand or kind is ProducersCommand:
            return ident.subscribe_denied(cmd.topic, cmd.group)  # type: ignore[attr-defined]
        if kind is StatsCommand:
            return ident.admin_denied() if cmd.item in ADMIN_STATS else None  # type: ignore[attr-defined]
        if kind is TransactionCommand:
            return ident.transaction_denied()
        if kind in _ADMIN_ONLY:
            return ident.admin_denied()
        return None

    # -- authentication --------------------------------------------------------------------------
    def on_auth(self, conn: Connection, cmd: AuthCommand) -> None:
        """Run ``auth`` (see the module docstring)."""
        problem = self._auth_problem(conn, cmd)
        if problem is not None:
            conn.result(400, problem.encode(), cmd.opaque)
            return
        now = time.monotonic()
        wait = self.failures.locked_for(conn.peer_ip, now)
        if wait > 0:
            log.warning("refused authentication from %s: locked out for %.0f s", conn.peer, wait)
            text = f"too many failed authentications from {conn.peer_ip}: retry in {wait:.0f} s"
            conn.result(401, text.encode(), cmd.opaque)
            return
        _, user, password = cmd.body.split(b"\0")
        conn.request_started()
        conn.hold_reading(True)
        task = self.loop.create_task(self._check(conn, user, password, cmd.opaque))
        task.add_done_callback(lambda _t: None)

    def _auth_problem(self, conn: Connection, cmd: AuthCommand) -> str | None:
        if not any(u.password_hash for u in self.cfg.users):
            return "authentication is not enabled on this broker (no [user=NAME] has a password)"
        if not conn.identity.anonymous:
            return f"already authenticated as '{conn.identity.name}'"
        if cmd.mechanism != "PLAIN":
            return f"unsupported auth mechanism '{cmd.mechanism}' (supported: PLAIN)"
        if cmd.body.count(b"\0") != 2:
            return "malformed PLAIN body: expected <authzid>\\0<user>\\0<password>"
        return None

    async def _check(self, conn: Connection, user_b: bytes, password: bytes, opaque: int) -> None:
        name = user_b.decode("utf-8", "replace")
        user = self.cfg.user(name)
        try:
            async with self.checks:
                if user is not None and user.password_hash:
                    stored = user.password_hash
                    ok = await self.loop.run_in_executor(None, passwords.verify, password, stored)
                else:
                    ok = await self.loop.run_in_executor(None, passwords.verify_unknown, password)
            if user is not None and ok:
                self.failures.succeeded(conn.peer_ip)
                conn.identity = Identity(user.name, user.rights, "password")
                log.info("connection from %s authenticated as %r", conn.peer, user.name)
                conn.result(200, user.name.encode(), opaque)
                return
            locked = self.failures.failed(conn.peer_ip, time.monotonic())
            log.warning(
                "failed authentication as %r from %s%s",
                name,
                conn.peer,
                "; the address is locked out" if locked else "",
            )
            conn.result(401, AUTH_FAILED, opaque)
        finally:
            conn.hold_reading(False)
            conn.request_done()
