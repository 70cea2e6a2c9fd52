"""The HTTP port's gate once ``[security] enable=true``: ``/metrics``, the dashboard, its JSON
and the reload are the admin surface, so every request needs an identity with ``admin=true``.

The identity comes from a verified client certificate (``httpTls=true`` with
``tlsClientAuth``), else from HTTP Basic authentication (``Authorization: Basic
base64(user:password)``, checked like ``auth PLAIN``: scrypt off the loop thread, the same
per-IP lockout).  Replies: ``401`` with ``WWW-Authenticate: Basic realm="pymetaq"`` (no or
wrong credentials), ``401 too many failed authentications ...`` (locked out), ``403`` + the
:mod:`.acl` text for an identity without the admin right.  A verified password is remembered
for ``CACHE_S`` seconds (keyed by an HMAC of user and password under a per-process random key,
never the password) so a scraper or the dashboard's refresh costs one scrypt per minute.

Thread-safety: the event-loop thread only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import os
import time
from collections import OrderedDict

from pymetaq.server.http.server import Request, Response
from pymetaq.server.security import passwords
from pymetaq.server.security.acl import Identity
from pymetaq.server.security.guard import Guard

log = logging.getLogger("pymetaq.server.security")

CACHE_S = 60.0
MAX_CACHE = 256
_CHALLENGE = [("WWW-Authenticate", 'Basic realm="pymetaq", charset="UTF-8"')]


class HttpGate:
    """``await gate(request)``: a refusal :class:`Response`, or None to serve the request."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.cfg = guard.cfg
        self._key = os.urandom(32)
        self._cache: OrderedDict[bytes, tuple[str, float]] = OrderedDict()

    async def __call__(self, request: Request) -> Response | None:
        if request.cert_name is not None:
            user = self.cfg.user(request.cert_name)
            if user is not None:
                return self._admit(Identity(user.name, user.rights, "certificate"))
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return Response(401, b"authentication required (HTTP Basic)\n", headers=_CHALLENGE)
        try:
            name, sep, password = (
                base64.b64decode(value.strip(), validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            name, sep, password = "", "", ""
        if not sep:
            return Response(400, b"malformed Basic credentials\n")
        return await self._password(request, name, password.encode())

    async def _password(self, request: Request, name: str, password: bytes) -> Response | None:
        now = time.monotonic()
        key = hmac.new(self._key, name.encode() + b"\0" + password, hashlib.sha256).digest()
        cached = self._cache.get(key)
        user = self.cfg.user(name)
        if cached is not None and cached[1] > now and user is not None:
            return self._admit(Identity(user.name, user.rights, "password"))
        wait = self.guard.failures.locked_for(request.peer, now)
        if wait > 0:
            text = f"too many failed authentications from {request.peer}: retry in {wait:.0f} s\n"
            return Response(401, text.encode(), headers=_CHALLENGE)
        loop = asyncio.get_running_loop()
        async with self.guard.checks:
            if user is not None and user.password_hash:
                ok = await loop.run_in_executor(
                    None, passwords.verify, password, user.password_hash
                )
            else:
                ok = await loop.run_in_executor(None, passwords.verify_unknown, password)
        if user is None or not ok:
            locked = self.guard.failures.failed(request.peer, time.monotonic())
            log.warning(
                "failed HTTP authentication as %r from %s%s",
                name,
                request.peer,
                "; the address is locked out" if locked else "",
            )
            return Response(401, b"authentication failed\n", headers=_CHALLENGE)
        self.guard.failures.succeeded(request.peer)
        self._cache[key] = (user.name, now + CACHE_S)
        while len(self._cache) > MAX_CACHE:
            self._cache.popitem(last=False)
        return self._admit(Identity(user.name, user.rights, "password"))

    @staticmethod
    def _admit(identity: Identity) -> Response | None:
        denial = identity.admin_denied()
        return None if denial is None else Response(403, denial + b"\n")
