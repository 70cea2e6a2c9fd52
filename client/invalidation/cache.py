"""The subscribing side of broadcast config invalidation: a cache in every application process.

```python
cache = ConfigCache("meta://127.0.0.1:8123", "config", loader=read_from_database,
                    state_dir="/var/lib/app/config-cache").start()
cache.get("db.pool")     # cached, else loader("db.pool") (and cached)
```

* **Broadcast.** Every process gets every event (MetaQ's broadcast consumer: offsets per
  instance, under ``<group>-<instance_id>``). ``invalidate`` drops the entry (the next ``get``
  calls ``loader``), ``set`` stores the event's value; ``on_event(event)`` is called after each is applied and
  before its offset is committed (at least once: after a crash it may come again).
* **A new process starts from "now"**: it positions at the end of every partition, then loads
  the current config (``load_all()`` if given, else lazily by key), then ``start()`` returns.
* **A restarted process catches up** (with ``state_dir``): the entries it held are kept in
  ``<state_dir>/cache.json`` and its offsets in ``<state_dir>/offsets.json``, written after each
  batch of events (entries first, then offsets; both atomically), so on restart it reloads the
  entries and applies every event it missed; ``start()`` returns only once it has caught up to
  the end offsets seen at start — it never serves what it held before the events it missed.
* **Away longer than retention**: if a committed offset is below its partition's first
  available offset, events were lost to retention: the cache drops everything, positions at
  the end and reloads (as a new process) rather than serve stale data. The same happens when
  ``cache.json`` is missing or unreadable.
* **No stale load.** ``get`` of a missing key records the key's invalidation count, calls
  ``loader`` and caches the result only if no event for that key was applied meanwhile (else
  it loads again): a value returned is never older than the last event applied before it.

Without ``state_dir`` the cache lives in memory only (an ungrouped consumer from the end; a
restart is a new process). Values must be JSON values to be kept in ``cache.json``.

Thread-safety: ``get``/``peek``/``keys`` from any thread; events are applied by the cache's
own thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pymetaq.client.errors import MetaClientError
from pymetaq.client.invalidation.event import ConfigEvent, decode
from pymetaq.client.types import TopicPartition

log = logging.getLogger("pymetaq.invalidation")

Loader = Callable[[str], Any]
MAX_LOAD_ATTEMPTS = 50


class ConfigCacheError(MetaClientError):
    """The cache could not start, or its thread failed (the cause is chained)."""


class ConfigCache:
    """A key -> value cache kept fresh by broadcast invalidations (see the module doc)."""

    def __init__(
        self,
        servers: str,
        topic: str,
        loader: Loader,
        *,
        load_all: Callable[[], Mapping[str, Any]] | None = None,
        group: str = "config-cache",
        instance_id: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        on_event: Callable[[ConfigEvent], None] | None = None,
        poll_timeout_s: float = 0.2,
        **consumer_overrides: Any,
    ) -> None:
        self.servers, self.topic, self.loader, self.load_all = servers, topic, loader, load_all
        self.group, self.instance_id = group, instance_id
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.on_event = on_event
        self.poll_timeout_s = poll_timeout_s
        self._overrides = consumer_overrides
        self._entries: dict[str, Any] = {}
        self._gen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self.error: BaseException | None = None
        #: events applied, keys loaded, full reloads (start as new, or after retention)
        self.stats = {"events": 0, "loads": 0, "reloads": 0, "restored": 0}

    # -- reading -----------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """The cached value, else ``loader(key)`` (cached unless an event raced the load)."""
        if not self._ready.is_set():
            raise ConfigCacheError("the cache is not started (call start())")
        for _ in range(MAX_LOAD_ATTEMPTS):
            with self._lock:
                if key in self._entries:
                    return self._entries[key]
                gen = self._gen.get(key, 0)
            value = self.loader(key)
            with self._lock:
                self.stats["loads"] += 1
                if self._gen.get(key, 0) == gen:
                    if value is not None:
                        self._entries[key] = value
                    return default if value is None else value
        raise ConfigCacheError(f"{key!r} changed {MAX_LOAD_ATTEMPTS} times while it was loaded")

    def peek(self, key: str) -> Any:
        """The cached value or None (never loads)."""
        with self._lock:
            return self._entries.get(key)

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    # -- events ------------------------------------------------------------------------

    def _apply(self, e: ConfigEvent) -> None:
        with self._lock:
            self._gen[e.key] = self._gen.get(e.key, 0) + 1
            if e.op == "set":
                self._entries[e.key] = e.value
            else:
                self._entries.pop(e.key, None)
            self.stats["events"] += 1

    def _save(self) -> None:
        assert self.state_dir is not None
        with self._lock:
            data = json.dumps({"entries": self._entries}, ensure_ascii=False).encode()
        path = self.state_dir / "cache.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _restore(self) -> bool:
        assert self.state_dir is not None
        try:
            doc = json.loads((self.state_dir / "cache.json").read_bytes())
            entries = doc["entries"]
            if not isinstance(entries, dict):
                raise ValueError("entries is not an object")
        except FileNotFoundError:
            return False
        except (ValueError, KeyError, TypeError, OSError) as e:
            log.warning("ignoring %s: %s", self.state_dir / "cache.json", e)
            return False
        with self._lock:
            self._entries = dict(entries)
        return True

    # -- the consumer thread -------------------------------------------------------------

    def _open(self) -> Any:
        from pymetaq.client.consumer import Consumer

        store = None
        if self.state_dir is not None:
            from pymetaq.offsets import FileOffsetStore

            self.state_dir.mkdir(parents=True, exist_ok=True)
            store = FileOffsetStore(self.state_dir / "offsets.json")
        self._store = store
        c = Consumer(
            self.servers,
            self.group if store is not None else None,
            store,
            broadcast=store is not None,
            instance_id=self.instance_id,
            initial_position="latest",
            enable_auto_commit=False,
            **self._overrides,
        )
        c.subscribe(self.topic)
        return c

    def _resume(self, c: Any, parts: list[TopicPartition]) -> bool:
        """True if the instance's offsets and entries can be resumed (see the module doc)."""
        if self.state_dir is None:
            return False
        from pymetaq.client.consumer.config import effective_group

        group = effective_group(self.group, c.config)
        committed = {e.partition: e.offset for e in self._store.load_all(group)}
        mine = {tp: committed[tp.key] for tp in parts if tp.key in committed}
        if not mine:
            return False  # a new instance
        first = c.beginning_offsets(parts)
        lost = [tp for tp, off in mine.items() if off < first[tp]]
        if lost:
            log.warning("offsets of %s are below retention (%s): reloading everything",
                        group, ", ".join(tp.key for tp in lost))  # fmt: skip
            return False
        return self._restore()

    def _start_fresh(self, c: Any, parts: list[TopicPartition]) -> None:
        with self._lock:
            self._entries.clear()
            for k in self._gen:
                self._gen[k] += 1
        for tp, end in c.end_offsets(parts).items():
            c.seek(tp, end)
        if self.load_all is not None:
            loaded = dict(self.load_all())
            with self._lock:
                self._entries.update(loaded)
        self.stats["reloads"] += 1

    def _batch(self, c: Any, pos: dict[TopicPartition, int]) -> None:
        batch = c.poll(self.poll_timeout_s)
        if not len(batch):
            return
        for m in batch:
            pos[TopicPartition(m.topic, m.broker_id, m.partition)] = m.next_offset
            try:
                e = decode(m.value)
            except ValueError as err:
                log.warning("%s/%s offset %d: %s", m.topic, m.partition_key, m.offset, err)
                continue
            self._apply(e)
            if self.on_event is not None:
                self.on_event(e)  # before the commit: at least once, never lost to a crash
        if self.state_dir is not None:
            self._save()  # entries first, then the offsets that they include
            c.commit()

    def _run(self) -> None:
        try:
            with self._open() as c:
                parts = c.assignment()
                if self._resume(c, parts):
                    self.stats["restored"] += 1
                    pos = {tp: c.position(tp) for tp in parts}
                    end = c.end_offsets(parts)
                    while any(pos[tp] < end[tp] for tp in parts) and not self._stop.is_set():
                        self._batch(c, pos)  # catch up before serving anything
                else:
                    self._start_fresh(c, parts)
                    pos = {}
                self._ready.set()
                while not self._stop.is_set():
                    self._batch(c, pos)
        except BaseException as e:
            self.error = e
            log.exception("the config cache stopped")
            raise
        finally:
            if self._store is not None:
                self._store.close()
            self._ready.set()

    # -- life cycle --------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> ConfigCache:
        """Connect, resume or start fresh, catch up; return once ``get`` may be called."""
        self._thread = threading.Thread(target=self._run, name="pymetaq-config-cache", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self.close()
            raise ConfigCacheError(f"the cache did not catch up within {timeout_s} s")
        if self.error is not None:
            raise ConfigCacheError(f"the cache could not start: {self.error}") from self.error
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> ConfigCache:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()
