"""The CRC32 the hot paths use (``storage.checksum.crc32``): ISA-L's when ``isal`` is installed
(the ``fast`` extra, part of ``test``), else the C accelerator's, else zlib's (or zlib's with
``PYMETAQ_CRC=zlib``). Each must
give zlib's value for every input, offset and running value, on every buffer type the callers
pass (bytes, bytearray, memoryview slices)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from pymetaq.storage import checksum as cs


def test_the_suite_runs_the_accelerated_crc() -> None:
    # the test extra installs the fast extra: the suite checks what users of it run
    assert cs.CRC32_IMPL == "isal", cs.CRC32_IMPL


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 0xFFFFFFFF), st.integers(0, 64))
def test_fast_crc32_equals_zlib_and_crcmod(data: bytes, start: int, cut: int) -> None:
    assert cs.crc32(data) == zlib.crc32(data)
    assert cs.crc32(data, start) == zlib.crc32(data, start)
    with memoryview(data) as mv:
        part = mv[cut:]
        assert cs.crc32(part) == zlib.crc32(part)
    assert cs.crc32(bytearray(data)) == zlib.crc32(data)
    assert cs.checksum(data) == cs.checksum_reference(data)


def _impl_in_child(
    env_value: str | None, *, no_isal: bool = False, no_extensions: bool = False
) -> str:
    env = dict(os.environ)
    env.pop("PYMETAQ_CRC", None)
    env.pop("PYMETAQ_NO_EXTENSIONS", None)
    if env_value is not None:
        env["PYMETAQ_CRC"] = env_value
    if no_extensions:
        env["PYMETAQ_NO_EXTENSIONS"] = "1"
    code = (
        ("import sys; sys.modules['isal'] = None\n" if no_isal else "")  # import fails
        + "from pymetaq.storage import checksum as c\n"
        "from pymetaq.client.consumer import scan\n"
        "assert scan._crc is c.crc32\n"
        "assert c.checksum(b'123456789') == 0xCBF43926 & 0x7FFFFFFF\n"
        "print(c.CRC32_IMPL)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_pymetaq_crc_zlib_forces_zlib() -> None:
    assert _impl_in_child("zlib") == "zlib"
    assert _impl_in_child(" ZLIB ") == "zlib"
    assert _impl_in_child(None) == "isal"
    assert _impl_in_child("anything-else") == "isal"


def test_without_isal_the_c_accelerators_crc_is_used_then_zlibs() -> None:
    assert _impl_in_child(None, no_isal=True) == "c"
    assert _impl_in_child("zlib", no_isal=True) == "zlib"
    assert _impl_in_child(None, no_isal=True, no_extensions=True) == "zlib"
