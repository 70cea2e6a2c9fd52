"""Pure helpers for server lists and ``stats`` replies (no I/O, no codec import).

``parse_servers("meta://h:p,meta://h2:p2")`` -> ``[("h", p), ("h2", p2)]``: ``meta://`` may be
omitted or be ``meta+tls://`` (TLS; options after ``?``: :mod:`.security`), IPv6 is written ``meta://[::1]:8123``, duplicates are dropped; a bad entry raises
``ValueError`` naming it.  ``servers`` may instead be one ZooKeeper URL,
``zk://host:port[,host:port][/root]`` (:func:`zk_servers` tells; the producer and the consumer
then discover their brokers there: :mod:`pymetaq.client.transport.zkbrokers`); inside a
``meta://`` list it is an error. ``parse_stats(body)`` turns a ``stats`` reply body
(``STATS\\r\\n`` + ``key value...`` lines + ``END\\r\\n``) into ``{key: rest-of-line}``.

Thread-safe: pure functions.
"""

from __future__ import annotations

import re

#: a ZooKeeper registry URL (``pymetaq.client.protocol.zk``; not imported: this module is pure)
ZK_SCHEME = "zk://"

_SERVER_RE = re.compile(
    r"^(?:meta(?:\+tls)?://)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:/\[\]]+)):(?P<port>\d+)/?$"
)


def zk_servers(servers: str | list[str] | tuple[str, ...]) -> str | None:
    """The ``zk://`` URL if ``servers`` is one (a string, or a list holding just it), else
    None (a ``meta://`` list)."""
    items = [servers] if isinstance(servers, str) else list(servers)
    if len(items) == 1 and isinstance(items[0], str):
        text = items[0].strip()
        if text.lower().startswith(ZK_SCHEME):
            return text
    return None


def parse_servers(servers: str | list[str] | tuple[str, ...]) -> list[tuple[str, int]]:
    """Parse ``"meta://host:port[,meta://host:port...]"`` (or a list of such) into pairs."""
    if isinstance(servers, str):
        items = servers.partition("?")[0].split(",")  # options: transport/security.py
    else:
        items = [s.partition("?")[0] for s in servers]
    out: list[tuple[str, int]] = []
    for raw in items:
        entry = raw.strip()
        if not entry:
            continue
        if entry.lower().startswith(ZK_SCHEME):
            raise ValueError(
                f"{entry!r} is a ZooKeeper URL: give it as the only server "
                "(servers='zk://host:port[,host:port][/root]'), not in a meta:// list"
            )
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
