"""The consumer examples of docs/client.md run as written (against a real broker)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._broker import BrokerProcess
from tests.client._helpers import produce, server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def consumer_examples() -> list[str]:
    text = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Consumer") :]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_every_consumer_example_runs(tmp_path: Path) -> None:
    examples = consumer_examples()
    assert len(examples) >= 4
    with BrokerProcess.start(tmp_path, topics={"orders": {"numPartitions": 2}}) as b:
        produce(b, "orders", 0, [b"order-1", b"order-2"])
        produce(b, "orders", 1, [b"order-3"])
        for i, code in enumerate(examples):
            code = code.replace("meta://127.0.0.1:8123", server(b))
            code = code.replace("/tmp/pymetaq-doc-", str(tmp_path / f"doc{i}-"))
            r = subprocess.run(
                [sys.executable, "-c", code],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
                env={"HOME": str(tmp_path), "PATH": ""},
            )
            assert r.returncode == 0, f"example {i} failed:\n{code}\n{r.stderr}"
            if i == 0:
                assert "order-" in r.stdout
            if i == 2:
                assert r.stdout.strip() in {"1", "2", "3"}
