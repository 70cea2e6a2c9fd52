"""A full disk at a live broker (a real 8 MiB tmpfs; the tests run as root, CI too).

Before the fix a segment was a sparse file written through a shared mmap: when the tmpfs
filled up the broker died of SIGBUS.  Now space is reserved (``posix_fallocate``) before a
byte is written, with either ``segmentWrites`` (``pwrite``, the default, or ``mmap``): a put
that finds no space gets an error reply (never an ack), the broker keeps serving reads, and
writes resume as soon as space is freed.  The low-disk
threshold (``minFreeDiskBytes``) refuses puts before the disk is actually full.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.storage.record import iter_records
from tests._broker import BrokerProcess
from tests.server._helpers import Wire, bput_frame
from tests.server._mounts import tmpfs as mount_tmpfs

pytestmark = pytest.mark.integration

MiB = 1 << 20


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs mounted under ``tmp_path`` (unmounted afterwards)."""
    with mount_tmpfs(tmp_path / "disk", "8m") as mnt:
        yield mnt


def fetch_all(w: Wire, topic: str) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    offset = 0
    while True:
        reply = w.call(b"get %s g 0 %d 1048576 1\r\n" % (topic.encode(), offset))
        if isinstance(reply, ResultReply):
            assert reply.code == 404, reply
            return out
        assert isinstance(reply, ValueReply)
        records = list(iter_records(reply.data, offset))
        for r in records:
            out[r.offset] = r.data
        offset = records[-1].offset + records[-1].size


def put_until_refused(w: Wire, acked: dict[int, bytes], tag: bytes, limit: int) -> ResultReply:
    """bput 64 KiB batches until one is refused; every acknowledged record goes to ``acked``."""
    for n in range(limit):
        payloads = [tag + b"-%d-%d-" % (n, i) + b"z" * 1000 for i in range(64)]
        reply = w.call(bput_frame("t", 0, payloads, n))
        assert isinstance(reply, ResultReply)
        if reply.code != 200:
            return reply
        offset = int(reply.body.split()[2])
        for p in payloads:
            acked[offset] = p
            offset += 20 + len(p)
    raise AssertionError(f"no refusal after {limit} batches")


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@pytest.mark.parametrize("writes", ["pwrite", "mmap"])
def test_enospc_is_an_error_reply_and_writes_resume(tmpfs: Path, writes: str) -> None:
    ballast = tmpfs / "ballast"
    ballast.write_bytes(b"\1" * (3 * MiB))
    # minFreeDiskBytes=0: the ENOSPC path itself; segmentWrites=mmap would die of SIGBUS
    # without the reservation
    system = {"maxSegmentSize": MiB, "minFreeDiskBytes": 0, "segmentWrites": writes}
    with (
        BrokerProcess.start(tmpfs, topics={"t": {}}, system=system) as broker,
        Wire(broker.address) as w,
    ):
        acked: dict[int, bytes] = {}
        refused = put_until_refused(w, acked, b"a", limit=200)
        assert refused.code == 500 and b"No space left on device" in refused.body, refused
        # the configured write path is the one in use: only mmap maps the active segment
        maps = Path(f"/proc/{broker.proc.pid}/maps").read_text()  # type: ignore[union-attr]
        assert (".meta" in maps) == (writes == "mmap"), maps
        assert len(acked) > 1000
        for n in range(20):  # more puts: still refused, never a crash
            again = w.call(bput_frame("t", 0, [b"x" * 1000] * 64, 1000 + n))
            assert isinstance(again, ResultReply) and again.code == 500, again
        assert broker.proc is not None and broker.proc.poll() is None, broker.log_text()
        assert fetch_all(w, "t") == acked  # reads keep working; nothing acknowledged lost
        ballast.unlink()  # space returns: writes resume at once
        refused = put_until_refused(w, acked, b"b", limit=200)
        assert b"No space left on device" in refused.body
        assert fetch_all(w, "t") == acked
        assert broker.terminate() == 0
        broker.launch()
        with Wire(broker.address) as w2:
            assert fetch_all(w2, "t") == acked
    assert "Traceback" not in broker.log_text()


def test_low_disk_threshold_refuses_puts_before_the_disk_is_full(tmpfs: Path) -> None:
    system = {"maxSegmentSize": MiB, "minFreeDiskBytes": 3 * MiB}
    with (
        BrokerProcess.start(tmpfs, topics={"t": {}}, system=system) as broker,
        Wire(broker.address) as w,
    ):
        acked: dict[int, bytes] = {}
        refused = put_until_refused(w, acked, b"a", limit=200)
        assert refused.code == 500, refused
        assert b"low on disk space" in refused.body and b"minFreeDiskBytes" in refused.body
        assert free_bytes(tmpfs) >= 2 * MiB  # refused well before the disk was full
        assert fetch_all(w, "t") == acked
        assert broker.proc is not None and broker.proc.poll() is None
