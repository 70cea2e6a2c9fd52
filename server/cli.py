"""The ``pymetaq`` command: argparse with one subcommand per module.

The server's commands (``server``; ``check`` and ``repair``; ``tx``) and the client's (``produce``, ``consume``, ``offsets``,
``stats``: :func:`pymetaq.client.cli.add_parsers`) are imported explicitly; each command module
adds its parser and sets ``func(args) -> int`` as the default.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pymetaq.client import cli as client_cli
from pymetaq.server import cmd_check, cmd_server, cmd_tx


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pymetaq", description="pymetaq: a MetaQ-compatible persistent message queue"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    cmd_server.add_parser(subparsers)
    cmd_check.add_parser(subparsers)
    cmd_tx.add_parser(subparsers)
    client_cli.add_parsers(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
