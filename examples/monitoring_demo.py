"""A broker with traffic to look at: ``python examples/monitoring_demo.py [--seconds N]``.

Starts ``pymetaq server`` on a fresh data directory with the dashboard on, two producers
(``orders``, 3 partitions; ``clicks``, 2), and two consumer groups reading ``orders`` at
different speeds with MetaQ's raw ``get``: ``billing`` keeps up, ``analytics`` falls behind.
It prints the broker's and the dashboard's addresses, then runs for ``--seconds``.
``--server HOST:PORT`` drives a broker you already run instead (the shipped config's topics:
``test``, 4 partitions, read by both groups; ``meta-test``, 1), then stops after ``--seconds``.
``--screenshot PATH`` saves the consumer-groups page (headless Chromium) after
``--shot-after`` seconds - that is how ``docs/monitoring-groups.png`` is made.

Thread-safety: a script.
"""

from __future__ import annotations

import argparse
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

INI = """[system]
serverPort=0
dashboardHttpPort={http}
dataPath={data}
unflushThreshold=0
stat=true
[zookeeper]
zk.zkEnable=false
[topic=orders]
numPartitions=3
[topic=clicks]
numPartitions=2
"""
HEADER = struct.Struct(">iiqi")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_reply(sock: socket.socket, buf: bytearray) -> bytes:
    """One ``result``/``value`` reply's body."""
    while b"\r\n" not in buf:
        buf += sock.recv(65536)
    line, _, rest = bytes(buf).partition(b"\r\n")
    tokens = line.split()
    length = int(tokens[2] if tokens[0] == b"result" else tokens[1])
    while len(rest) < length:
        rest += sock.recv(65536)
    buf[:] = rest[length:]
    return rest[:length]


def produce(port: int, topic: str, partitions: int, stop: threading.Event) -> None:
    rng = random.Random(topic)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        buf, i = bytearray(), 0
        while not stop.is_set():
            data = rng.randbytes(rng.randrange(100, 400))
            sock.sendall(
                b"put %s %d %d 0 -1 %d\r\n" % (topic.encode(), i % partitions, len(data), i) + data
            )
            read_reply(sock, buf)
            i += 1
            if i % 50 == 0:
                time.sleep(0.01)  # about 4,000 messages/s


def consume(
    port: int, topic: str, partitions: int, group: str, max_size: int, pause: float,
    stop: threading.Event,
) -> None:  # fmt: skip
    offsets = [0] * partitions
    with socket.create_connection(("127.0.0.1", port)) as sock:
        buf, n = bytearray(), 0
        while not stop.is_set():
            p = n % partitions
            n += 1
            get = b"get %s %s %d %d %d %d\r\n"
            sock.sendall(get % (topic.encode(), group.encode(), p, offsets[p], max_size, n))
            data, pos = read_reply(sock, buf), 0
            while pos + 20 <= len(data) and pos + 20 + HEADER.unpack_from(data, pos)[0] <= len(
                data
            ):
                pos += 20 + HEADER.unpack_from(data, pos)[0]
            offsets[p] += pos
            time.sleep(pause)


def screenshot(url: str, path: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--window-size=1280,900", f"--user-data-dir={tempfile.mkdtemp()}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(url)
        time.sleep(60)  # let the page's chart collect a minute of points
        driver.save_screenshot(path)
    finally:
        driver.quit()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--server", help="HOST:PORT of a running broker on the shipped config")
    p.add_argument("--screenshot", help="save the consumer-groups page here")
    p.add_argument("--shot-after", type=float, default=30, help="seconds before the screenshot")
    args = p.parse_args()
    if args.server:
        port = int(args.server.removeprefix("meta://").rpartition(":")[2])
        run(port, ("test", 4), ("meta-test", 1), args.seconds)
        return 0
    work = Path(tempfile.mkdtemp(prefix="pymetaq-demo-"))
    http = free_port()
    (work / "server.ini").write_text(INI.format(http=http, data=work / "data"))
    broker = subprocess.Popen(
        [sys.executable, "-m", "pymetaq.server.cli", "server", "-f", str(work / "server.ini")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert broker.stdout is not None
    for line in broker.stdout:
        match = re.search(r"listening on [^:]+:(\d+)", line)
        if match:
            port = int(match.group(1))
            break
    print(f"broker 127.0.0.1:{port}  dashboard http://127.0.0.1:{http}/", flush=True)
    try:
        if args.screenshot:
            url = f"http://127.0.0.1:{http}/groups"
            run(port, ("orders", 3), ("clicks", 2), args.shot_after, url, args.screenshot)
            print(f"saved {args.screenshot}", flush=True)
        else:
            run(port, ("orders", 3), ("clicks", 2), args.seconds)
    finally:
        broker.terminate()
        broker.wait(30)
    return 0


def run(
    port: int, read: tuple[str, int], other: tuple[str, int], seconds: float,
    url: str | None = None, shot: str | None = None,
) -> None:  # fmt: skip
    """Two producers (``read`` and ``other``), two groups reading ``read``, for ``seconds``
    (then a screenshot of ``url`` into ``shot`` if given)."""
    stop = threading.Event()
    workers = [
        threading.Thread(target=produce, args=(port, *read, stop)),
        threading.Thread(target=produce, args=(port, *other, stop)),
        threading.Thread(target=consume, args=(port, *read, "billing", 256 * 1024, 0.01, stop)),
        threading.Thread(target=consume, args=(port, *read, "analytics", 4096, 0.1, stop)),
    ]
    for w in workers:
        w.start()
    try:
        time.sleep(seconds)
        if url is not None and shot is not None:
            screenshot(url, shot)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for w in workers:
            w.join(10)


if __name__ == "__main__":
    sys.exit(main())
