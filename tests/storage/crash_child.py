"""Child process of test_crash: appends to one partition and reports every ack.

argv: ``data_path seed [threshold [segment_bytes]]`` (threshold 0 = group commit, the default;
N > 0 = MetaQ's threshold mode, acked at once; segments of 8192 bytes by default, so almost
every batch of a round lands near a roll).  Each acknowledged batch is printed as one line
``<offset> <count> <batch_index>`` and flushed; the payloads of batch ``b`` are derived from
(seed, b) so the parent can recompute them.
"""

from __future__ import annotations

import os
import random
import sys
import threading

from pymetaq.storage import AppendResult, MessageStoreManager, StoreConfig, TopicStoreConfig
from pymetaq.storage.record import encode_record


def payloads(seed: int, b: int) -> list[bytes]:
    rng = random.Random(seed * 1_000_003 + b)
    return [rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(1, 8))]


def main() -> None:
    path, seed = sys.argv[1], int(sys.argv[2])
    threshold = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    segment = int(sys.argv[4]) if len(sys.argv) > 4 else 8192
    cfg = TopicStoreConfig(unflush_threshold=threshold, unflush_interval_ms=10_000)
    m = MessageStoreManager(StoreConfig(path, max_segment_size=segment), lambda t: cfg)
    m.open()
    m.start()
    plog = m.get_log("t", 0)
    assert plog is not None
    out_lock = threading.Lock()
    inflight = threading.Semaphore(16)
    start_b = int.from_bytes(os.urandom(4), "big")  # batch indices unique across runs

    def ack(r: AppendResult, e: BaseException | None, b: int) -> None:
        inflight.release()
        if e is None:
            with out_lock:
                sys.stdout.write(f"{r.offset} {r.count} {b}\n")
                sys.stdout.flush()

    b = start_b
    while True:
        inflight.acquire()
        buf = bytearray(b"".join(encode_record(p) for p in payloads(seed, b)))
        plog.append(buf, on_durable=lambda r, e, b=b: ack(r, e, b))  # type: ignore[misc]
        b += 1


if __name__ == "__main__":
    main()
