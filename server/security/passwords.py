"""Password hashes for ``[user=NAME] password=...``: scrypt (``hashlib.scrypt``, OpenSSL's).

Stored form: ``scrypt$<log2 N>$<r>$<p>$<salt, base64>$<hash, base64>`` (a 16-byte salt, a
32-byte hash).  :func:`verify` compares in constant time (``hmac.compare_digest``);
:func:`verify_unknown` burns the same work for a user that does not exist, so a reply's timing
does not tell which user names exist.

Thread-safe: pure functions (the broker runs :func:`verify` off its loop thread).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

PREFIX = "scrypt"
DEFAULT_LOG_N = 14  # N = 16384, r = 8, p = 1: ~16 MiB and tens of ms per check
DEFAULT_R = 8
DEFAULT_P = 1
_SALT = 16
_LEN = 32
_MAX_LOG_N = 20


class BadHash(ValueError):
    """A ``password=`` value that is not a pymetaq scrypt hash."""


def _kdf(password: bytes, salt: bytes, log_n: int, r: int, p: int) -> bytes:
    n = 1 << log_n
    maxmem = 128 * r * (n + p + 2) + (1 << 20)
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=_LEN)


def hash_password(password: str, *, log_n: int = DEFAULT_LOG_N, salt: bytes | None = None) -> str:
    """The stored form of ``password`` (a fresh random salt unless one is given)."""
    salt = os.urandom(_SALT) if salt is None else salt
    digest = _kdf(password.encode("utf-8"), salt, log_n, DEFAULT_R, DEFAULT_P)
    b64 = base64.b64encode
    return f"{PREFIX}${log_n}${DEFAULT_R}${DEFAULT_P}${b64(salt).decode()}${b64(digest).decode()}"


def parse_hash(stored: str) -> tuple[int, int, int, bytes, bytes]:
    """(log2 N, r, p, salt, hash) of a stored value; raises :class:`BadHash`."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != PREFIX:
        raise BadHash(
            "expected scrypt$<logN>$<r>$<p>$<salt>$<hash> "
            "(make one with `pymetaq security hash-password`)"
        )
    try:
        log_n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt = base64.b64decode(parts[4], validate=True)
        digest = base64.b64decode(parts[5], validate=True)
    except ValueError as exc:
        raise BadHash(f"malformed scrypt hash: {exc}") from None
    if not (1 <= log_n <= _MAX_LOG_N and 1 <= r <= 32 and 1 <= p <= 16):
        raise BadHash(f"scrypt parameters out of range (logN 1..{_MAX_LOG_N}, r 1..32, p 1..16)")
    if len(salt) < 8 or len(digest) != _LEN:
        raise BadHash("scrypt salt under 8 bytes or hash not 32 bytes")
    return log_n, r, p, salt, digest


def verify(password: bytes, stored: str) -> bool:
    """True if ``password`` matches ``stored`` (constant-time comparison)."""
    log_n, r, p, salt, digest = parse_hash(stored)
    return hmac.compare_digest(_kdf(password, salt, log_n, r, p), digest)


def verify_unknown(password: bytes) -> bool:
    """The work of a check against a user that does not exist; always False."""
    _kdf(password, b"\0" * _SALT, DEFAULT_LOG_N, DEFAULT_R, DEFAULT_P)
    return False
