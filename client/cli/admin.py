"""``pymetaq admin``: a broker's operations (MetaQ's JMX tools), over the ``admin`` command.

```
pymetaq admin close TOPIC PARTITIONS     # 3 or 0-3: puts there answer 403 until opened
pymetaq admin open TOPIC [PARTITIONS]    # no PARTITIONS: every closed partition of TOPIC
pymetaq admin closed                     # which partitions are closed
pymetaq admin reload                     # re-read the config's [topic=...] sections
pymetaq admin slaves                     # replication status
```

``--servers`` (``--server``) names the broker: ``meta://host:port``, ``host:port``, or a
``zk://`` registry with one master (default ``$PYMETAQ_SERVERS``, else 127.0.0.1:8123).  The broker accepts ``admin`` only from its
own host (a loopback address) until it authenticates clients.  Prints the broker's answer;
exit code 0 on success, 1 on a refusal or a connection failure, 2 on a usage error.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pymetaq.client.cli.common import add_servers_option, one_address
from pymetaq.client.cli.wire import round_trip
from pymetaq.client.protocol import AdminCommand


def partitions(text: str) -> tuple[str, str]:
    """``3`` -> ("3", "3"); ``0-3`` -> ("0", "3")."""
    start, sep, end = text.partition("-")
    if not start.isdigit() or (sep and not end.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a partition (3) or a range (0-3)")
    if sep and int(end) < int(start):
        raise argparse.ArgumentTypeError(f"{text!r}: the range ends before it starts")
    return start, end if sep else start


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "admin",
        help="close/open partitions, reload the config, slave status",
        description="Operations on one broker (accepted from the broker's own host only).",
    )
    add_servers_option(p)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds (default %(default)s)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    close = actions.add_parser("close", help="close partitions for publishing (puts get 403)")
    close.add_argument("topic")
    close.add_argument("partitions", type=partitions, metavar="PARTITIONS", help="3 or 0-3")
    opened = actions.add_parser("open", help="accept puts again")
    opened.add_argument("topic")
    opened.add_argument(
        "partitions", type=partitions, nargs="?", metavar="PARTITIONS", help="default: all"
    )
    actions.add_parser("closed", help="list the closed partitions")
    actions.add_parser("reload", help="re-read the config file's [topic=...] sections")
    actions.add_parser("slaves", help="replication status")
    for action in actions.choices.values():  # --servers after the action works too
        action.add_argument(
            "--servers", "--server", dest="servers", default=argparse.SUPPRESS, help="as above"
        )
    p.set_defaults(func=run)


def command(args: argparse.Namespace) -> AdminCommand:
    extra: tuple[str, ...] = ()
    if args.action in ("close", "open"):
        extra = (args.topic, *(args.partitions or ()))
    return AdminCommand(args.action, extra, 1)


def run(args: argparse.Namespace) -> int:
    host, port = one_address(args, "admin")
    try:
        reply = round_trip(host, port, command(args), args.timeout)
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        print(f"pymetaq admin: {host}:{port}: {reason} (is the broker running?)", file=sys.stderr)
        return 1
    text = reply.body.decode("utf-8", "replace").replace("\r\n", "\n")
    if reply.code != 200:
        print(f"pymetaq admin: refused ({reply.code}): {text}", file=sys.stderr)
        return 1
    print(text)
    return 0
