"""``pymetaq security hash-password``: the value of ``[user=NAME] password=`` in server.ini.

Reads the password from the terminal (asked twice) or, with ``--stdin``, from the first line
of standard input (for scripts: ``printf '%s\\n' "$PW" | pymetaq security hash-password
--stdin``), and prints ``scrypt$...`` (see :mod:`pymetaq.server.security.passwords`).  The
password itself is never printed.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from pymetaq.server.errors import ConfigError
from pymetaq.server.security.passwords import DEFAULT_LOG_N, hash_password


def add_parser(subparsers: Any) -> None:
    text = "security tools (hash-password: the value of [user=NAME] password=)"
    p = subparsers.add_parser("security", help=text, description=text)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    h = actions.add_parser(
        "hash-password",
        help="print the scrypt hash of a password for server.ini",
        description="print the scrypt hash of a password for [user=NAME] password= in server.ini",
    )
    h.add_argument("--stdin", action="store_true", help="read the password from stdin's first line")
    h.add_argument(
        "--log-n",
        type=int,
        default=DEFAULT_LOG_N,
        metavar="N",
        help=f"scrypt cost: 2**N iterations (default {DEFAULT_LOG_N})",
    )
    h.set_defaults(func=run_hash)


def run_hash(args: argparse.Namespace) -> int:
    if not 10 <= args.log_n <= 20:
        raise ConfigError(f"--log-n {args.log_n}: expected 10..20")
    if args.stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise ConfigError("the two passwords differ")
    if not password:
        raise ConfigError("empty password")
    print(hash_password(password, log_n=args.log_n))
    return 0
