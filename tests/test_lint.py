"""ruff (lint + format) and mypy (strict for the package, relaxed for tests) stay clean.

mypy sees the package through ``.typing/``, a git-ignored tree of links built from pyproject's
``package-dir`` by :mod:`tests._typing_tree`; it is rebuilt here first, so a fresh clone needs
no manual step.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import _typing_tree

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_check_is_clean() -> None:
    proc = _run(str(BIN / "ruff"), "check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_is_clean() -> None:
    proc = _run(str(BIN / "ruff"), "format", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_typing_tree_follows_pyproject() -> None:
    links = _typing_tree.build()
    names = {".".join(p.relative_to(_typing_tree.TREE).parts) for p in links}
    assert names >= {"pymetaq.client", "pymetaq.storage", "pymetaq.server", "pymetaq.offsets"}
    for link in links:
        assert link.resolve().is_dir(), link


def test_mypy_strict_is_clean() -> None:
    _typing_tree.build()
    proc = _run(str(BIN / "mypy"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
