"""The ``pymetaq`` command: argparse with one subcommand per module.

Subcommands are registered by modules listed in ``SUBCOMMANDS``; each exposes
``add_parser(subparsers)`` which adds its parser and sets ``func(args) -> int`` as the default.
Modules in ``OPTIONAL_SUBCOMMANDS`` (other folders' commands: produce, consume, offsets) are
registered when they exist, so a folder can add a command without editing this file's logic -
only these lists; a command registered twice (a module listed here and also registered by
another listed module) is registered once.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS: tuple[str, ...] = (
    "pymetaq.server.cmd_server",
    "pymetaq.server.cmd_stats",
    "pymetaq.server.cmd_tx",
)
OPTIONAL_SUBCOMMANDS: tuple[str, ...] = (
    "pymetaq.client.cli",
    "pymetaq.client.cli_consume",
    "pymetaq.client.cli_offsets",
    "pymetaq.offsets.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pymetaq", description="pymetaq: a MetaQ-compatible persistent message queue"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(name).add_parser(subparsers)
    for name in OPTIONAL_SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue  # the module does not exist (yet)
            raise
        try:
            module.add_parser(subparsers)
        except argparse.ArgumentError as exc:  # already registered through another module
            if "conflicting subparser" not in str(exc):
                raise
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
