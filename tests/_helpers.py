"""Helpers shared by every test folder: the one bounded wait, and the integration guard.

``wait_for(cond, timeout_s, what)`` re-checks ``cond()`` until it returns something truthy
(which it returns) or ``timeout_s`` passes (``AssertionError`` naming ``what``). It is for
conditions that only polling can observe (another process's files or replies); where a test
can wait on an event, a future or a thread's join, it does that instead.

``require_integration(what)``: helpers that start processes (``tests._broker``) call it; under
pytest it fails a test that is not marked ``integration`` (the hooks in ``tests/conftest.py``
say which test is running). Outside pytest (the benchmarks) it does nothing.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: the pause between two checks (short: a condition is usually met within milliseconds)
POLL_S = 0.005


def wait_for(cond: Callable[[], T], timeout_s: float = 30.0, what: str = "condition") -> T:
    """Return ``cond()``'s first truthy value; fail after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s} s")
        time.sleep(POLL_S)


_current: tuple[str | None, bool] = (None, False)


def set_current_test(nodeid: str | None, integration: bool) -> None:
    """(conftest hooks) The test being set up/run, and whether it is marked ``integration``."""
    global _current
    _current = (nodeid, integration)


def require_integration(what: str) -> None:
    """Fail if the running test starts ``what`` (a process or service) without the marker."""
    nodeid, integration = _current
    if nodeid is not None and not integration:
        raise AssertionError(
            f"{nodeid} starts {what} but is not marked integration "
            "(add `pytestmark = pytest.mark.integration` to its module)"
        )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a listener that cannot take port 0, such as
    ``dashboardHttpPort``, where 0 means off)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pytest_in_pure_python(*tests: str) -> None:
    """Run test files once more in a child pytest with ``PYMETAQ_NO_EXTENSIONS=1`` (the C
    accelerators off: the pure-Python references) and assert they all passed, none skipped."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYMETAQ_NO_EXTENSIONS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
