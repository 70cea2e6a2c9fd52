"""The optional C accelerators: which are built, and whether they are used.

Two extension modules, each optional at build time (without a C compiler pip builds the
package without them) and each the exact equivalent of pure-Python code that stays the
reference and the fallback (the tests compare them on the same inputs):

* ``pymetaq.storage._speedups`` (``storage/_speedups.c``), here as :data:`speedups`: the
  record format's CRC32, the records of a producer's batch (:func:`pymetaq.storage.record.record_parts`)
  and the broker's check of a uniform batch's CRCs (:mod:`pymetaq.storage.batch`);
* ``pymetaq.client._speedups`` (``client/_speedups.c``, loaded by :mod:`pymetaq.client.speedups`):
  ``send_async(topic, value)``'s lane path.

``PYMETAQ_NO_EXTENSIONS=1`` in the environment runs pure Python everywhere (to measure the
accelerators or rule them out, as aiokafka's ``AIOKAFKA_NO_EXTENSIONS``); :data:`SPEEDUPS_IMPL`
names what this process uses: ``"c"`` or ``"python"``.

Thread-safe: read-only after import.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def extensions_disabled() -> bool:
    """``PYMETAQ_NO_EXTENSIONS`` is set to anything but empty or ``0``."""
    return os.environ.get("PYMETAQ_NO_EXTENSIONS", "").strip() not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The extension module ``name``, or None if it is not built or extensions are off."""
    if extensions_disabled():
        return None
    try:  # by name: an extension imports nothing of ours (no edge in the import graph)
        return importlib.import_module(name)
    except ImportError:
        return None


#: ``pymetaq.storage._speedups``, or None (pure Python)
speedups: ModuleType | None = load("pymetaq.storage._speedups")
SPEEDUPS_IMPL = "c" if speedups is not None else "python"

__all__ = ["SPEEDUPS_IMPL", "extensions_disabled", "load", "speedups"]
