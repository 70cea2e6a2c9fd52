"""``pymetaq server -f conf/server.ini``: run a broker in the foreground.

Logs to stderr; the first INFO line after recovery is
``pymetaq broker <id> listening on <host>:<port> (data: <abs path>)``.  Exit codes: 0 after a
clean stop (SIGTERM/SIGINT), 2 for a configuration error (the message names the file, line,
section and key, with a did-you-mean hint), 1 for any other startup or runtime failure.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from pymetaq.server.errors import ConfigError


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("server", help="run a broker in the foreground")
    p.add_argument("-f", "--config", required=True, help="path of server.ini (MetaQ format)")
    p.add_argument("--port", type=int, default=None, help="override [system] serverPort")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=run)


def _raise_fd_limit() -> None:
    """Connections and get replies each hold a descriptor: lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from pymetaq.server.broker import Broker
    from pymetaq.server.config import load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"pymetaq: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.port is not None:
        config = config.with_system(server_port=args.port)
    _raise_fd_limit()
    code: int = Broker(config).run()
    return code
