"""A subscriber process for the invalidation tests: a ``ConfigCache`` whose loader reads the
``config(key, version)`` table of a SQLite file, serving random keys in a loop.

    python -m tests.invalidation._subscriber SERVERS TOPIC STATE_DIR INSTANCE DB LOG KEYS

With KEYS 0 it serves nothing (``bench/invalidation.py``: events only).

It appends to LOG (one line each, flushed, in the order they happened):
``ready <time>`` once ``start()`` returned; ``E <event id> <time>`` after each event was
applied; ``S <key> <version>`` after each ``get`` returned. SIGTERM closes it cleanly.
"""

from __future__ import annotations

import faulthandler
import random
import signal
import sqlite3
import sys
import threading
import time
from types import FrameType

from pymetaq.client.invalidation import ConfigCache, ConfigEvent


def main() -> int:
    servers, topic, state_dir, instance, db, log_path, keys = sys.argv[1:8]
    names = [f"k{i}" for i in range(int(keys))]
    con = sqlite3.connect(db, timeout=30, check_same_thread=False)
    db_lock = threading.Lock()
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - the process's lifetime
    log_lock = threading.Lock()
    stop = threading.Event()

    def write(line: str) -> None:
        with log_lock:
            log.write(line + "\n")

    def loader(key: str) -> int | None:
        with db_lock:
            row = con.execute("SELECT version FROM config WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def on_event(e: ConfigEvent) -> None:
        write(f"E {e.id} {time.time():.6f}")

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    # SIGUSR1 writes every thread's stack to stderr at once, even with the main thread stuck
    # in C: the test sends it to a subscriber that does not stop, before killing it
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    cache = ConfigCache(
        servers, topic, loader, state_dir=state_dir, instance_id=instance, on_event=on_event,
        poll_timeout_s=0.05,
    )  # fmt: skip
    cache.start()
    write(f"ready {time.time():.6f}")
    rng = random.Random()
    while not stop.is_set() and not names:
        stop.wait(0.5)
    while not stop.is_set():
        for _ in range(5):
            key = rng.choice(names)
            with log_lock:  # a get and its line are one step: no event line between them
                log.write(f"S {key} {cache.get(key)}\n")
        stop.wait(0.005)
    cache.close()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
