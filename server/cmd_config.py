"""``pymetaq config --print``: write the packaged default ``server.ini`` to stdout.

``pymetaq config --print > server.ini`` gives a file to edit; ``pymetaq server -f server.ini``
runs it. (``pymetaq server`` without ``-f`` runs the default itself.)

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pymetaq.server.default_config import default_text


def add_parser(subparsers: Any) -> None:
    text = "print the packaged default server.ini (to edit: pymetaq config --print > server.ini)"
    p = subparsers.add_parser("config", help=text, description=text)
    p.add_argument(
        "--print", dest="print_default", action="store_true", required=True, help="print it"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(default_text())
    return 0
