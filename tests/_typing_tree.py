"""Build mypy's view of the ``package-dir`` mapping: ``.typing/pymetaq/<part>`` -> ``<folder>``.

pyproject maps each top-level folder onto the one import package ``pymetaq`` (``"pymetaq.client"
= "client"``); mypy needs a real ``pymetaq/`` tree to resolve those names, so this script builds
one out of symbolic links, from ``[tool.setuptools.package-dir]``, under the git-ignored
``.typing/`` (``mypy_path`` in pyproject). ``tests/test_lint.py`` runs it before mypy, so a
fresh clone needs no manual step; by hand: ``python -m tests._typing_tree && mypy``.

Idempotent; links that no longer match pyproject are replaced. Thread-safety: a script.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".typing"


def mapping(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """``{"pymetaq.client": "client", ...}`` from pyproject, without nested entries that
    already follow from their parent (``pymetaq.client.protocol`` = ``client/protocol``)."""
    with pyproject.open("rb") as f:
        dirs: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    out: dict[str, str] = {}
    for name, folder in sorted(dirs.items()):
        parent, _, last = name.rpartition(".")
        if parent in dirs and Path(dirs[parent]) / last == Path(folder):
            continue
        out[name] = folder
    return out


def build(tree: Path = TREE) -> list[Path]:
    """Create (or refresh) the link tree; returns the links."""
    links: list[Path] = []
    for name, folder in mapping().items():
        link = tree.joinpath(*name.split("."))
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(ROOT / folder, link.parent)
        if link.is_symlink() and os.readlink(link) == target:
            links.append(link)
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target, target_is_directory=True)
        links.append(link)
    return links


if __name__ == "__main__":
    for path in build():
        print(f"{path.relative_to(ROOT)} -> {os.readlink(path)}", file=sys.stderr)
