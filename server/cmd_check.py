"""``pymetaq check`` and ``pymetaq repair``: the operator's tools for damaged partition logs.

::

    pymetaq check  [-f server.ini] [--topic T] [--quick] [--json]   read-only report
    pymetaq repair [-f server.ini] [--topic T]                      fix, with the broker stopped
    (or --data-path DIR instead of -f; neither: the packaged default's ./data, as
    ``pymetaq server`` without -f)

``check`` (``--json``: the same report as JSON) walks every partition directory under ``dataPath`` (and per-topic ``dataPath`` s):
each segment record by record (``--quick``: only the newest), continuity between segments,
interrupted rolls, the high-water mark.  It never writes, and may run next to a live broker
(whose newest segment tails it then does not judge).  Exit code 0: no damage; 1: damage found;
2: the command could not run (configuration error, no such directory).

``repair`` takes the data directory's lock (so it refuses while a broker runs), then fixes what
``check`` reports, printing every action: damaged files are **moved aside**
(``<name>.damaged-<n>``, never deleted), the good prefix of a partly damaged segment is written
back, missing ranges become accepted gaps (consumers are moved past them), and each partition is
opened and closed once the way the broker opens it.  Exit code 0: every partition is healthy
afterwards; 1: something is still damaged; 2: could not run (broker running, configuration).

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import Any

from pymetaq.client.cli.common import UsageError
from pymetaq.server import default_config
from pymetaq.storage.check import PartitionCheck, check_partition, repair_partition
from pymetaq.storage.datadir import DataDirLock, lock_holder
from pymetaq.storage.errors import StorageError
from pymetaq.storage.segment import parse_partition_dir


def add_parser(subparsers: Any) -> None:
    for name, func, text in (
        ("check", run_check, "report damaged partition logs (read-only)"),
        ("repair", run_repair, "repair damaged partition logs (broker stopped)"),
    ):
        p = subparsers.add_parser(name, help=text, description=text)
        where = p.add_mutually_exclusive_group()
        where.add_argument(
            "-f",
            "--config",
            help="server.ini: check its dataPath(s) (default: the packaged default's ./data)",
        )
        where.add_argument("--data-path", help="a data directory (instead of -f)")
        p.add_argument("--topic", help="only this topic's partitions")
        if name == "check":
            p.add_argument("--quick", action="store_true", help="walk only the newest segments")
            p.add_argument("--json", action="store_true", help="print JSON (same exit code)")
        p.set_defaults(func=func)


def _roots(args: argparse.Namespace) -> list[str]:
    if args.data_path:
        return [os.path.abspath(args.data_path)]
    config = default_config.load(args.config)  # ConfigError: exit code 2 (server/cli.py)
    roots = [config.system.data_path]
    roots += [t.data_path for t in config.topics if t.data_path and t.data_path not in roots]
    return roots


def _partitions(root: str, topic: str | None) -> list[tuple[str, int, str]]:
    found = []
    for name in sorted(os.listdir(root)):
        parsed = parse_partition_dir(name)
        path = os.path.join(root, name)
        if parsed is None or not os.path.isdir(path) or (topic and parsed[0] != topic):
            continue
        found.append((parsed[0], parsed[1], path))
    return found


def _print_check(pc: PartitionCheck, show_fix: bool = True, quick: bool = False) -> None:
    name = f"{pc.topic}-{pc.partition}"
    state = "DAMAGED" if pc.damaged else "ok"
    records = "" if quick else f"{pc.records:,} records, "
    print(
        f"  {name:<24} {state:<8} {pc.segments} segment(s), {records}"
        f"offsets {pc.min_offset:,}..{pc.max_offset:,}"
    )
    for f in pc.findings:
        where = f"{f.file}: " if f.file else ""
        print(f"      {'-' if f.damage else 'note:'} {where}{f.message}")
        if f.damage and f.fix and show_fix:
            print(f"        repair: {f.fix}")


def _start(args: argparse.Namespace) -> list[str]:
    roots = _roots(args)
    missing = [r for r in roots if not os.path.isdir(r)]
    if missing:
        raise UsageError(
            f"no such data directory: {missing[0]}",
            None if args.config or args.data_path else "name the broker's with -f or --data-path",
        )
    return roots


def _how(args: argparse.Namespace) -> str:
    """The options that name the same data again (for a hint)."""
    if args.data_path:
        return f" --data-path {args.data_path}"
    return f" -f {args.config}" if args.config else ""


def _checked(args: argparse.Namespace, root: str, live: bool) -> list[PartitionCheck]:
    out = []
    for topic, partition, path in _partitions(root, args.topic):
        try:
            pc = check_partition(path, topic, partition, quick=args.quick, live=live)
        except OSError as exc:
            pc = PartitionCheck(topic, partition, path)
            pc.add(True, "", f"cannot list the directory: {exc.strerror or exc}")
        out.append(pc)
    return out


def _as_json(pc: PartitionCheck) -> dict[str, object]:
    return {
        "topic": pc.topic,
        "partition": pc.partition,
        "damaged": pc.damaged,
        "segments": pc.segments,
        "records": pc.records,
        "min_offset": pc.min_offset,
        "max_offset": pc.max_offset,
        "findings": [dataclasses.asdict(f) for f in pc.findings],
    }


def run_check(args: argparse.Namespace) -> int:
    roots = _start(args)
    total = damaged = 0
    docs = []
    for root in roots:
        pid = lock_holder(root)
        live = pid is not None
        checks = _checked(args, root, live)
        total += len(checks)
        damaged += sum(pc.damaged for pc in checks)
        if args.json:
            docs.append(
                {
                    "data_path": root,
                    "broker_pid": pid,
                    "partitions": [_as_json(pc) for pc in checks],
                }
            )
            continue
        who = f"broker pid {pid} is running on it" if live else "no broker running"
        print(f"pymetaq check: {root} ({who})")
        if live:
            print("  (the newest segments are being written: their tails are not judged)")
        for pc in checks:
            _print_check(pc, quick=args.quick)
    if args.json:
        print(json.dumps(docs, indent=1))
        return 1 if damaged else 0
    print(f"{total} partition(s) checked: {total - damaged} ok, {damaged} damaged")
    if damaged:
        print(
            f"Stop the broker and run `pymetaq repair{_how(args)}`: damaged files are moved aside "
            "(never deleted) and missing ranges are skipped by consumers."
        )
    return 1 if damaged else 0


def run_repair(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.ERROR)  # every action is printed below, once
    roots = _start(args)
    locks = []
    try:
        for root in roots:
            lock = DataDirLock(root)
            lock.acquire()
            locks.append(lock)
    except StorageError as exc:
        for lock in locks:
            lock.release()
        print(f"pymetaq repair: {exc}", file=sys.stderr)
        return 2
    try:
        return _repair_all(roots, args.topic)
    finally:
        for lock in locks:
            lock.release()


def _repair_all(roots: list[str], topic: str | None) -> int:
    still = repaired = 0
    for root in roots:
        print(f"pymetaq repair: {root}")
        for name, partition, path in _partitions(root, topic):
            before = check_partition(path, name, partition)
            if not before.damaged:
                print(f"  {f'{name}-{partition}':<24} ok, nothing to do")
                continue
            try:
                actions = repair_partition(path, name, partition)
            except (OSError, StorageError) as exc:
                actions = [f"FAILED: {exc}"]
            print(f"  {name}-{partition}:")
            for action in actions:
                print(f"      {action}")
            after = check_partition(path, name, partition)
            repaired += 1
            if after.damaged:
                still += 1
                _print_check(after, show_fix=False)
    print(f"{repaired} partition(s) repaired, {still} still damaged")
    return 1 if still else 0
