"""Every code block of README.md and docs/*.md runs as written, against a fresh broker on the
shipped configuration (the packaged default.ini, on a free port), and prints what the page
shows (tests/_docs.py says how blocks are read and compared).

Each page gets its own broker and working directory (with ``.venv`` linking to this Python's
environment, ``HOME`` there too, so ``~/.pymetaq_offsets`` is the page's own), and its blocks
run in page order: a page's examples may build on the ones before them, as a reader's would.
``127.0.0.1:8123`` in a page is the broker's real address (``127.0.0.1:8120`` its dashboard's,
on a free port too); ``PYMETAQ_SERVERS`` names it for commands that rely on the default.

A page that needs more than a broker says so once, anywhere in its text, with
``<!-- page-services: zookeeper postgresql -->`` (either or both); the runner then starts the
suite's real services (tests/_fixtures.py) for it and rewrites their addresses as it rewrites
the broker's:

- ``zookeeper``: the page's broker runs with ``[zookeeper]`` enabled (``zk.zkEnable=true``),
  registered under a fresh chroot of the session's ZooKeeper; ``zk://127.0.0.1:2181`` (with or
  without ``/meta``) in the page is that registry.
- ``postgresql``: ``postgresql+psycopg://postgres@127.0.0.1:5432/<db>`` is a fresh database on
  the session's PostgreSQL server (``max_prepared_transactions`` > 0).

The page's directory also holds ``examples/`` (a link to the repository's), so
``python examples/...`` runs as in a clone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pymetaq.server.default_config import default_text
from tests import _docs
from tests._broker import BrokerProcess
from tests._helpers import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
#: pages whose examples another test runs (they need services this runner does not start)
ELSEWHERE = {
    "docs/cluster.md": "tests/cluster/test_docs.py (real ZooKeeper; two and three brokers)",
    "docs/replication.md": "tests/ha/test_docs.py (real ZooKeeper; a master, its async slave, a pair)",
    "docs/security.md": "tests/security/test_docs.py (a PKI made with openssl, a TLS broker)",
}
_SERVICES = re.compile(r"<!--\s*page-services:\s*([a-z ]+?)\s*(?:\(.*?\))?\s*-->", re.S)
_ZK_URL = re.compile(r"zk://127\.0\.0\.1:2181(?:/meta)?")
_PG_URL = re.compile(r"postgresql\+psycopg://postgres@127\.0\.0\.1:5432/[A-Za-z_]\w*")


def page_services(page: str) -> set[str]:
    """The services a page asks for with ``<!-- page-services: ... -->``."""
    found = {s for m in _SERVICES.finditer((ROOT / page).read_text()) for s in m.group(1).split()}
    unknown = found - {"zookeeper", "postgresql"}
    assert not unknown, f"{page}: unknown page-services {sorted(unknown)}"
    return found


@dataclass
class Fix:
    """Addresses in a page -> the test's real ones (plain replacements, then patterns)."""

    plain: dict[str, str]
    patterns: list[tuple[re.Pattern[str], str]] = field(default_factory=list)

    def __call__(self, text: str) -> str:
        for k, v in self.plain.items():
            text = text.replace(k, v)
        for pattern, v in self.patterns:
            text = pattern.sub(v.replace("\\", "\\\\"), text)
        return text


def test_every_page_is_run_or_named() -> None:
    assert set(ELSEWHERE) <= set(PAGES)
    for page in PAGES:
        services = page_services(page)
        for b in _docs.blocks(ROOT / page, page):
            if page not in ELSEWHERE and _docs.kind(b) in ("console", "wire", "python"):
                for service, pattern in (("zookeeper", _ZK_URL), ("postgresql", _PG_URL)):
                    assert service in services or not pattern.search(b.text), (
                        f"{b.where}: uses {service}: add <!-- page-services: {service} -->"
                    )
            if page not in ELSEWHERE:
                assert _docs.kind(b) != "unmarked", (
                    f"{b.where}: a {b.lang or 'plain'} block that is neither run nor marked "
                    "<!-- not-run: why --> (see tests/_docs.py)"
                )
            if b.mark == "not-run":
                assert b.why, f"{b.where}: <!-- not-run: --> needs a reason"


