"""What every client command shares: naming the servers, the offset store, output as a table or
JSON, and turning errors into one line for a person.

* **Servers**: ``--servers URLS`` (``--server`` is the old spelling, kept as an alias) takes
  ``meta://host:port[,meta://host:port...]`` or ``zk://host:port[,...][/root]``; without it the
  ``PYMETAQ_SERVERS`` environment variable, else ``meta://127.0.0.1:8123`` (the shipped
  config's broker). The string is checked here (a bad one is a usage error) and passed as it is
  to ``Producer``/``Consumer``.
* **Offset store**: ``--store``/``--offset-store`` SPEC is ``file:PATH`` | ``sqlite:PATH`` | a
  SQLAlchemy URL | ``zk://...``; without it ``file:~/.pymetaq_offsets``, the same file
  ``FileOffsetStore()`` and a grouped ``Consumer`` use by default.
* **Errors**: a command raises :class:`UsageError` (exit code 2) or :class:`CommandError`
  (exit code 1) with a message and an optional hint; :func:`describe_error` maps those and
  the client's own errors (no broker, unknown topic, an offset store that cannot be read, a
  missing extra, ...) to ``(message, hint, exit code)``. ``pymetaq.server.cli.main`` prints
  ``pymetaq <command>: <message>`` and ``hint: <hint>`` on stderr; never a traceback for
  these.

Thread-safety: a process entry point's helpers (no shared state).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any, TextIO

from pymetaq.client.errors import (
    AccessDenied,
    AuthenticationFailed,
    InvalidGroupName,
    MetaClientError,
    MissingDependency,
    NoBrokerAvailable,
    UnknownTopicOrPartition,
)
from pymetaq.client.protocol.names import topic_name_error
from pymetaq.offsets.base import CorruptOffsetData, OffsetStore, OffsetStoreError

#: the shipped configuration's broker (``pymetaq server`` with no ``-f``)
DEFAULT_SERVERS = "meta://127.0.0.1:8123"
SERVERS_ENV = "PYMETAQ_SERVERS"
SERVERS_HELP = (
    "meta://host:port[,...], meta+tls://host:port[,...]?ca=CA.pem[&cert=..&key=..][&user=..] "
    f"or zk://host:port[/root] (default: ${SERVERS_ENV}, else {DEFAULT_SERVERS})"
)
STORE_HELP = (
    "file:PATH | sqlite:PATH | SQLAlchemy URL | zk://... (default: file:~/.pymetaq_offsets)"
)

NO_BROKER_HINT = (
    "is a broker running there? `pymetaq server` starts one on meta://127.0.0.1:8123; "
    f"name others with --servers or ${SERVERS_ENV}"
)
UNKNOWN_TOPIC_HINT = (
    "`pymetaq topics` lists the topics the brokers serve; a new topic needs a [topic=NAME] "
    "section in the broker's server.ini"
)


class CommandError(Exception):
    """A command failed for a reason a person can act on: exit code 1, no traceback."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UsageError(CommandError):
    """The command line asks for something that cannot be done: exit code 2."""

    exit_code = 2


# ----------------------------------------------------------------------------- servers


def add_servers_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", "--server", dest="servers", metavar="URLS", help=SERVERS_HELP)


def servers_of(args: argparse.Namespace) -> str:
    """The servers string (checked): ``--servers``, ``$PYMETAQ_SERVERS`` or the default."""
    value: str = args.servers or os.environ.get(SERVERS_ENV) or DEFAULT_SERVERS
    where = "--servers" if args.servers else SERVERS_ENV if os.environ.get(SERVERS_ENV) else ""
    try:
        if value.strip().startswith("zk://"):
            from pymetaq.client.protocol.zk import parse_zk_url
            from pymetaq.client.transport.security import client_security

            head, _, query = value.strip().partition("?")
            parse_zk_url(head)
            if query:
                client_security(f"meta+tls://zk:1?{query}")
        else:
            from pymetaq.client.transport.servers import parse_servers

            parse_servers(value)
    except ValueError as e:
        raise UsageError(
            f"bad {where or 'servers'} {value!r}: {e}",
            "meta://host:port[,meta://host:port...] or zk://host:port[,...][/root]",
        ) from None
    return value.strip()


