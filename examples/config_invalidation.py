"""Broadcast config invalidation: three application caches kept fresh by one publisher.

Start the broker on the shipped configuration (its ``config-*`` topics have 2 partitions) and
run::

    .venv/bin/pymetaq server &
    .venv/bin/python examples/config_invalidation.py

The "database" is a JSON file (the source of truth). Three ``ConfigCache`` instances (each with
its own state directory, as three processes would have) load from it; the publisher changes
values in the file and sends ``invalidate`` or ``publish_config``; every cache then serves the
new values. One cache is closed while changes are published and reopened: it catches up on
what it missed before it serves anything. Exit code 0 when every cache serves what the file
holds.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pymetaq.client.invalidation import ConfigCache, ConfigEvent, ConfigPublisher


class JsonConfig:
    """The source of truth: a JSON file of key -> value."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.write_text("{}")

    def load(self, key: str) -> Any:
        return json.loads(self.path.read_text()).get(key)

    def save(self, key: str, value: Any) -> None:
        doc = json.loads(self.path.read_text())
        doc[key] = value
        self.path.write_text(json.dumps(doc))


def wait_until(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit("an event did not arrive within 30 s")
        time.sleep(0.01)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=os.environ.get("PYMETAQ_SERVERS", "meta://127.0.0.1:8123"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="config-invalidation-"))
    topic = f"config-example-{uuid.uuid4().hex[:8]}"
    db = JsonConfig(work / "config.json")
    db.save("db.pool.size", 8)
    db.save("feature.search", False)
    names = ("app-1", "app-2", "app-3")
    received: dict[str, list[str]] = {name: [] for name in names}

    def cache(name: str) -> ConfigCache:
        def on_event(e: ConfigEvent) -> None:
            received[name].append(e.key)

        return ConfigCache(args.servers, topic, db.load, state_dir=work / name, instance_id=name,
                           on_event=on_event).start()  # fmt: skip

    caches = {name: cache(name) for name in names}
    for c in caches.values():
        assert c.get("db.pool.size") == 8 and c.get("feature.search") is False
    with ConfigPublisher(args.servers, topic) as pub:
        db.save("db.pool.size", 16)
        pub.invalidate("db.pool.size")  # caches drop it; the next get loads 16
        wait_until(lambda: received["app-3"] == ["db.pool.size"])
        caches["app-3"].close()  # app-3 is away for the next change
        db.save("feature.search", True)
        pub.publish_config("feature.search", True)  # caches hold True at once
    wait_until(lambda: all(len(received[n]) == 2 for n in ("app-1", "app-2")))
    caches["app-3"] = cache("app-3")  # catches up on the event it missed, then serves
    ok = True
    for name, c in caches.items():
        values = {k: c.get(k) for k in ("db.pool.size", "feature.search")}
        print(f"{name}: {values} after {len(received[name])} events")
        ok &= values == {"db.pool.size": 16, "feature.search": True}
        c.close()
    print("every cache serves the current config" if ok else "a cache serves STALE config")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
