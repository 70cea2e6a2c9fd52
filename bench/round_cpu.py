"""CPU and time per produce round trip: ``python -m bench.round_cpu [--client raw|async|thread]
[--against OTHER_PYTHON] [--json]``.

A closed loop: one message goes out, its ack comes back, the next goes out. Nothing overlaps,
so a round is the sum of what each side spends on it (the client's CPU, the broker's CPU, the
device's fsync, the loopback), and the CPU per round of each process - read from
``/proc/<pid>/stat``, user and system apart - says where a round's time goes. This is how two
versions are compared on a shared machine whose wall-clock figures swing (``--against`` names
the Python of another checkout's virtualenv; the two run alternately, each with its own
broker, so the broker's code is that checkout's too).

Clients (``--client``):

* ``raw``: a socket writing idempotent 9-token ``bput``s of ``--records`` 100-byte records,
  ``--bputs`` of them per round (pipelined), reading the replies: the broker's cost alone;
* ``async``: ``await AsyncProducer.send_nowait(topic, 100 bytes)``;
* ``thread``: ``Producer.send_async(topic, 100 bytes).result()``.

Each variant runs ``--rounds`` times; a run is a fresh broker (group commit, the packaged
standalone configuration, topic `test`) and ``--warmup`` rounds before ``--count`` measured ones. Printed:
round p50 and p99, and per round the broker's user and system CPU and the client's (user and
system; for ``raw`` the client is this script's loop and not reported), as medians over the
runs with their ranges.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench.common import variant_table

CHILD = r"""
import asyncio, json, os, socket, subprocess, sys, tempfile, time, uuid
client, count, warmup, bputs, records = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
work = tempfile.mkdtemp(prefix="round-cpu-")
probe = socket.socket(); probe.bind(("127.0.0.1", 0)); port = probe.getsockname()[1]; probe.close()
broker = subprocess.Popen([sys.executable, "-m", "pymetaq.server.cli", "server", "--port", str(port)],
                          cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

def cpu(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick

def wait_up():
    for _ in range(300):
        try:
            return socket.create_connection(("127.0.0.1", port))
        except OSError:
            time.sleep(0.05)
    raise SystemExit("broker did not start")

def summary(times, before, after):
    (b0, c0), (b1, c1) = before, after
    times.sort()
    return {
        "p50_us": times[len(times) // 2] * 1e6,
        "p99_us": times[int(len(times) * 0.99)] * 1e6,
        "broker_user_us": (b1[0] - b0[0]) / count * 1e6,
        "broker_sys_us": (b1[1] - b0[1]) / count * 1e6,
        "client_user_us": (c1[0] - c0[0]) / count * 1e6,
        "client_sys_us": (c1[1] - c0[1]) / count * 1e6,
    }

def both_cpus():
    return cpu(broker.pid), cpu(os.getpid())

def measure(one_round):
    for _ in range(warmup):
        one_round()
    times = []
    before = both_cpus()
    for _ in range(count):
        t = time.perf_counter()
        one_round()
        times.append(time.perf_counter() - t)
    return summary(times, before, both_cpus())

def raw():
    sock = wait_up()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    from pymetaq.storage.record import encode_record
    body = encode_record(b"x" * 100) * records
    pid = uuid.uuid4().hex.encode()
    seq = [0]
    buf = bytearray()

    def reply():
        nonlocal buf
        while b"\r\n" not in buf:
            buf += sock.recv(65536)
        end = buf.index(b"\r\n")
        line = bytes(buf[:end])
        size = int(line.split()[2])
        while len(buf) < end + 2 + size:
            buf += sock.recv(65536)
        answer = bytes(buf[end + 2 : end + 2 + size])
        del buf[: end + 2 + size]
        if not line.startswith(b"result 200 "):
            raise SystemExit(f"broker refused a bput: {line!r} {answer!r}")

    def one_round():
        out = []
        for _ in range(bputs):
            n = seq[0]; seq[0] += 1
            out.append(b"bput test 0 %d %d -1 %s %d %d\r\n" % (len(body), records, pid, n, n) + body)
        sock.sendall(b"".join(out))
        for _ in range(bputs):
            reply()

    row = measure(one_round)
    sock.close()
    return row

def thread():
    from pymetaq.client import Producer
    wait_up().close()
    with Producer(f"meta://127.0.0.1:{port}", linger_ms=0, max_in_flight=8) as p:
        payload = b"x" * 100
        return measure(lambda: p.send_async("test", payload).result())

def async_():
    from pymetaq.client import AsyncProducer
    wait_up().close()

    async def main():
        async with AsyncProducer(f"meta://127.0.0.1:{port}", linger_ms=0, max_in_flight=8) as p:
            await p.publish("test")
            payload = b"x" * 100
            for _ in range(warmup):
                await p.send_nowait("test", payload)
            times = []
            before = both_cpus()
            for _ in range(count):
                t = time.perf_counter()
                await p.send_nowait("test", payload)
                times.append(time.perf_counter() - t)
            return summary(times, before, both_cpus())

    return asyncio.run(main())

try:
    row = {"raw": raw, "thread": thread, "async": async_}[client]()
finally:
    broker.terminate()
    broker.wait(30)
print(json.dumps(row))
"""

FIELDS = (
    "p50_us",
    "p99_us",
    "broker_user_us",
    "broker_sys_us",
    "client_user_us",
    "client_sys_us",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", choices=("raw", "async", "thread"), default="raw")
    ap.add_argument("--count", type=int, default=5000, help="measured rounds per run")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3, help="runs per variant, alternating")
    ap.add_argument("--bputs", type=int, default=1, help="raw: bputs per round")
    ap.add_argument("--records", type=int, default=1, help="raw: 100-byte records per bput")
    ap.add_argument("--against", help="the python of another checkout's venv")
    ap.add_argument("--json", action="store_true", help="JSON lines on stdout, table on stderr")
    args = ap.parse_args()
    if args.count < 100 or args.warmup < 0 or args.bputs < 1 or args.records < 1:
        ap.error("--count >= 100, --warmup >= 0, --bputs and --records >= 1")
    pythons = {"this": sys.executable}
    if args.against:
        pythons["against"] = args.against
    found: dict[str, list[dict[str, float]]] = {name: [] for name in pythons}
    for r in range(args.rounds):
        for name, python in pythons.items():
            argv = [python, "-c", CHILD, args.client, str(args.count), str(args.warmup)]
            argv += [str(args.bputs), str(args.records)]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                print(f"{name}: the run failed:\n{out.stderr.strip()}", file=sys.stderr)
                return 1
            row = json.loads(out.stdout.strip().splitlines()[-1])
            found[name].append(row)
            print(
                f"run {r + 1}: {name} p50 {row['p50_us']:.0f} us, broker "
                f"{row['broker_user_us']:.0f}+{row['broker_sys_us']:.0f} us, client "
                f"{row['client_user_us']:.0f}+{row['client_sys_us']:.0f} us per round",
                file=sys.stderr,
            )
    out_table = sys.stderr if args.json else sys.stdout
    shape = f"{args.bputs} bput(s) of {args.records} record(s)" if args.client == "raw" else "1"
    print(
        f"client {args.client}, {shape} per round, {args.count:,} rounds per run, "
        f"medians (min-max) of {args.rounds} runs, microseconds",
        file=out_table,
    )
    fields = [f for f in FIELDS if args.client != "raw" or not f.startswith("client")]
    medians, lines = variant_table(found, fields, "variant", 22)
    print("\n".join(lines), file=out_table)
    if args.json:
        for name, rows in found.items():
            print(
                json.dumps({"variant": name, "client": args.client, **medians[name], "runs": rows})
            )
    if "against" in medians:
        for f in fields:
            ratio = medians["this"][f] / medians["against"][f] if medians["against"][f] else 0.0
            print(f"this / against {f}: {ratio:.3f}", file=out_table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