def _start(tmp_path: Path, zk_connect: str | None, http_port: int) -> BrokerProcess:
    ini = default_text().replace("serverPort=8123", "serverPort=0")
    ini = ini.replace("dashboardHttpPort=8120", f"dashboardHttpPort={http_port}")
    assert str(http_port) in ini  # never the fixed 8120: brokers of other runs may hold it
    if zk_connect is not None:
        zk = "zk.zkEnable=true\nzk.zkConnect=" + zk_connect + "\nzk.zkSyncTimeMs=100\n"
        section = "zk.zkEnable=false\nzk.zkConnect=localhost:2181\n"
        assert section in ini
        ini = ini.replace(section, zk).replace("zk.zkSyncTimeMs=5000\n", "")
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


def _service_fix(page: str, request: pytest.FixtureRequest) -> tuple[Fix, str | None]:
    """The rewrites for the page's services, and the broker's ``zk.zkConnect`` (or None)."""
    fix = Fix({})
    zk_connect = None
    services = page_services(page)
    if "zookeeper" in services:
        zk_connect = str(request.getfixturevalue("zk_hosts"))  # hosts + a fresh chroot
        hosts, slash, chroot = zk_connect.partition("/")
        fix.patterns.append((_ZK_URL, f"zk://{hosts}{slash}{chroot}/meta"))
        fix.plain["ZooKeeper root /meta"] = f"ZooKeeper root {slash}{chroot}/meta"
    if "postgresql" in services:
        fix.patterns.append((_PG_URL, str(request.getfixturevalue("pg_url"))))
    return fix, zk_connect


@pytest.mark.parametrize("page", [p for p in PAGES if p not in ELSEWHERE])
def test_page_runs_as_written(page: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    todo = [
        b for b in _docs.blocks(ROOT / page, page) if _docs.kind(b) in ("console", "wire", "python")
    ]
    if not todo:
        return
    services, zk_connect = _service_fix(page, request)
    http_port = free_port()
    with _start(tmp_path, zk_connect, http_port) as b:
        (b.cwd / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
        (b.cwd / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
        plain = {"127.0.0.1:8123": f"127.0.0.1:{b.port}", "127.0.0.1 8123": f"127.0.0.1 {b.port}"}
        plain["127.0.0.1:8120"] = f"127.0.0.1:{http_port}"
        fix = Fix({**plain, **services.plain}, services.patterns)
        problems: list[str] = []
        for block in todo:
            problems += _run(block, b, fix)
        assert not problems, "\n\n".join(problems) + "\n\nbroker log:\n" + b.log_text()[-3000:]


def _run(block: _docs.Block, b: BrokerProcess, fix: Fix) -> list[str]:
    kind = _docs.kind(block)
    if kind == "wire":
        return _docs.run_wire(block, b.address, {"port 8123": f"port {b.port}"})
    out_fix = Fix({**fix.plain, "port 8123": f"port {b.port}"}, fix.patterns)
    if kind == "python":
        code = fix(block.text)
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
            want = out_fix(block.output.text)
            if not _docs.matches(want, proc.stdout):
                return [f"{block.where}: printed\n{proc.stdout}\nthe page shows\n{want}"]
        return []
    problems = []
    rc = 0
    for cmd in _docs.console_commands(block):
        got, rc = _docs.run_shell(fix(cmd.command), b.cwd, _env(b), rc)
        want = out_fix(cmd.expected)
        if not _docs.matches(want, got):
            problems.append(
                f"{block.where}: $ {cmd.command}\n--- printed:\n{got}\n--- the page shows:\n{want}"
            )
    return problems
