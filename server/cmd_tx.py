"""``pymetaq tx list|commit|rollback|forget``: operate on one broker's transactions.

- ``list`` sends ``stats transactions`` and prints a table of the open transactions and the
  heuristic decisions not yet forgotten;
- ``commit KEY`` / ``rollback KEY`` decide a PREPARED XA branch heuristically (``txadmin``,
  accepted by the broker from a loopback address only); the branch's coordinator later gets
  XA_HEURCOM / XA_HEURRB for it, until ``forget KEY`` (or the coordinator's FORGET).

``--servers`` (``--server``) names the broker: ``meta://host:port``, ``host:port``, or a
``zk://`` registry with one master (default ``$PYMETAQ_SERVERS``, else 127.0.0.1:8123); exit code 0 on success, 1 when the
broker refuses or cannot be reached (with its reason on stderr, no traceback).

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pymetaq.client.cli.common import add_servers_option, one_address, print_json
from pymetaq.client.cli.wire import round_trip
from pymetaq.client.protocol import StatsCommand, TxAdminCommand, TxAdminOp, parse_tx_key
from pymetaq.client.protocol.errors import InvalidTxKey

XA_NAMES = {
    0: "XA_OK",
    3: "XA_RDONLY",
    6: "XA_HEURRB",
    7: "XA_HEURCOM",
    8: "XA_HEURHAZ",
    104: "XA_RBOTHER",
    106: "XA_RBTIMEOUT",
    -3: "XAER_RMERR",
    -4: "XAER_NOTA",
    -5: "XAER_INVAL",
    -6: "XAER_PROTO",
    -7: "XAER_RMFAIL",
    -8: "XAER_DUPID",
}
COLUMNS = ("KEY", "STATE", "XA", "MESSAGES", "BYTES", "AGE", "TIMEOUT", "PARTITIONS")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tx", help="list a broker's transactions; decide prepared XA branches"
    )
    p.add_argument("action", choices=("list", "commit", "rollback", "forget"))
    p.add_argument("key", nargs="?", help="the XA key (XID:<formatId>:<gtrid>:<bqual>:<qualifier>)")
    add_servers_option(p)
    p.add_argument("--json", action="store_true", help="list: print JSON")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds (default %(default)s)")
    p.set_defaults(func=run)


def describe_error(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    if text.startswith("XAException:code="):
        code_text, _, msg = text[len("XAException:code=") :].partition(",msg=")
        try:
            code = int(code_text)
        except ValueError:
            return text
        return f"{XA_NAMES.get(code, 'XA error')} ({code}): {msg}"
    return text


def rows(body: bytes) -> list[tuple[str, ...]]:
    """The table rows of a ``stats transactions`` body."""
    out: list[tuple[str, ...]] = []
    for line in body.decode("utf-8", "replace").split("\r\n"):
        tokens = line.split(" ")
        if len(tokens) < 15 or line in ("STATS", "END"):
            continue
        key, kv = tokens[0], dict(zip(tokens[1::2], tokens[2::2]))
        age = f"{int(kv.get('age_ms', '0')) / 1000:.1f}s"
        timeout = f"{kv['timeout_s']}s" if kv.get("timeout_s", "0") != "0" else "-"
        xa = "yes" if kv.get("xa") == "true" else "no"
        out.append(
            (key, kv["state"], xa, kv["messages"], kv["bytes"], age, timeout, kv["partitions"])
        )
    return out


def table(data: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [COLUMNS, *data]) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [COLUMNS, *data]
    )


def run(args: argparse.Namespace) -> int:
    prog = f"pymetaq tx {args.action}"
    address = one_address(args, f"tx {args.action}")
    try:
        if args.action == "list":
            request: Any = StatsCommand("transactions", 1)
        else:
            if not args.key:
                print(
                    f"{prog}: give the XA key of the branch, e.g. XID:1:0a0b:0c:app",
                    file=sys.stderr,
                )
                return 2
            parse_tx_key(args.key)
            request = TxAdminCommand(TxAdminOp(args.action), args.key, 1)
        reply = round_trip(*address, request, args.timeout)
    except (OSError, ValueError, InvalidTxKey) as exc:
        print(f"{prog}: meta://{address[0]}:{address[1]}: {exc}", file=sys.stderr)
        return 1
    if reply.code != 200:
        print(f"{prog}: {describe_error(reply.body)}", file=sys.stderr)
        return 1
    if args.action == "list":
        data = rows(reply.body)
        if args.json:
            keys = [c.lower() for c in COLUMNS]
            docs: list[dict[str, str | int]] = [dict(zip(keys, row)) for row in data]
            for d in docs:  # numbers as numbers
                d["messages"], d["bytes"] = int(d["messages"]), int(d["bytes"])
            print_json(docs, sys.stdout)
        else:
            print(table(data) if data else "no open transactions")
        return 0
    done = {"commit": "committed heuristically", "rollback": "rolled back heuristically"}
    print(f"{args.key}: {done.get(args.action, 'forgotten')}")
    return 0
