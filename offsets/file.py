"""A JSON file of offsets in MetaQ's LocalOffsetStorage shape.

```json
{"<group>": [{"topic": "t", "partition": {"brokerId": 0, "partition": 1},
              "offset": 1024, "msgId": 42}]}
```

The default location is ``~/.pymetaq_offsets`` (:func:`default_path`), shared by
``FileOffsetStore()``, a grouped ``Consumer`` without an ``offset_store`` and the CLI
(``pymetaq consume --group``, ``pymetaq offsets``).  MetaQ keeps the same format at
``~/.meta_offsets``; pymetaq does not share that file (MetaQ writes it without a lock).
Unlike MetaQ, ``msgId`` is reloaded.  Every commit rewrites the whole file atomically: write ``<name>.tmp.<pid>.<n>``,
fsync it, rename it over the file, fsync the directory, so a crash leaves the old or the new
file, never a mix.

Intended for **one consumer process per group** (MetaQ's broadcast mode, the embedded default):
it is a whole-file store, not a database.  Concurrent threads in one process are safe (a lock);
several processes on the same host are serialised with ``flock`` on ``<name>.lock`` and
re-read the file before merging, so they lose nothing either, but each commit costs a full
rewrite plus two fsyncs.  Not for network filesystems.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pymetaq.offsets.base import (
    CorruptOffsetData,
    OffsetEntry,
    OffsetStoreUnavailable,
    last_wins,
    newest,
    partition_key,
    split_partition_key,
)

_State = dict[str, dict[tuple[str, str], OffsetEntry]]


def default_path() -> Path:
    """The one default location, ``~/.pymetaq_offsets`` (see the module docstring)."""
    return Path.home() / ".pymetaq_offsets"


class FileOffsetStore:
    """Offsets of any number of groups in one JSON file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._lock = threading.Lock()
        self._tmp_counter = itertools.count()
        self._closed = False

    # ------------------------------------------------------------------ public API

    def load(self, group: str, topic: str, partition: str) -> OffsetEntry | None:
        with self._locked():
            return self._read().get(group, {}).get((topic, partition))

    def load_all(self, group: str) -> list[OffsetEntry]:
        with self._locked():
            return sorted(self._read().get(group, {}).values(), key=lambda e: e.key)

    def groups(self) -> list[str]:
        with self._locked():
            return sorted(self._read())

    def commit(self, group: str, entries: Iterable[OffsetEntry]) -> None:
        """Store the entries that advance an offset; stale ones are ignored."""
        batch = newest(entries)
        if not batch:
            return
        for _topic, part in batch:
            split_partition_key(part)  # validate before touching the file
        with self._locked():
            state = self._read()
            current = state.setdefault(group, {})
            changed = False
            for key, e in batch.items():
                old = current.get(key)
                if old is None or e.offset > old.offset:
                    current[key] = e
                    changed = True
            if changed:
                self._write(state)

    def reset(self, group: str, entries: Iterable[OffsetEntry]) -> None:
        """Set the given offsets exactly (they may move backwards)."""
        batch = last_wins(entries)
        if not batch:
            return
        for _topic, part in batch:
            split_partition_key(part)
        with self._locked():
            state = self._read()
            state.setdefault(group, {}).update(batch)
            self._write(state)

    def close(self) -> None:
        self._closed = True

    # ------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._closed:
            raise OffsetStoreUnavailable(f"{self.path}: store is closed", retriable=False)
        with self._lock:
            try:
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise OffsetStoreUnavailable(f"{self._lock_path}: {e}") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _read(self) -> _State:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise OffsetStoreUnavailable(f"{self.path}: {e}") from e
        try:
            return _decode(json.loads(raw) if raw.strip() else {})
        except (ValueError, TypeError, KeyError) as e:
            raise CorruptOffsetData(f"{self.path}: {e}") from e

    def _write(self, state: _State) -> None:
        data = json.dumps(_encode(state), indent=1, sort_keys=True).encode()
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}.{next(self._tmp_counter)}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise OffsetStoreUnavailable(f"{self.path}: {e}") from e


def _encode(state: _State) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for group, entries in sorted(state.items()):
        rows = []
        for (topic, part), e in sorted(entries.items()):
            broker_id, partition = split_partition_key(part)
            rows.append(
                {
                    "topic": topic,
                    "partition": {"brokerId": broker_id, "partition": partition},
                    "offset": e.offset,
                    "msgId": e.msg_id,
                }
            )
        out[group] = rows
    return out


def _decode(doc: Any) -> _State:
    if not isinstance(doc, dict):
        raise TypeError("top level must be an object {group: [...]}")
    state: _State = {}
    for group, rows in doc.items():
        entries: dict[tuple[str, str], OffsetEntry] = {}
        for row in rows:
            p = row["partition"]
            e = OffsetEntry(
                topic=str(row["topic"]),
                partition=partition_key(int(p["brokerId"]), int(p["partition"])),
                offset=int(row["offset"]),
                msg_id=int(row.get("msgId", -1)),
            )
            entries[e.key] = e
        state[str(group)] = entries
    return state
