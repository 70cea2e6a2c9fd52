"""CRC32 as MetaQ computes it: ``CRC32(data) & 0x7FFFFFFF`` (stdlib only).

The hot paths use :func:`zlib.crc32` — the same polynomial (CRC-32/ISO-HDLC, the one
``crcmod.predefined`` calls ``crc-32``) and measured about twice as fast as crcmod on this
machine (100-byte input: 0.18 us vs 0.37 us per call).  crcmod is the project's *reference*
implementation, used only by :func:`checksum_reference` (tests cross-check the two): it is
imported there, on first use, and that is where its C extension is required (the pure-Python
fallback is orders of magnitude slower), so importing this module never needs crcmod.

Thread-safe: pure functions.
"""

from __future__ import annotations

import functools
import sys
import zlib
from collections.abc import Callable

#: the 31-bit mask of MetaQ's record checksum (the sign bit of the int32 field is always 0).
MASK31 = 0x7FFFFFFF


def checksum(data: bytes | bytearray | memoryview) -> int:
    """MetaQ's record checksum: CRC32 of ``data`` masked to 31 bits."""
    return zlib.crc32(data) & MASK31


@functools.cache
def _crcmod_crc32() -> Callable[[bytes], int]:
    """crcmod's CRC-32 (C extension required: raises ImportError naming the fix otherwise)."""
    import crcmod.predefined

    if not getattr(sys.modules.get("crcmod.crcmod"), "_usingExtension", False):
        raise ImportError(
            "crcmod's C extension (crcmod._crcfunext) is not active; the pure-Python fallback "
            "is orders of magnitude slower. Reinstall crcmod with gcc and the Python headers "
            "present: apt-get install gcc python3-dev && "
            "pip install --force-reinstall --no-binary crcmod crcmod"
        )
    fn: Callable[[bytes], int] = crcmod.predefined.mkCrcFun("crc-32")
    return fn


def checksum_reference(data: bytes) -> int:
    """The same value computed with crcmod (used by tests to cross-check)."""
    return int(_crcmod_crc32()(data)) & MASK31
