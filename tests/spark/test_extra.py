"""Without the ``spark`` extra: the core package works, and format ``pymetaq`` fails with one
clear error naming the extra — never a bare ``ModuleNotFoundError`` from deep inside.

Tested without uninstalling anything: a child interpreter installs a ``sys.meta_path`` finder
that refuses ``pyspark`` (or ``pyarrow``) as if it were not installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration  # child interpreters

_CHILD = textwrap.dedent(
    """
    import importlib.abc, json, sys

    BLOCKED = sys.argv[1]

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == BLOCKED or name.startswith(BLOCKED + "."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
    out = {}
    import pymetaq.client, pymetaq.offsets  # the core needs neither pyspark nor pyarrow
    from pymetaq.client.producer.sync import Producer
    out["core"] = Producer.__name__
    for module in ("pymetaq.spark", "pyspark_pymetaq"):
        sys.modules.pop("pymetaq.spark", None)
        try:
            __import__(module)
        except ImportError as e:
            out[module] = [type(e).__name__, str(e), getattr(e, "extra", None),
                           isinstance(e, ImportError)]
        else:
            out[module] = None
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("blocked", ["pyspark", "pyarrow"])
def test_missing_extra_is_one_clear_error(blocked: str):
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, blocked],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["core"] == "Producer"
    message = f"pymetaq.spark needs {blocked}, which is not installed: pip install 'pymetaq[spark]'"
    for module in ("pymetaq.spark", "pyspark_pymetaq"):
        assert out[module] == ["MissingDependency", message, "spark", True], module
