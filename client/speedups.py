"""The client's optional C accelerator, or None: ``pymetaq.client._speedups``
(``client/_speedups.c``): the lane path of ``send_async(topic, value)``
(:func:`pymetaq.client.producer.lanes.lane_sender`), the send callbacks (a lane handle's
``add_done_callback`` and ``exception``, a batch's callback loop), and the consumer's
``Message`` building; figures in docs/benchmarks.md.

Optional at build time and switched off by ``PYMETAQ_NO_EXTENSIONS=1``, as the record
format's accelerator (:mod:`pymetaq.storage.speedups`, which says how both are chosen).
:data:`SPEEDUPS_IMPL` names the one in use: ``"c"`` or ``"python"``.

Thread-safe: read-only after import.
"""

from __future__ import annotations

from types import ModuleType

from pymetaq.storage.speedups import load

#: the extension module, or None (pure Python)
speedups: ModuleType | None = load("pymetaq.client._speedups")
SPEEDUPS_IMPL = "c" if speedups is not None else "python"

__all__ = ["SPEEDUPS_IMPL", "speedups"]
