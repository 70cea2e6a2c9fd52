"""The client's side of security: ``meta+tls://`` server lists, TLS contexts, ``auth PLAIN``.

A servers string whose entries are ``meta+tls://host:port`` is spoken to over TLS; options
follow the list after one ``?`` (URL query form, applying to every server)::

    meta+tls://b1:8443,meta+tls://b2:8443?ca=/etc/metaq/ca.pem&cert=me.pem&key=me.key

| option          | meaning                                                              |
|-----------------|----------------------------------------------------------------------|
| ca              | CA file the broker's certificate must chain to (default: the system's)|
| cert, key       | this client's certificate and key (mTLS; ``key`` defaults to ``cert``)|
| verify_hostname | ``true`` (default) / ``false``: check the certificate names the host  |
| user            | authenticate with ``auth PLAIN`` as this user right after connecting |
| password_file   | a file holding the password (else ``$PYMETAQ_PASSWORD``)             |

``user`` also works on plain ``meta://`` lists (the password then crosses the network in
clear: only on loopback or a trusted network).  Mixing ``meta://`` and ``meta+tls://`` entries
is an error.  The wire form of ``auth`` is in docs/security.md.

Thread-safety: :class:`ClientSecurity` is immutable; its context is built once, lazily.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

TLS_SCHEME = "meta+tls://"
PLAIN_SCHEME = "meta://"
PASSWORD_ENV = "PYMETAQ_PASSWORD"
_OPTIONS = ("ca", "cert", "key", "verify_hostname", "user", "password_file")


@dataclass(frozen=True)
class ClientSecurity:
    """TLS and credentials for every connection of one client."""

    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    verify_hostname: bool = True
    user: str = ""
    password: str = field(default="", repr=False)
    _ctx: list[ssl.SSLContext] = field(default_factory=list, repr=False, compare=False)

    def context(self) -> ssl.SSLContext | None:
        """The ``ssl.SSLContext`` of TLS connections (None without TLS)."""
        if not self.tls:
            return None
        if not self._ctx:
            ctx = ssl.create_default_context(cafile=self.ca_file or None)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.check_hostname = self.verify_hostname
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file or None)
            self._ctx.append(ctx)
        return self._ctx[0]

    def auth_body(self) -> bytes:
        """The ``auth PLAIN`` body: ``\\0<user>\\0<password>`` (RFC 4616, no authzid)."""
        return b"\0" + self.user.encode() + b"\0" + self.password.encode()


NO_SECURITY = ClientSecurity()


def split_options(servers: str) -> tuple[str, str]:
    """``(server list, query)`` of a servers string (the query may be empty)."""
    head, _, query = servers.partition("?")
    return head, query


def client_security(servers: str | list[str] | tuple[str, ...]) -> ClientSecurity:
    """The :class:`ClientSecurity` a servers string asks for; ``ValueError`` names a problem."""
    text = servers if isinstance(servers, str) else ",".join(servers)
    head, query = split_options(text)
    entries = [e.strip().lower() for e in head.split(",") if e.strip()]
    tls = [e.startswith(TLS_SCHEME) for e in entries]
    if any(tls) and not all(tls):
        raise ValueError(f"mixed meta:// and meta+tls:// servers in {head!r}: use one scheme")
    opts: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key not in _OPTIONS:
            raise ValueError(f"unknown server option {key!r} (known: {', '.join(_OPTIONS)})")
        opts[key] = value
    if not any(tls) and any(k in opts for k in ("ca", "cert", "key", "verify_hostname")):
        raise ValueError("TLS options need meta+tls:// servers")
    verify = opts.get("verify_hostname", "true").lower()
    if verify not in ("true", "false"):
        raise ValueError(f"verify_hostname={verify!r}: expected true or false")
    password = ""
    if opts.get("user"):
        password = _password(opts.get("password_file", ""))
    for key in ("ca", "cert", "key"):
        path = opts.get(key, "")
        if path and not os.access(path, os.R_OK):
            raise ValueError(f"{key}={path}: cannot read the file")
    return ClientSecurity(
        tls=bool(entries) and all(tls),
        ca_file=opts.get("ca", ""),
        cert_file=opts.get("cert", ""),
        key_file=opts.get("key", ""),
        verify_hostname=verify == "true",
        user=opts.get("user", ""),
        password=password,
    )


def _password(path: str) -> str:
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().rstrip("\r\n")
        except OSError as exc:
            raise ValueError(f"password_file={path}: {exc.strerror or exc}") from None
    password = os.environ.get(PASSWORD_ENV)
    if password is None:
        raise ValueError(f"user= given but no password: set ${PASSWORD_ENV} or password_file=")
    return password
