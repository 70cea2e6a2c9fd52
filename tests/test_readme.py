"""The README's two commands are the project's contract with a fresh clone: keep them true."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _fenced_commands(text: str, label: str) -> list[str]:
    pattern = rf"<!-- {label} -->\s*```(?:sh|bash|console)?\n(.*?)```"
    return [c.strip() for c in re.findall(pattern, text, flags=re.S)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    (command,) = _fenced_commands(readme, "test-command")
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci.splitlines(), f"README test command not run verbatim by .ci/run: {command}"


def test_readme_main_job_runs_the_shipped_config() -> None:
    """The main command ends in ``pymetaq server`` with no -f: the packaged default, which
    conf/server.ini is a copy of (tests/server/test_default_config.py)."""
    readme = (ROOT / "README.md").read_text()
    (command,) = _fenced_commands(readme, "main-command")
    assert command.endswith(".venv/bin/pymetaq server"), command
    assert "pip install -q -e ." in command
    assert (ROOT / "conf" / "server.ini").read_bytes() == (
        ROOT / "server" / "default.ini"
    ).read_bytes()
