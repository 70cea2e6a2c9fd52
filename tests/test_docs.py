"""Every code block of README.md and docs/*.md runs as written, against a fresh broker on the
shipped configuration (the packaged default.ini, on a free port), and prints what the page
shows (tests/_docs.py says how blocks are read and compared).

Each page gets its own broker and working directory (with ``.venv`` linking to this Python's
environment, ``HOME`` there too, so ``~/.pymetaq_offsets`` is the page's own), and its blocks
run in page order: a page's examples may build on the ones before them, as a reader's would.
``127.0.0.1:8123`` in a page is the broker's real address; ``PYMETAQ_SERVERS`` names it for
commands that rely on the default.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pymetaq.server.default_config import default_text
from tests import _docs
from tests._broker import BrokerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
#: pages whose examples another test runs (they need services this runner does not start)
ELSEWHERE = {
    "docs/cluster.md": "tests/cluster/test_docs.py (real ZooKeeper and two brokers)",
    "docs/security.md": "tests/security/test_docs.py (a PKI made with openssl, a TLS broker)",
}


def test_every_page_is_run_or_named() -> None:
    assert set(ELSEWHERE) <= set(PAGES)
    for page in PAGES:
        for b in _docs.blocks(ROOT / page, page):
            if page not in ELSEWHERE:
                assert _docs.kind(b) != "unmarked", (
                    f"{b.where}: a {b.lang or 'plain'} block that is neither run nor marked "
                    "<!-- not-run: why --> (see tests/_docs.py)"
                )
            if b.mark == "not-run":
                assert b.why, f"{b.where}: <!-- not-run: --> needs a reason"


def _start(tmp_path: Path) -> BrokerProcess:
    ini = default_text().replace("serverPort=8123", "serverPort=0")
    assert ini != default_text()
    return BrokerProcess.start(tmp_path, ini_text=ini, name="page")


def _env(b: BrokerProcess) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "HOME": str(b.cwd),
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYMETAQ_SERVERS": f"meta://127.0.0.1:{b.port}",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.mark.parametrize("page", [p for p in PAGES if p not in ELSEWHERE])
def test_page_runs_as_written(page: str, tmp_path: Path) -> None:
    todo = [
        b for b in _docs.blocks(ROOT / page, page) if _docs.kind(b) in ("console", "wire", "python")
    ]
    if not todo:
        return
    with _start(tmp_path) as b:
        (b.cwd / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
        fix = {"127.0.0.1:8123": f"127.0.0.1:{b.port}", "127.0.0.1 8123": f"127.0.0.1 {b.port}"}
        problems: list[str] = []
        for block in todo:
            problems += _run(block, b, fix)
        assert not problems, "\n\n".join(problems) + "\n\nbroker log:\n" + b.log_text()[-3000:]


def _swap(text: str, fix: dict[str, str]) -> str:
    for k, v in fix.items():
        text = text.replace(k, v)
    return text


def _run(block: _docs.Block, b: BrokerProcess, fix: dict[str, str]) -> list[str]:
    kind = _docs.kind(block)
    if kind == "wire":
        return _docs.run_wire(block, b.address, {"port 8123": f"port {b.port}"})
    out_fix = {**fix, "port 8123": f"port {b.port}"}
    if kind == "python":
        code = _swap(block.text, fix)
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=b.cwd,
            env=_env(b),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            return [f"{block.where}: exited {proc.returncode}:\n{proc.stderr}"]
        if block.output is not None:
            want = _swap(block.output.text, out_fix)
            if not _docs.matches(want, proc.stdout):
                return [f"{block.where}: printed\n{proc.stdout}\nthe page shows\n{want}"]
        return []
    problems = []
    rc = 0
    for cmd in _docs.console_commands(block):
        got, rc = _docs.run_shell(_swap(cmd.command, fix), b.cwd, _env(b), rc)
        want = _swap(cmd.expected, out_fix)
        if not _docs.matches(want, got):
            problems.append(
                f"{block.where}: $ {cmd.command}\n--- printed:\n{got}\n--- the page shows:\n{want}"
            )
    return problems