def meta_addresses(args: argparse.Namespace, command: str) -> list[tuple[str, int]]:
    """The brokers of ``--servers`` for commands that talk to each broker: a ``meta://`` list,
    or for ``zk://`` the masters registered in that ZooKeeper."""
    servers = servers_of(args)
    from pymetaq.client.transport.servers import parse_servers

    if servers.startswith("zk://"):
        tls = bool(servers.partition("?")[2])  # options on zk:// mean TLS, as for the clients
        return parse_servers(",".join(registered_masters(servers, args, tls=tls)))
    return parse_servers(servers)


def one_address(args: argparse.Namespace, command: str) -> tuple[str, int]:
    """The one broker a command talks to (``admin``, ``top``, ``tx``): ``--servers`` must
    name exactly one (a ``zk://`` registry with one master registered will do)."""
    found = meta_addresses(args, command)
    if len(found) != 1:
        names = ", ".join(f"meta://{h}:{p}" for h, p in found)
        raise UsageError(
            f"--servers names {len(found)} brokers ({names}); {command} talks to one",
            "give one: --servers meta://host:port",
        )
    return found[0]


def registered_masters(url: str, args: argparse.Namespace, *, tls: bool = False) -> list[str]:
    """``meta://host:port`` of every master registered under a ``zk://`` URL (sorted by
    broker id) - with ``tls``, the ``meta+tls://`` address each registered in ``master_tls``
    (a broker without one is left out, with a warning); :class:`CommandError` when none is."""
    import logging

    from pymetaq.client.cluster.session import connect
    from pymetaq.client.cluster.snapshot import read_cluster
    from pymetaq.client.protocol.zk import parse_zk_url

    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # our own message says it once
    zk_url = parse_zk_url(url.partition("?")[0])
    timeout = float(getattr(args, "timeout", 10.0) or 10.0)
    zk = connect(zk_url, session_timeout_s=max(timeout, 2.0), connect_timeout_s=timeout)
    try:
        snap = read_cluster(zk, zk_url.root)
        masters = [b.master for b in snap.brokers if b.master]
        if tls and masters:
            masters = _tls_masters(zk, zk_url.paths, [b for b in snap.brokers if b.master])
            if not masters:
                raise CommandError(
                    f"no broker registered under {url.partition('?')[0]} has a TLS listener",
                    "give the brokers tlsPort= (docs/security.md), or drop the TLS options",
                )
    finally:
        zk.stop()
        zk.close()
    if not masters:
        raise CommandError(
            f"no broker is registered under {url.partition('?')[0]}",
            "start brokers with zk.zkEnable=true and this zk.zkConnect/zk.zkRoot",
        )
    return masters


def _tls_masters(zk: Any, paths: Any, brokers: list[Any]) -> list[str]:
    """The ``master_tls`` addresses of ``brokers`` (those without one: a warning each)."""
    out = []
    for b in brokers:
        try:
            raw = zk.get(paths.broker_master_tls(b.broker_id))[0]
        except Exception:  # no such node
            raw = None
        if raw:
            out.append(raw.decode().strip())
        else:
            print(
                f"warning: broker {b.broker_id} ({b.master}) has no TLS listener: left out",
                file=sys.stderr,
            )
    return out


def security_of(args: argparse.Namespace, text: str | None = None) -> Any:
    """The :class:`~pymetaq.client.transport.security.ClientSecurity` of ``--servers`` (or
    ``text``): ``meta+tls://`` and the ``?ca=&cert=&key=&user=...`` options."""
    from pymetaq.client.transport.security import client_security

    value = text if text is not None else servers_of(args)
    if value.strip().startswith("zk://"):  # options on zk:// mean TLS (zkbrokers.py's rule)
        query = value.strip().partition("?")[2]
        value = f"meta+tls://zk:1?{query}" if query else "meta://zk:1"
    try:
        return client_security(value)
    except ValueError as e:
        raise UsageError(
            f"bad servers {value!r}: {e}",
            "meta+tls://host:port?ca=CA.pem[&cert=C.pem&key=K.pem][&user=NAME], see docs/security.md",
        ) from None


