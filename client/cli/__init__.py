"""The client's ``pymetaq`` subcommands: ``produce``, ``consume``, ``offsets``, ``topics``,
``stats``, ``top``, ``admin``, ``cluster``, ``verify`` (two replicas compared), ``tail`` (log
shipping), ``cdc`` (change data capture) (what they share — servers, offset stores, output,
errors — is in ``common``).

``pymetaq.server.cli`` (which keeps ``main()``) imports this package and the server's own
commands explicitly and calls :func:`add_parsers` once; each command module has
``add_parser(subparsers)``, which adds its parser and sets ``func(args) -> int``.

Thread-safety: a process entry point.
"""

from __future__ import annotations

from typing import Any

from pymetaq.client.cli import (
    admin,
    cdc,
    cluster,
    consume,
    offsets,
    produce,
    stats,
    tail,
    top,
    topics,
    verify,
)


def add_parsers(subparsers: Any) -> None:
    """Register every client command on an ``ArgumentParser``'s subparsers."""
    for command in (
        produce,
        consume,
        offsets,
        topics,
        stats,
        top,
        admin,
        cluster,
        verify,
        tail,
        cdc,
    ):
        command.add_parser(subparsers)
