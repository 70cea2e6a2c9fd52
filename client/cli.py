"""The producer's ``pymetaq`` subcommand, registered by ``pymetaq.server.cli``.

``pymetaq.server.cli`` imports ``pymetaq.client.cli`` (this module: ``produce``, from
:mod:`pymetaq.client.cli_produce`) next to ``pymetaq.client.cli_consume`` and
``pymetaq.client.cli_offsets``, and calls ``add_parser(subparsers)`` on each.

Thread-safety: a process entry point.
"""

from __future__ import annotations

from typing import Any

from pymetaq.client import cli_produce


def add_parser(subparsers: Any) -> None:
    cli_produce.add_parser(subparsers)
