"""The ``pymetaq`` command: argparse with one subcommand per module, and the one error handler.

The server's commands (``server``; ``check`` and ``repair``; ``config``; ``tx``; ``security``) and the client's
(``produce``, ``consume``, ``offsets``, ``stats``, ``topics``:
:func:`pymetaq.client.cli.add_parsers`) are imported explicitly; each command module adds its
parser and sets ``func(args) -> int`` as the default.

Errors: a user's error never ends in a traceback. :func:`main` prints
``pymetaq <command>: <message>`` and, when there is one, ``hint: <what to do>`` on stderr, and
exits with **2** for a usage error (a bad argument, a configuration error) and **1** for a
runtime one (no broker, unknown topic, an offset store that cannot be read, a missing extra,
the port in use); see :func:`pymetaq.client.cli.common.describe_error`. Ctrl-C exits with 130.
Anything else is a bug and keeps its traceback.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pymetaq.client import __version__
from pymetaq.client import cli as client_cli
from pymetaq.client.cli.common import describe_error
from pymetaq.server import cmd_check, cmd_config, cmd_security, cmd_server, cmd_tx
from pymetaq.server.errors import ConfigError, StartupError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pymetaq", description="pymetaq: a MetaQ-compatible persistent message queue"
    )
    parser.add_argument("--version", action="version", version=f"pymetaq {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    cmd_server.add_parser(subparsers)
    cmd_check.add_parser(subparsers)
    cmd_config.add_parser(subparsers)
    cmd_tx.add_parser(subparsers)
    cmd_security.add_parser(subparsers)
    client_cli.add_parsers(subparsers)
    return parser


def _describe(exc: BaseException) -> tuple[str, str | None, int] | None:
    if isinstance(exc, ConfigError):
        return f"configuration error: {exc}", None, 2
    if isinstance(exc, StartupError):
        return str(exc), None, 1
    return describe_error(exc)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    name = " ".join(x for x in (args.command, getattr(args, "action", None)) if x)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`pymetaq consume ... | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        described = _describe(exc)
        if described is None:
            raise
        message, hint, code = described
        sys.stdout.flush()
        print(f"pymetaq {name}: {message}", file=sys.stderr)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
