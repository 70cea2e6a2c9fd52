"""TLS against plaintext, same broker, same run: ``python bench/tls.py --seconds S [--json]``.

One broker (``tests/_broker.py``) listens plain on ``serverPort`` and TLS on ``tlsPort``
(certificates made with ``openssl`` by ``tests/security/_helpers.py``; ECDSA P-256, TLS 1.3).
Cases, each over ``plain`` and ``tls``:

| case     | what                                                                          |
|----------|-------------------------------------------------------------------------------|
| produce  | ``Producer.send_many`` of ``--batch`` messages per call for ``S`` s           |
| consume  | ``Consumer.poll()`` of partition 0 from offset 0 until drained (or ``S`` s)    |
| get      | raw ``get`` of ``--max-size`` bytes, one in flight, partition 0 from offset 0: |
|          | the broker's fetch path alone (plain = ``sendfile``; TLS = one ``pread`` + an |
|          | encrypted write per reply)                                                    |

Output: one JSON line per row with ``--json`` (``case, transport, msgs_per_s, MB_per_s,
messages, seconds``) and a table with the TLS/plain ratio per case.  Timings on a shared
machine are noisy: run it more than once.
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import text_table  # noqa: E402
from pymetaq.client import Producer  # noqa: E402
from pymetaq.client.consumer import Consumer, TopicPartition  # noqa: E402
from pymetaq.client.protocol import NEED_DATA, Limits, Parser, ResultReply, Role  # noqa: E402
from tests._broker import BrokerProcess  # noqa: E402
from tests.security._helpers import Pki, make_pki, security_ini, tls_port  # noqa: E402

TOPIC = "bench"


def _url(transport: str, broker: BrokerProcess, pki: Pki) -> str:
    if transport == "plain":
        return f"meta://127.0.0.1:{broker.port}"
    return f"meta+tls://localhost:{tls_port(broker)}?ca={pki.pem('ca')}"


def _row(
    case: str, transport: str, messages: int, nbytes: int, seconds: float
) -> dict[str, object]:
    return {
        "case": case,
        "transport": transport,
        "msgs_per_s": round(messages / seconds) if seconds else 0,
        "MB_per_s": round(nbytes / seconds / 1e6, 1) if seconds else 0.0,
        "messages": messages,
        "seconds": round(seconds, 2),
    }


def produce(
    url: str, transport: str, args: argparse.Namespace, partition: int
) -> dict[str, object]:
    values = [b"p" * args.size] * args.batch
    with Producer(url, batch_messages=args.batch, max_in_flight=8) as p:
        p.partitions(TOPIC)
        sent = 0
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            p.send_many(TOPIC, values, partition=partition)
            sent += args.batch
        p.flush()
        elapsed = time.perf_counter() - start
    return _row("produce", transport, sent, sent * (args.size + 20), elapsed)


def consume(url: str, transport: str, args: argparse.Namespace, total: int) -> dict[str, object]:
    got = 0
    with Consumer(url, None, initial_position="earliest", fetch_max_size=args.max_size) as c:
        c.subscribe(TOPIC)
        c.assign([TopicPartition(TOPIC, 0, 0)])
        start = time.perf_counter()
        while got < total and time.perf_counter() - start < args.seconds * 4:
            got += len(c.poll(1.0))
        elapsed = time.perf_counter() - start
    return _row("consume", transport, got, got * (args.size + 20), elapsed)


def raw_get(
    broker: BrokerProcess, pki: Pki, transport: str, args: argparse.Namespace
) -> dict[str, object]:
    raw = socket.create_connection(
        ("127.0.0.1", broker.port if transport == "plain" else tls_port(broker))
    )
    sock: socket.socket = raw
    if transport == "tls":
        ctx = ssl.create_default_context(cafile=pki.pem("ca"))
        sock = ctx.wrap_socket(raw, server_hostname="localhost")
    parser = Parser(Role.CLIENT, Limits.for_transfer_size(args.max_size))
    offset, nbytes, replies = 0, 0, 0
    start = time.perf_counter()
    with sock:
        while time.perf_counter() - start < args.seconds * 4:
            sock.sendall(b"get %s g 0 %d %d 1\r\n" % (TOPIC.encode(), offset, args.max_size))
            while (event := parser.next_event()) is NEED_DATA:
                parser.feed(sock.recv(1 << 20))
            if isinstance(event, ResultReply):
                break  # 404: the end of the partition
            data = event.data  # type: ignore[union-attr]
            offset += len(data)  # slices end on record boundaries (the broker trims them)
            nbytes += len(data)
            replies += 1
    elapsed = time.perf_counter() - start
    messages = nbytes // (args.size + 20)
    return _row("get", transport, messages, nbytes, elapsed)


def table(rows: list[dict[str, object]]) -> str:
    cols = ["case", "transport", "msgs_per_s", "MB_per_s", "messages", "seconds", "tls/plain"]
    plain = {r["case"]: r for r in rows if r["transport"] == "plain"}
    for r in rows:
        base = plain.get(r["case"])
        ratio = float(r["MB_per_s"]) / float(base["MB_per_s"]) if base and base["MB_per_s"] else 0
        r["tls/plain"] = f"{ratio:.2f}" if r["transport"] == "tls" else ""
    return text_table(cols, [[r[c] for c in cols] for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per produce case")
    ap.add_argument("--json", action="store_true", help="JSON lines on stdout")
    ap.add_argument("--size", type=int, default=100, help="message payload bytes")
    ap.add_argument("--batch", type=int, default=1000, help="messages per send_many")
    ap.add_argument(
        "--max-size",
        type=int,
        default=1 << 20,
        help="bytes per get (at most maxTransferSize, 1 MiB)",
    )
    args = ap.parse_args(argv)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="pymetaq-tls-") as tmp:
        base = Path(tmp)
        pki = make_pki(base / "pki")
        sec = {
            "tlsPort": "0",
            "tlsCertFile": pki.pem("localhost"),
            "tlsKeyFile": pki.key("localhost"),
        }
        system = f"[topic={TOPIC}]\nnumPartitions=2\n"
        ini = security_ini(base / "data", sec, topics=system)
        with BrokerProcess.start(base, ini_text=ini) as broker:
            plain, tls = _url("plain", broker, pki), _url("tls", broker, pki)
            rows.append(produce(plain, "plain", args, 0))
            rows.append(produce(tls, "tls", args, 1))
            total = int(rows[0]["messages"])  # type: ignore[call-overload]
            for transport, url in (("plain", plain), ("tls", tls)):
                rows.append(consume(url, transport, args, total))
            for transport in ("plain", "tls"):
                rows.append(raw_get(broker, pki, transport, args))
    for r in rows:
        if args.json:
            print(json.dumps(r), flush=True)
    print(table(rows), file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
