"""Test-only crash points inside the commit protocol.

A broker crash *during* a commit (after the commit record is durable and before every partition
append is) lasts microseconds: a SIGKILL sent from a test at a random moment almost never lands
there.  The crash-matrix tests therefore start the broker with
``PYMETAQ_TX_CRASHPOINT=<name>`` (optionally ``<name>:<n>`` to crash at the n-th time the point
is reached) and the broker SIGKILLs itself at that point.  Names:

| name                    | where                                                          |
|-------------------------|----------------------------------------------------------------|
| ``commit-intent``       | the commit record is durable; no partition appended yet         |
| ``commit-mid-append``   | the first partition's append was handed to storage, others not  |
| ``commit-appended``     | every partition append is durable; the APPLIED record not written |

Without the variable :func:`reached` is a dictionary lookup that returns at once.
Thread-safety: a lock around the counter.
"""

from __future__ import annotations

import os
import signal
import threading

_SPEC = os.environ.get("PYMETAQ_TX_CRASHPOINT", "")
_NAME, _, _NTH = _SPEC.partition(":")
_lock = threading.Lock()
_count = 0


def reached(name: str) -> None:
    """SIGKILL this process if it was started with this crash point armed."""
    global _count
    if not _NAME or name != _NAME:
        return
    with _lock:
        _count += 1
        if _count < int(_NTH or 1):
            return
    os.kill(os.getpid(), signal.SIGKILL)
