"""Shortages are not failures: no descriptors or no space never fail a partition for good.

Each scenario runs in a child process with a real, low ``RLIMIT_NOFILE`` (or a real full
tmpfs): the shortage makes the operation fail cleanly (a retriable error, nothing written, the
write not acknowledged), and once the resource is back the same log goes on, with everything it
acknowledged intact.  Before the fix an EMFILE in the fsync path (``dup`` of the descriptor)
marked the log failed until restart.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import os, resource, sys, time
    from pymetaq.storage import MessageStoreManager, ResourceExhausted, StoreConfig, TopicStoreConfig
    from pymetaq.storage.record import encode_record

    cfg = TopicStoreConfig(unflush_threshold=0)
    m = MessageStoreManager(StoreConfig(sys.argv[1], max_segment_size=4096), lambda t: cfg)
    m.open()
    m.start()
    plog = m.get_log("t", 0)
    first = plog.append_sync(bytearray(encode_record(b"before")), timeout=10)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hog = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    try:
        while True:
            hog.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    acks = []
    # no descriptor for the fsync: the append is written but not acknowledged
    plog.append(bytearray(encode_record(b"during")), on_durable=lambda r, e: acks.append(e))
    time.sleep(0.3)  # several flusher retries happen meanwhile
    print("acked during shortage:", len(acks), "failed:", plog.failed)
    # a roll needs a new file: refused, retriable, nothing written
    try:
        plog.append(bytearray(encode_record(b"x" * 4050)))
        print("roll: appended")
    except ResourceExhausted as e:
        print("roll: ResourceExhausted", e.retriable, plog.write_offset)
    for fd in hog:
        os.close(fd)
    deadline = time.monotonic() + 10
    while not acks and time.monotonic() < deadline:
        time.sleep(0.01)
    print("acked after:", acks, "failed:", plog.failed)
    r = plog.append_sync(bytearray(encode_record(b"x" * 4050)), timeout=10)
    print("roll after:", r.offset, len(plog.segments))
    m.close()
    """
)


def test_emfile_in_sync_and_roll_is_transient(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "acked during shortage: 0 failed: False", proc.stdout + proc.stderr
    assert out[1] == "roll: ResourceExhausted True 52", proc.stdout
    assert out[2] == "acked after: [None] failed: False", proc.stdout
    assert out[3] == "roll after: 52 2", proc.stdout
    assert "sync postponed" in proc.stderr  # logged once, as a warning
