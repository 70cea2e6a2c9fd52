"""CRC32 as MetaQ computes it: ``CRC32(data) & 0x7FFFFFFF``.

The hot paths (the client's record building and scan, the broker's put validation and
recovery) call :data:`crc32`: ISA-L's ``isal_zlib.crc32`` when the optional ``isal`` package is
installed (``pip install 'pymetaq[fast]'``), else the record format's C accelerator's
(``storage/_speedups.c``: PCLMULQDQ folding, as fast as ISA-L's on 100 bytes) when it is
built and extensions are not turned off, else :func:`zlib.crc32`. All compute the same
CRC (CRC-32/ISO-HDLC, the one ``crcmod.predefined`` calls ``crc-32``; the tests cross-check
each against crcmod) with the same signature (``crc32(data, value=0)``, any buffer). They
differ in speed on short inputs: zlib 1.2's table loop costs about 1.5 ns per byte below a
few hundred bytes (100 bytes: 0.18 us per call on this machine), ISA-L's folding 0.045 us, so
a 100-byte message's CRC, paid once by the producer, once by the broker and once by the
consumer, drops from the largest single cost of the consume path to a small one (figures in
docs/benchmarks.md). ``PYMETAQ_CRC=zlib`` in the environment forces zlib (to measure or
rule out the accelerator); :data:`CRC32_IMPL` names the one in use. zlib is also measured
about twice as fast as crcmod (0.18 us vs 0.37 us per 100-byte call).  crcmod is the project's *reference*
implementation, used only by :func:`checksum_reference` (tests cross-check the two): it is
imported there, on first use, and that is where its C extension is required (the pure-Python
fallback is orders of magnitude slower), so importing this module never needs crcmod.

Thread-safe: pure functions.
"""

from __future__ import annotations

import functools
import os
import sys
import zlib
from collections.abc import Callable

#: the 31-bit mask of MetaQ's record checksum (the sign bit of the int32 field is always 0).
MASK31 = 0x7FFFFFFF


def _pick_crc32() -> tuple[Callable[..., int], str]:
    """ISA-L's CRC32 if ``isal`` is importable, else the C accelerator's if it is built (and
    extensions are on), else zlib's; zlib's whenever ``PYMETAQ_CRC`` is ``zlib``."""
    if os.environ.get("PYMETAQ_CRC", "").strip().lower() != "zlib":
        try:
            from isal import isal_zlib
        except ImportError:
            pass
        else:
            fast: Callable[..., int] = isal_zlib.crc32
            return fast, "isal"
        from pymetaq.storage.speedups import speedups

        if speedups is not None:
            ours: Callable[..., int] = speedups.crc32
            return ours, "c"
    return zlib.crc32, "zlib"


crc32: Callable[..., int]
#: ``crc32(data, value=0) -> int``: zlib's signature and result, the fastest one installed;
#: CRC32_IMPL: ``"isal"``, ``"c"`` or ``"zlib"``
crc32, CRC32_IMPL = _pick_crc32()


def checksum(data: bytes | bytearray | memoryview) -> int:
    """MetaQ's record checksum: CRC32 of ``data`` masked to 31 bits."""
    return crc32(data) & MASK31


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