@contextmanager
def servers_in_use(servers: str) -> Iterator[None]:
    """Around a client's constructor: a servers string it cannot use is a usage error (a
    ``zk://`` address where this version of the client takes ``meta://`` only)."""
    try:
        yield
    except ValueError as e:
        raise UsageError(f"cannot use the servers {servers!r}: {e}") from None


# ----------------------------------------------------------------------------- arguments


def check_topic(topic: str) -> str:
    """A valid topic name, or a usage error saying why not."""
    why = topic_name_error(topic)
    if why is not None:
        raise UsageError(why)
    return topic


def check_group_arg(group: str | None) -> str | None:
    if group is None:
        return None
    from pymetaq.client.consumer.config import check_group

    try:
        return check_group(group)
    except InvalidGroupName as e:
        raise UsageError(str(e)) from None


def open_store(spec: str | None) -> OffsetStore:
    """``file:PATH`` | ``sqlite:PATH`` (or a sqlite URL) | a SQLAlchemy URL | ``zk://...``;
    ``None``: the default file store. A spec that names no store is a usage error."""
    from pymetaq.offsets import FileOffsetStore, open_offset_store

    if spec is None:
        return FileOffsetStore()
    if spec.startswith("sqlite:") and not spec.startswith("sqlite://"):
        spec = "sqlite:///" + spec[len("sqlite:") :]
    try:
        store: OffsetStore = open_offset_store(spec)
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad offset store {spec!r}: {e}", STORE_HELP) from None
    return store


def non_negative(kind: type[int] | type[float]) -> Any:
    """An argparse ``type=`` that accepts numbers >= 0 only."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


# ----------------------------------------------------------------------------- output


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Left-aligned columns, two spaces apart (the first row is the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def print_json(doc: Any, out: TextIO) -> None:
    out.write(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------- signals


class Terminated(KeyboardInterrupt):
    """SIGTERM (systemd, docker stop, ``timeout``) raised in the main thread, so a command
    stops the way Ctrl-C stops it (a consumer commits what it printed)."""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) at once, as Ctrl-C does."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StopRequest:
    """Set by the first SIGINT/SIGTERM under :func:`graceful_stop`."""

    requested = False


@contextmanager
def graceful_stop() -> Iterator[StopRequest]:
    """The first Ctrl-C or SIGTERM only asks the command to stop (it checks
    ``requested`` where stopping loses nothing: between two messages, after a poll); a second
    one raises :class:`Terminated` at once."""
    stop = StopRequest()

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.requested:
            raise Terminated()
        stop.requested = True

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ----------------------------------------------------------------------------- errors


AUTH_HINT = (
    "check ?user= in --servers and the password ($PYMETAQ_PASSWORD or ?password_file=); "
    "see docs/security.md"
)
ACCESS_HINT = (
    "the broker's [user=NAME] section grants publish/subscribe/groups/admin (docs/security.md)"
)


def describe_error(exc: BaseException) -> tuple[str, str | None, int] | None:
    """``(message, hint, exit code)`` for an error a person caused or can fix; None for a bug
    (which keeps its traceback)."""
    if isinstance(exc, CommandError):
        return str(exc), exc.hint, exc.exit_code
    if isinstance(exc, InvalidGroupName):
        return str(exc), None, 2
    if isinstance(exc, MissingDependency):
        return str(exc), None, 1
    if isinstance(exc, NoBrokerAvailable):
        return str(exc), NO_BROKER_HINT, 1
    if isinstance(exc, UnknownTopicOrPartition):
        return str(exc), UNKNOWN_TOPIC_HINT, 1
    if isinstance(exc, CorruptOffsetData):
        return (
            f"the offset store cannot be read: {exc}",
            "fix it, or move it aside to start over (groups then start at their initial "
            "position; `pymetaq offsets reset` sets positions)",
            1,
        )
    if isinstance(exc, OffsetStoreError):
        return f"the offset store cannot be used: {exc}", None, 1
    if isinstance(exc, AuthenticationFailed):
        return str(exc), AUTH_HINT, 1
    if isinstance(exc, AccessDenied):
        return str(exc), ACCESS_HINT, 1
    if isinstance(exc, MetaClientError):
        return str(exc), None, 1
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}", None, 1
    return None
