"""The tail agent's durable checkpoint: one JSON file per source, replaced atomically.

```
{"version": 1, "topic": "app-logs", "agent": "5f0c...",
 "files": {"2049:1311": {"path": "/var/log/app.log", "pos": 52133, "gen": 0,
                         "head": "<hex of the first 64 bytes>", "sig": 31337}},
 "scan": {"0-0": 10240, "0-1": 0}}
```

``files``: per followed file (identity ``dev:ino``), the byte position up to which every
record was acknowledged by the broker, the truncation generation and the head (to tell the
same file from a new one that got a recycled inode). ``scan``: per partition, a broker offset
at or before the first message this agent may have sent after the checkpoint was written;
at startup the agent reads the partitions from there and moves each file's position past
what the broker already holds (so a crash between an acknowledgement and the next checkpoint
ships nothing twice).

Written to ``<file>.tmp``, fsynced, renamed over ``<file>``, and the directory fsynced: a crash
leaves the old or the new checkpoint, never a torn one.

Thread-safety: functions; one writer per checkpoint file (the agent holds a lock file).
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field
from typing import Any

VERSION = 1


class CheckpointError(Exception):
    """The checkpoint cannot be read or written (the message says which file and why)."""


@dataclass
class FileMark:
    path: str
    pos: int
    gen: int = 0
    head: bytes = b""
    #: crc32 of the 64 bytes before ``pos`` (None at 0): a file truncated meanwhile differs
    sig: int | None = None


@dataclass
class Checkpoint:
    topic: str
    #: this agent's id in the attributes of what it sends (made once, kept)
    agent: str = ""
    files: dict[str, FileMark] = field(default_factory=dict)
    scan: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "topic": self.topic,
            "agent": self.agent,
            "files": {
                k: {"path": m.path, "pos": m.pos, "gen": m.gen, "head": m.head.hex(), "sig": m.sig}
                for k, m in sorted(self.files.items())
            },
            "scan": dict(sorted(self.scan.items())),
        }


def load(path: str, topic: str) -> Checkpoint:
    """The checkpoint at ``path`` (an empty one if there is none yet)."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return Checkpoint(topic)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read the checkpoint {path}: {e}") from None
    try:
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}")
        if doc["topic"] != topic:
            raise CheckpointError(
                f"the checkpoint {path} belongs to topic {doc['topic']!r}, not {topic!r}"
            )
        files = {
            str(k): FileMark(
                str(v["path"]),
                int(v["pos"]),
                int(v["gen"]),
                bytes.fromhex(v["head"]),
                None if v["sig"] is None else int(v["sig"]),
            )
            for k, v in doc["files"].items()
        }
        agent = str(doc["agent"])
        scan = {str(k): int(v) for k, v in doc["scan"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"the checkpoint {path} is damaged ({e})") from None
    return Checkpoint(topic, agent, files, scan)


def save(path: str, cp: Checkpoint) -> None:
    """Replace the checkpoint atomically and durably."""
    data = json.dumps(cp.to_json(), separators=(",", ":")).encode()
    tmp = path + ".tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise CheckpointError(f"cannot write the checkpoint {path}: {e.strerror}") from None


def lock(path: str) -> int:
    """Take ``<checkpoint>.lock`` (one agent per checkpoint); the descriptor holds it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise CheckpointError(
            f"another agent is using the checkpoint {path} (its lock {path}.lock is held)"
        ) from None
    return fd
