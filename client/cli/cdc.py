"""``pymetaq cdc capture`` and ``pymetaq cdc apply``: ordered binlog replication from
PostgreSQL into a replica database through a topic (:mod:`pymetaq.client.cdc`).

```
pymetaq cdc capture --source URL --topic T [--slot NAME] [--partitioning total|key]
                    [--no-create-slot] [--spool-dir DIR] [--batch-changes N] [--once]
pymetaq cdc apply --topic T [--target URL] [--group G] [--batch-transactions N]
                  [--idle-timeout S]
(both: [--servers URLS] [--quiet])
```

``capture`` runs until Ctrl-C / SIGTERM (``--once``: until the slot holds no committed change
that is not published and acknowledged); ``apply`` until Ctrl-C / SIGTERM or ``--idle-timeout``
seconds without a message. Each prints what it did on stderr when it stops (exit 0). A bad flag
is exit 2; a database or broker that cannot be used, or a replica that does not fit the
changes, exit 1 with the reason.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import IO, Any

from pymetaq.client.cli.common import (
    CommandError,
    Terminated,
    UsageError,
    add_servers_option,
    check_group_arg,
    check_topic,
    non_negative,
    servers_of,
)

SLOT_PREFIX = "pymetaq_"
DEFAULT_TARGET = "sqlite:///replica.db"
DEFAULT_GROUP = "cdc-replica"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "cdc", help="change data capture: PostgreSQL -> topic -> replica database"
    )
    sub = p.add_subparsers(dest="cdc_command", metavar="{capture,apply}", required=True)
    c = sub.add_parser("capture", help="publish a PostgreSQL slot's transactions in commit order")
    add_servers_option(c)
    c.add_argument("--source", required=True, metavar="URL",
                   help="the source database: postgresql://user@host:port/db")  # fmt: skip
    c.add_argument("--topic", required=True)
    c.add_argument("--slot",
                   help="logical replication slot (test_decoding; default pymetaq_<topic>, "
                   "'-' and '.' as '_')")  # fmt: skip
    c.add_argument("--partitioning", choices=["total", "key"], default="total",
                   help="total: one partition, whole transactions (default); "
                   "key: by table and primary key")  # fmt: skip
    c.add_argument("--create-slot", action=argparse.BooleanOptionalAction, default=True,
                   help="create the slot if it is missing (default)")  # fmt: skip
    c.add_argument("--spool-dir", metavar="DIR",
                   help="the ordered producer's spool (default ~/.pymetaq_cdc/<slot>)")  # fmt: skip
    c.add_argument("--batch-changes", type=int, default=1000, metavar="N",
                   help="changes read from the slot per round (whole transactions)")  # fmt: skip
    c.add_argument("--once", action="store_true",
                   help="exit once every committed change is published and acknowledged")  # fmt: skip
    c.add_argument("--quiet", action="store_true", help="log warnings only")
    c.set_defaults(func=run_capture)
    a = sub.add_parser("apply", help="apply a CDC topic to a replica database, exactly once")
    add_servers_option(a)
    a.add_argument("--topic", required=True)
    a.add_argument("--target", default=DEFAULT_TARGET, metavar="URL",
                   help=f"the replica: a SQLAlchemy URL (default {DEFAULT_TARGET})")  # fmt: skip
    a.add_argument("--group", default=DEFAULT_GROUP,
                   help=f"consumer group (offsets kept in the replica; default {DEFAULT_GROUP})")  # fmt: skip
    a.add_argument("--batch-transactions", type=int, default=500, metavar="N",
                   help="source transactions per replica transaction at most")  # fmt: skip
    a.add_argument("--idle-timeout", type=non_negative(float), metavar="S",
                   help="exit after S seconds without a message")  # fmt: skip
    a.add_argument("--quiet", action="store_true", help="log warnings only")
    a.set_defaults(func=run_apply)


def database_url(url: str, flag: str) -> str:
    """A SQLAlchemy URL; ``postgresql://`` / ``postgres://`` mean the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if "://" not in url:
        raise UsageError(
            f"{flag} {url!r} is not a database URL",
            "e.g. postgresql://postgres@127.0.0.1:5432/shop or sqlite:///replica.db",
        )
    return url


@contextmanager
def _logging(err: IO[str], quiet: bool, command: str) -> Iterator[None]:
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter(f"pymetaq {command}: %(message)s"))
    logger = logging.getLogger("pymetaq.cdc")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)


@contextmanager
def _stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            raise Terminated()  # a second Ctrl-C: stop at once
        stopping = True
        stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def _database_errors(which: str) -> Iterator[None]:
    import sqlalchemy as sa

    try:
        yield
    except sa.exc.DBAPIError as e:
        raise CommandError(
            f"the {which} database: {str(e.orig).strip() or e}",
            "is it running, and is the URL right?",
        ) from None
    except sa.exc.ArgumentError as e:
        raise UsageError(f"bad {which} URL: {e}") from None


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise UsageError(f"{flag} must be at least 1, not {value}")
    return value


def run_capture(args: argparse.Namespace, err: IO[str] | None = None) -> int:
    err = err or sys.stderr
    check_topic(args.topic)
    servers = servers_of(args)
    source = database_url(args.source, "--source")
    from pymetaq.client.cdc.capture import Capture, CaptureConfig

    slot = args.slot or SLOT_PREFIX + re.sub(r"[^a-z0-9_]", "_", args.topic.lower())
    if not re.fullmatch(r"[a-z0-9_]{1,63}", slot):
        raise UsageError(
            f"bad slot name {slot!r}: PostgreSQL slot names are 1-63 of a-z, 0-9 and _",
            "name one with --slot",
        )
    spool = args.spool_dir or os.path.join("~/.pymetaq_cdc", slot)
    cfg = CaptureConfig(
        source=source,
        slot=slot,
        topic=args.topic,
        spool_dir=os.path.abspath(os.path.expanduser(spool)),
        partitioning=args.partitioning,
        create_slot=args.create_slot,
        batch_changes=_positive(args.batch_changes, "--batch-changes"),
    )
    with _logging(err, args.quiet, "cdc capture"), _database_errors("source"):
        cap = Capture(cfg, servers)
        with _stop_on_signals(cap.stop):
            st = cap.run(once=args.once)
    err.write(
        f"captured {_n(st.transactions, 'transaction')} ({_n(st.changes, 'change')}, "
        f"{_n(st.messages, 'message')}) from slot {slot}"
        + (f", confirmed up to {st.confirmed_lsn}" if st.confirmed_lsn else "")
        + "\n"
    )
    return 0


def run_apply(args: argparse.Namespace, err: IO[str] | None = None) -> int:
    err = err or sys.stderr
    check_topic(args.topic)
    group = check_group_arg(args.group)
    assert group is not None
    servers = servers_of(args)
    target = database_url(args.target, "--target")
    from pymetaq.client.cdc.apply import Applier, ApplyConfig

    cfg = ApplyConfig(
        target=target,
        topic=args.topic,
        group=group,
        batch_transactions=_positive(args.batch_transactions, "--batch-transactions"),
    )
    with _logging(err, args.quiet, "cdc apply"), _database_errors("target"):
        app = Applier(cfg, servers)
        try:
            with _stop_on_signals(app.stop):
                st = app.run(idle_timeout_s=args.idle_timeout)
        finally:
            app.close()
    err.write(
        f"applied {_n(st.transactions, 'transaction')} ({_n(st.changes, 'change')}; "
        f"{st.duplicates:,} replayed ones skipped) to {target}\n"
    )
    return 0
