"""The broker's TLS: one ``ssl.SSLContext`` built from ``[security]``, the peer's identity.

Modern defaults from the stdlib: ``ssl.create_default_context(Purpose.CLIENT_AUTH)`` (TLS 1.2
minimum, the platform's secure ciphers), client certificates checked against ``tlsCaFile`` when
``tlsClientAuth`` is ``optional`` (``CERT_OPTIONAL``) or ``required`` (``CERT_REQUIRED``: a
client without one fails the handshake).  The identity of a verified client certificate is the
``commonName`` of its subject.

Thread-safe: the context is built once at start and only read afterwards.
"""

from __future__ import annotations

import ssl
from typing import Any

from pymetaq.server.errors import StartupError
from pymetaq.server.security.config import SecurityConfig


def server_context(cfg: SecurityConfig) -> ssl.SSLContext:
    """The listener's context; :class:`StartupError` when a file does not load."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        if cfg.ca_file:
            ctx.load_verify_locations(cafile=cfg.ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise StartupError(
            f"cannot load the TLS certificate/key ({cfg.cert_file}, {cfg.key_file}"
            f"{', ' + cfg.ca_file if cfg.ca_file else ''}): {exc}"
        ) from exc
    ctx.verify_mode = {
        "none": ssl.CERT_NONE,
        "optional": ssl.CERT_OPTIONAL,
        "required": ssl.CERT_REQUIRED,
    }[cfg.client_auth]
    return ctx


def certificate_name(peercert: Any) -> str | None:
    """The subject commonName of a verified peer certificate (``getpeercert()``), or None."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
