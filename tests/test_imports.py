"""Import direction: the import-linter contracts in pyproject.toml, and what importing the
codec or the client really loads (a fresh interpreter, so nothing is imported already)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

#: pieces of the storage engine (the record format and the checksum are allowed: they are leaves)
ENGINE = {"log", "manager", "segment", "disk", "flusher", "recovery", "retention", "batch"}


def _loaded_after(statement: str) -> list[str]:
    code = (
        "import json, sys\n"
        f"{statement}\n"
        "print(json.dumps(sorted(m for m in sys.modules"
        " if m.split('.')[0] in ('pymetaq', 'lz4', 'crcmod', 'sqlalchemy', 'kazoo'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_import_linter_contracts_are_kept() -> None:
    proc = subprocess.run(
        [str(BIN / "lint-imports")], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_importing_the_codec_loads_only_the_codec() -> None:
    loaded = _loaded_after("import pymetaq.client.protocol")
    assert loaded == [
        "pymetaq",
        "pymetaq.client",
        "pymetaq.client.protocol",
        "pymetaq.client.protocol.encoder",
        "pymetaq.client.protocol.errors",
        "pymetaq.client.protocol.model",
        "pymetaq.client.protocol.parser",
        "pymetaq.client.protocol.txkey",
    ]


def test_importing_the_producer_loads_no_storage_engine_nor_consumer() -> None:
    loaded = _loaded_after("from pymetaq.client import Producer, Message, SendResult")
    storage = {m.split(".")[2] for m in loaded if m.startswith("pymetaq.storage.")}
    assert storage <= {"record", "checksum", "errors", "speedups", "_speedups"}, storage
    assert not storage & ENGINE
    assert not [m for m in loaded if m.startswith(("pymetaq.server", "pymetaq.client.consumer"))]
    assert "crcmod" not in loaded and "lz4" not in loaded  # lz4 only once a batch is compressed


def test_importing_the_consumer_loads_no_storage_engine_nor_server() -> None:
    loaded = _loaded_after("from pymetaq.client import Consumer, AsyncConsumer")
    assert not [m for m in loaded if m.startswith(("pymetaq.server", "pymetaq.ha"))]
    storage = {m.split(".")[2] for m in loaded if m.startswith("pymetaq.storage.")}
    assert storage <= {"record", "checksum", "errors", "speedups", "_speedups"}, storage
    assert "crcmod" not in loaded
    # the default offset store is the file store: SQLAlchemy and kazoo load only when used
    assert not [m for m in loaded if m.split(".")[0] in ("sqlalchemy", "kazoo")]
    assert "pymetaq.offsets.sql" not in loaded


def test_importing_the_cli_loads_no_optional_dependency() -> None:
    loaded = _loaded_after("import pymetaq.server.cli")
    assert not [m for m in loaded if m.split(".")[0] in ("sqlalchemy", "kazoo", "crcmod")]
