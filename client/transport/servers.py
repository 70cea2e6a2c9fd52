"""Pure helpers for server lists and ``stats`` replies (no I/O, no codec import).

``parse_servers("meta://h:p,meta://h2:p2")`` -> ``[("h", p), ("h2", p2)]``: ``meta://`` may be
omitted, IPv6 is written ``meta://[::1]:8123``, duplicates are dropped; a bad entry raises
``ValueError`` naming it. ``parse_stats(body)`` turns a ``stats`` reply body
(``STATS\\r\\n`` + ``key value...`` lines + ``END\\r\\n``) into ``{key: rest-of-line}``.

Thread-safe: pure functions.
"""

from __future__ import annotations

import re

_SERVER_RE = re.compile(
    r"^(?:meta://)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:/\[\]]+)):(?P<port>\d+)/?$"
)


def parse_servers(servers: str | list[str] | tuple[str, ...]) -> list[tuple[str, int]]:
    """Parse ``"meta://host:port[,meta://host:port...]"`` (or a list of such) into pairs."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out: list[tuple[str, int]] = []
    for raw in items:
        entry = raw.strip()
        if not entry:
            continue
        m = _SERVER_RE.match(entry)
        if m is None:
            raise ValueError(f"bad server {entry!r}: expected meta://host:port")
        port = int(m["port"])
        if not 0 < port < 65536:
            raise ValueError(f"bad server {entry!r}: port {port} out of range 1..65535")
        host = m["v6"] or m["host"]
        if (host, port) not in out:
            out.append((host, port))
    if not out:
        raise ValueError(f"no servers in {servers!r}: expected meta://host:port[,meta://host:port]")
    return out


def parse_stats(body: bytes | str) -> dict[str, str]:
    """``STATS\\r\\n key value...\\r\\n ... END\\r\\n`` -> {key: rest-of-line}; lines without a
    value are skipped."""
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line in ("STATS", "END"):
            continue
        key, _, rest = line.partition(" ")
        if rest.strip():  # ``stats <topic>`` starts with the bare name (MetaQ): not a key
            out.setdefault(key, rest.strip())
    return out
