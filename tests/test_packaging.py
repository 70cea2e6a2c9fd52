"""The wheel a pip user gets: built from this tree, installed into a fresh virtual environment
on a machine without a C compiler (no gcc/cc on PATH, ``CC=/bin/false``), it runs
``pymetaq --version``, a broker on the packaged default configuration, a produce and a consume;
and it carries what it promises (default.ini, py.typed, the license, one version, honest
extras).

pip builds the wheel with setuptools from PyPI and installs lz4's binary wheel (pip's cache
makes both fast after the first run); nothing else is fetched.
"""

from __future__ import annotations

import email
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client import __version__
from tests._helpers import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def run(args: list[str], env: dict[str, str], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc  # type: ignore[no-any-return]


def source_copy(dest: Path) -> Path:
    """The tree's files (tracked, or new and not ignored) copied to ``dest``: pip builds in
    the source directory, and a ``build/`` left there by an earlier build (an editable
    install's, a compiler's) would end up in the wheel."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    src = source_copy(tmp_path_factory.mktemp("src"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        env={**os.environ, **PIP_ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = dist.glob("pymetaq-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh environment with the wheel installed, by a pip that has no compiler."""
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(home / "v")], check=True, timeout=300)
    bin_dir = home / "v" / "bin"
    env = no_compiler_env(bin_dir, home)
    proc = run([str(bin_dir / "pip"), "install", "-q", str(wheel)], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield bin_dir


def no_compiler_env(bin_dir: Path, home: Path) -> dict[str, str]:
    """PATH = the venv only (gcc and cc live in /usr/bin), CC/CXX that fail."""
    env = {
        "PATH": str(bin_dir),
        "HOME": str(home),
        # pip's cache stays the real one (the wheel's dependencies are downloaded once)
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
        "CC": "/bin/false",
        "CXX": "/bin/false",
        "LANG": "C.UTF-8",
        **PIP_ENV,
    }
    for key in (
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_FIND_LINKS",
        "PIP_CERT",
        "SSL_CERT_FILE",
    ):
        if key in os.environ:  # the machine's package index settings, if any
            env[key] = os.environ[key]
    for tool in ("gcc", "cc", "clang"):
        assert shutil.which(tool, path=env["PATH"]) is None, tool
    return env


def test_the_wheel_holds_what_it_promises(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_string(z.read(meta_name).decode())
        default_ini = z.read("pymetaq/server/default.ini")
        assert "pymetaq/server/http/static/dashboard.css" in names  # the dashboard's assets
    for pkg in ("server", "client", "storage", "offsets", "ha", "spark"):
        assert f"pymetaq/{pkg}/py.typed" in names
    assert "pyspark_pymetaq.py" in names  # Spark's auto-registration hook for format pymetaq
    assert default_ini == (ROOT / "conf" / "server.ini").read_bytes()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # the C accelerator, compiled (this build had gcc); its source is not shipped as data
    assert any(re.fullmatch(r"pymetaq/client/_speedups\..*\.so", n) for n in names), names
    assert not any(n.endswith(".c") for n in names)
    assert meta["Version"] == __version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in meta.get_all("Classifier", [])
    runtime = [r for r in meta.get_all("Requires-Dist", []) if "extra ==" not in r]
    # lz4 has binary wheels; prometheus-client (the broker's /metrics) is pure Python
    assert [re.split(r"[<>=\s]", r)[0] for r in runtime] == ["lz4", "prometheus-client"]
    assert sorted(meta.get_all("Provides-Extra", [])) == [
        "bench",
        "dev",
        "fast",
        "pg",
        "spark",
        "sql",
        "test",
        "zk",
    ]
    dev_tools = [r for r in meta.get_all("Requires-Dist", []) if r.startswith(("ruff", "mypy"))]
    assert dev_tools and all('extra == "test"' in r for r in dev_tools), dev_tools


def test_installed_without_a_compiler_it_serves_produces_and_consumes(
    venv: Path, tmp_path: Path
) -> None:
    env = no_compiler_env(venv, tmp_path)
    pymetaq = str(venv / "pymetaq")
    version = run([pymetaq, "--version"], env)
    assert version.stdout == f"pymetaq {__version__}\n", version.stderr
    config = run([pymetaq, "config", "--print"], env)
    assert config.stdout == (ROOT / "conf" / "server.ini").read_text(encoding="utf-8")

    broker = subprocess.Popen(
        [pymetaq, "server", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(broker.stdout or []), daemon=True)
    reader.start()
    try:
        found = wait_for(
            lambda: re.search(r"listening on 127\.0\.0\.1:(\d+) \(data: (.*)\)", "".join(log)),
            60,
            "the broker's listening line",
        )
        assert found is not None
        assert found.group(2) == str(tmp_path / "data")  # the packaged default: ./data
        env["PYMETAQ_SERVERS"] = f"meta://127.0.0.1:{found.group(1)}"
        lines = "".join(f"wheel-{i}\n" for i in range(10))
        produced = run([pymetaq, "produce", "--topic", "test"], env, input=lines)
        assert produced.returncode == 0 and "produced 10 of 10 messages" in produced.stderr
        consumed = run(
            [pymetaq, "consume", "--topic", "test", "--from-beginning", "--count", "10"], env
        )
        assert consumed.returncode == 0, consumed.stderr
        assert sorted(consumed.stdout.split()) == sorted(lines.split())
        # an extra that is not installed: one line naming it, no traceback
        sql = run(
            [pymetaq, "offsets", "show", "--group", "g", "--store", f"sqlite:{tmp_path}/o.db"], env
        )
        assert sql.returncode == 1
        assert sql.stderr == (
            "pymetaq offsets show: SqlOffsetStore needs SQLAlchemy, which is not installed: "
            "pip install 'pymetaq[sql]'\n"
        )
        imports = run(
            [str(venv / "python"), "-c", "import sys; from pymetaq.client import Consumer, "
             "Producer; print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('sqlalchemy', 'kazoo', 'crcmod')))"],
            env,
        )  # fmt: skip
        assert imports.stdout == "[]\n", imports.stderr
        impl = run(
            [str(venv / "python"), "-c",
             "from pymetaq.client.speedups import SPEEDUPS_IMPL; print(SPEEDUPS_IMPL)"],
            env,
        )  # fmt: skip
        assert impl.stdout == "c\n", impl.stderr  # the wheel's extension, no compiler needed
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(60) == 0
        reader.join(10)
        if broker.stdout is not None:
            broker.stdout.close()
    assert "stopped: storage closed cleanly" in "".join(log)


def test_without_a_compiler_the_build_goes_on_in_pure_python(tmp_path: Path) -> None:
    """pip building from source on a machine without gcc: the accelerator is optional, so the
    wheel still builds, and the client it installs runs pure Python (the same behaviour)."""
    dist = tmp_path / "dist"
    src = source_copy(tmp_path / "src")
    env = {**os.environ, **PIP_ENV, "CC": "/bin/false", "LDSHARED": "/bin/false"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = dist.glob("pymetaq-*.whl")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    assert not any("_speedups" in n for n in names), names
    assert "pymetaq/client/speedups.py" in names
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(path) as z:
        z.extractall(unpacked)
    # -S: no .pth files, so this checkout's editable install cannot supply the extension;
    # site-packages is still on the path for lz4
    code = (
        f"import sys; sys.path[:0] = [{str(unpacked)!r}]; sys.path.append({purelib()!r}); "
        "from pymetaq.client import Producer; "
        "from pymetaq.client.speedups import SPEEDUPS_IMPL; print(SPEEDUPS_IMPL)"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout == "python\n", out.stderr


def purelib() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]
