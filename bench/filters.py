"""A filtered group's fetch throughput against an unfiltered one, same broker, same run:
``python bench/filters.py [--messages N] [--rounds R] [--json]``.

One broker (``tests/_broker.py``) with topic ``bench`` and ``group.filtered`` naming a filter
(``bench_filters:keep_all`` or ``:keep_half``, written to a temporary ``appClassPath``).
``--messages`` records of ``--size`` bytes are loaded once; then each case reads the whole
partition with raw ``get`` s of ``--max-size`` bytes (one in flight, following 301s), as
group ``plain`` (no filter: ``sendfile``) and as group ``filtered``:

| case      | what                                                                  |
|-----------|-----------------------------------------------------------------------|
| plain     | no filter: zero-copy                                                  |
| keep_all  | a filter that keeps everything: the cost of reading + calling it      |
| keep_half | keeps runs of 100 messages, skips the next 100: a 301 per skipped run  |

Output: one JSON line per case (``case, msgs_per_s`` of messages *scanned*, ``delivered``,
``seconds``: the best of the rounds) and a table.  Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pymetaq.client import Producer  # noqa: E402
from pymetaq.client.protocol import (  # noqa: E402
    NEED_DATA,
    Limits,
    Parser,
    ResultReply,
    Role,
    ValueReply,
)
from pymetaq.storage.record import iter_records  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402

FILTERS = """
def keep_all(attribute, data):
    return True

def keep_half(attribute, data):
    return int(data[-8:]) // 100 % 2 == 0
"""


def read_all(port: int, group: str, max_size: int) -> tuple[int, float]:
    sock = socket.create_connection(("127.0.0.1", port))
    parser = Parser(Role.CLIENT, Limits(max_body=8 << 20))
    offset = delivered = 0
    start = time.perf_counter()
    try:
        while True:
            sock.sendall(b"get bench %s 0 %d %d 1\r\n" % (group.encode(), offset, max_size))
            while (event := parser.next_event()) is NEED_DATA:
                parser.feed(sock.recv(1 << 20))
            if isinstance(event, ValueReply):
                records = list(iter_records(event.data, offset, verify=False))
                delivered += len(records)
                offset = records[-1].offset + records[-1].size
            elif isinstance(event, ResultReply) and event.code == 301:
                offset = int(event.body)
            else:
                return delivered, time.perf_counter() - start
    finally:
        sock.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--max-size", type=int, default=1 << 20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="JSON lines only")
    args = ap.parse_args(argv)
    best: dict[str, tuple[float, int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        mods = Path(tmp) / "mods"
        mods.mkdir()
        (mods / "bench_filters.py").write_text(FILTERS, encoding="utf-8")
        for case in ("keep_all", "keep_half"):
            topics = {"bench": {"group.filtered": f"bench_filters:{case}"}}
            system = {"idleTimeoutMs": 0, "appClassPath": str(mods)}
            with BrokerProcess.start(Path(tmp), topics=topics, system=system, name=case) as b:
                with Producer(f"meta://127.0.0.1:{b.port}", batch_messages=1000) as p:
                    for i in range(0, args.messages, 1000):
                        n = min(1000, args.messages - i)
                        values = [b"x" * (args.size - 8) + b"%08d" % (i + j) for j in range(n)]
                        p.send_many("bench", values, partition=0)
                    p.flush()
                for _ in range(args.rounds):
                    for name, group in (("plain", "plain"), (case, "filtered")):
                        got, secs = read_all(b.port, group, args.max_size)
                        rate = args.messages / secs
                        if rate > best.get(name, (0.0, 0, 0.0))[0]:
                            best[name] = (rate, got, secs)
    for name, (rate, got, secs) in best.items():
        row = {"case": name, "msgs_per_s": round(rate), "delivered": got, "seconds": round(secs, 2)}
        print(json.dumps(row))
    if not args.json:
        plain = best["plain"][0]
        print(f"\n{'case':<10}{'scanned msgs/s':>16}{'delivered':>11}{'vs plain':>10}")
        for name, (rate, got, _) in best.items():
            print(f"{name:<10}{rate:>16,.0f}{got:>11}{rate / plain:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
