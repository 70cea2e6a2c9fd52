"""A real small filesystem for fault tests: a tmpfs mounted for one test (root, as in CI)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """Mount a ``size`` tmpfs (e.g. ``"8m"``) on a new directory ``path``; unmount after."""
    path.mkdir()
    options = f"{'ro,' if read_only else ''}size={size}"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
