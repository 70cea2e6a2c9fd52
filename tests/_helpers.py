"""Helpers shared by every test folder: the one bounded wait.

``wait_for(cond, timeout_s, what)`` re-checks ``cond()`` until it returns something truthy
(which it returns) or ``timeout_s`` passes (``AssertionError`` naming ``what``). It is for
conditions that only polling can observe (another process's files or replies); where a test
can wait on an event, a future or a thread's join, it does that instead.
"""

from __future__ import annotations

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
