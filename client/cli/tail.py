"""``pymetaq tail``: follow log files into a topic (the log shipping agent, MetaQ's tail4j).

```
pymetaq tail --config FILE [--servers URLS]
pymetaq tail --topic T [--servers URLS] [--checkpoint FILE] [--multiline-start REGEX]
             [--encoding CHARSET] [--compression lz4] [--no-ordered] [--no-attributes]
             [--start-position beginning|end] PATH_OR_GLOB...
(both: [--once] [--quiet])
```

* ``--config``: the INI file (tail4j's layout) or ``.toml`` with the same sections, one
  source per section (:mod:`pymetaq.client.tail.config`); ``--servers`` overrides its
  ``[meta] server_url``.
* The flags describe one source: the paths/globs to follow, the topic, the checkpoint
  (default ``~/.pymetaq_tail/<topic>.json``).
* ``--once``: exit when every file is read to its end (a last line without its newline is
  left for the next run; a last multi-line record is sent after ``multiline_timeout``) and every line is acknowledged; else it runs until Ctrl-C / SIGTERM:
  then it waits for what is in flight, writes the checkpoint and
  prints ``shipped N lines`` on stderr (exit 0). A bad flag or config is exit 2, a broker that
  cannot be reached or an unknown topic at start exit 1; later failures are retried.

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType
from typing import IO, Any

from pymetaq.client.cli.common import (
    Terminated,
    UsageError,
    add_servers_option,
    check_topic,
    servers_of,
)

CONFIG_HINT = "see `pymetaq tail --help` and docs/tail.md for the file's sections and keys"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("tail", help="follow log files into a topic (log shipping agent)")
    add_servers_option(p)
    p.add_argument("--config", metavar="FILE", help="INI (tail4j's layout) or .toml file")
    p.add_argument("--topic", help="the topic (without --config)")
    p.add_argument("paths", nargs="*", metavar="PATH_OR_GLOB", help="files to follow")
    p.add_argument("--checkpoint", metavar="FILE", help="default ~/.pymetaq_tail/<topic>.json")
    p.add_argument("--multiline-start", metavar="REGEX", help="a record starts at a match")
    p.add_argument("--encoding", metavar="CHARSET", help="re-encode lines to UTF-8 from this")
    p.add_argument("--compression", choices=["lz4"], default=None)
    p.add_argument(
        "--ordered",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one partition per file (default); --no-ordered spreads chunks round-robin",
    )
    p.add_argument(
        "--attributes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="host=...;file=... in each message's attribute (default)",
    )
    p.add_argument("--start-position", choices=["beginning", "end"], default="beginning")
    p.add_argument(
        "--once",
        action="store_true",
        help="exit once every file is read to its end and every line acknowledged",
    )
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    p.set_defaults(func=run)


def agent_config(args: argparse.Namespace) -> Any:
    from pymetaq.client.tail.config import ConfigError, config_from_sections, load_config

    try:
        if args.config:
            if args.topic or args.paths:
                raise UsageError("give --config or --topic with paths, not both")
            return load_config(args.config)
        if not args.topic or not args.paths:
            raise UsageError(
                "name a --topic and the files to follow (or a --config file)",
                "e.g. pymetaq tail --topic app-logs '/var/log/app/*.log'",
            )
        check_topic(args.topic)
        checkpoint = args.checkpoint or os.path.join("~/.pymetaq_tail", args.topic + ".json")
        checkpoint = os.path.abspath(os.path.expanduser(checkpoint))
        values = {
            "topic": args.topic,
            "paths": ",".join(args.paths),
            "compress": "true" if args.compression else "false",
            "ordered": "true" if args.ordered else "false",
            "attributes": "true" if args.attributes else "false",
            "start_position": args.start_position,
            "checkpoint_name": os.path.basename(checkpoint).removesuffix(".json"),
        }
        if args.multiline_start:
            values["multiline_start"] = args.multiline_start
        if args.encoding:
            values["encoding"] = args.encoding
        sections = {
            "system": {"checkpoint_path": os.path.dirname(checkpoint)},
            args.topic: values,
        }
        return config_from_sections("command line", sections)
    except ConfigError as e:
        raise UsageError(str(e), CONFIG_HINT) from None


def run(args: argparse.Namespace, err: IO[str] | None = None) -> int:
    err = err or sys.stderr
    cfg = agent_config(args)
    for src in cfg.sources:
        check_topic(src.topic)
    if not args.servers and not os.environ.get("PYMETAQ_SERVERS") and cfg.servers:
        args.servers = cfg.servers
    servers = servers_of(args)
    from pymetaq.client.tail.agent import TailAgent
    from pymetaq.client.tail.checkpoint import CheckpointError

    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("pymetaq tail: %(message)s"))
    logger = logging.getLogger("pymetaq.tail")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if args.quiet else logging.INFO)
    agent = TailAgent(cfg, servers, once=args.once)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if agent.stopping:
            raise Terminated()  # a second Ctrl-C: stop at once
        agent.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            agent.start()
        except CheckpointError as e:
            raise UsageError(str(e)) from None
        names = ", ".join(f"{s.name} -> {s.topic}" for s in cfg.sources)
        logger.info(
            "following %s (checkpoints: %s)", names, ", ".join(s.checkpoint for s in cfg.sources)
        )
        agent.run()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        logger.removeHandler(handler)
    n = agent.acked_lines()
    err.write(f"shipped {n:,} line{'' if n == 1 else 's'}\n")
    return 0
