"""Log shipping with ``pymetaq tail``: a log written, rotated both ways, shipped, and counted.

Start the broker on the shipped configuration (its ``log-*`` topics have 2 partitions) and
run::

    .venv/bin/pymetaq server &
    .venv/bin/python examples/log_shipping.py

In a fresh directory it writes ``app.log``, runs ``pymetaq tail --once`` (the agent exits once
every line is acknowledged), rotates the file by rename + create (``app.log.1``) and by
copytruncate (``app.log.2``), writes more lines around each rotation, runs the agent again
from its checkpoint, and finally reads the topic back: every line once (exit code 0), or says
how many are missing or doubled (exit code 1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from pymetaq.client import Consumer


def write(path: Path, start: int, n: int) -> int:
    with open(path, "ab") as f:
        f.write(b"".join(f"line {i:06d}\n".encode() for i in range(start, start + n)))
    return start + n


def ship(workdir: Path, topic: str, servers: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "tail", "--servers", servers,
         "--topic", topic, "--checkpoint", str(workdir / "tail.json"), "--once", "--quiet",
         str(workdir / "app.log*")],
        check=True,
    )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=os.environ.get("PYMETAQ_SERVERS", "meta://127.0.0.1:8123"))
    ap.add_argument("--topic", default="log-demo")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="log-shipping-"))
    log = workdir / "app.log"
    n = write(log, 0, 1000)
    ship(workdir, args.topic, args.servers)
    n = write(log, n, 500)
    os.rename(log, workdir / "app.log.1")  # rename + create
    n = write(log, n, 500)
    ship(workdir, args.topic, args.servers)
    n = write(log, n, 500)
    shutil.copyfile(log, workdir / "app.log.2")  # copytruncate
    os.truncate(log, 0)
    n = write(log, n, 500)
    ship(workdir, args.topic, args.servers)
    seen: Counter[bytes] = Counter()
    with Consumer(args.servers, None) as c:
        c.subscribe(args.topic)
        for tp in c.assignment():
            c.seek_to_beginning(tp)
        while sum(seen.values()) < n:
            batch = c.poll(2.0)
            if not batch:
                break
            seen.update(m.value for m in batch if m.attribute and str(workdir) in m.attribute)
    twice = sum(1 for v in seen.values() if v > 1)
    print(f"wrote {n} lines, the topic holds {len(seen)} of them ({twice} twice)")
    shutil.rmtree(workdir)
    return 0 if len(seen) == n and not twice else 1


if __name__ == "__main__":
    sys.exit(main())
