"""``pymetaq server [-f server.ini]``: run a broker in the foreground.

Without ``-f`` the broker runs the packaged standalone configuration
(:mod:`pymetaq.server.default_config`: 127.0.0.1:8123, no ZooKeeper, data in ``./data``).
Logs to stderr, one readable line per event; the first INFO line after recovery is
``pymetaq broker <id> listening on <host>:<port> (data: <abs path>)``.  Exit codes: 0 after a
clean stop (SIGTERM/SIGINT), 2 for a configuration error (the message names the file, line,
section and key, with a did-you-mean hint), 1 when the broker cannot start (the port is in use,
the data directory is locked or unwritable, ZooKeeper is unreachable) or fails later; startup
errors are raised to ``pymetaq.server.cli.main``, which prints them without a traceback.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "server",
        help="run a broker in the foreground",
        description="Run a broker in the foreground (Ctrl-C or SIGTERM stops it cleanly).",
    )
    p.add_argument(
        "-f",
        "--config",
        help="path of server.ini (MetaQ format); default: the packaged standalone "
        "configuration (127.0.0.1:8123, data in ./data; `pymetaq config --print` shows it)",
    )
    p.add_argument("--port", type=int, default=None, help="override [system] serverPort")
    p.add_argument(
        "-F",
        dest="plugins",
        action="append",
        default=[],
        metavar="PLUGIN=FILE",
        help="MetaQ's plugin option: -Fmetaslave=async_slave.properties runs this broker as an "
        "asynchronous slave of the master with the same brokerId (needs ZooKeeper); "
        "-Fsamsa=samsa_master.properties as the master of a synchronous pair, "
        "-Fgregor=gregor_slave.properties as its slave",
    )
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


def _plugins(options: list[str]) -> Any:
    """The ``-F`` options, their files checked (ConfigError: exit code 2)."""
    from pymetaq.ha.config import HaConfigError, load_plugins
    from pymetaq.server.errors import ConfigError

    try:
        return load_plugins(options)
    except HaConfigError as e:
        raise ConfigError(str(e)) from e


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from pymetaq.server import default_config
    from pymetaq.server.broker import Broker

    config = default_config.load(args.config)  # ConfigError: exit code 2 (server/cli.py)
    if args.config is None:
        logging.getLogger("pymetaq.server").info(
            "no -f: running the packaged standalone configuration "
            "(`pymetaq config --print > server.ini` writes it out to edit)"
        )
    if args.port is not None:
        config = config.with_system(server_port=args.port)
    plugins = _plugins(args.plugins)
    _raise_fd_limit()
    broker = Broker(
        config, slave_config=plugins.metaslave, samsa=plugins.samsa, gregor=plugins.gregor
    )
    code: int = broker.run()
    return code
