"""``pymetaq top``: a live terminal view of one broker - rates per topic, lag per consumer group.

Every ``--interval`` seconds it asks the broker for ``stats``, ``stats topics`` and ``stats lag``
over one connection (any pymetaq broker; the HTTP port is not needed) and shows:

- the broker: id, address, uptime, connections; puts, gets and messages per second;
- topics: partitions, messages/s and bytes/s in (from ``message_count``/``message_bytes``
  deltas), messages stored;
- consumer groups per topic: partitions fetched, lag (bytes behind the durable end), lag time
  (age of the oldest message not fetched yet), and the lag's trend per second.

Keys: ``q`` quits, Ctrl-C too (the terminal is restored either way).  ``--once`` prints one
screen as plain text (two polls one interval apart, so rates are real) and exits - for scripts,
and when there is no terminal.  A broker that stops answering is shown as such and retried.

The screen is curses (standard library: no dependency, handles resizes and keys).

Thread-safety: a process entry point.
"""

from __future__ import annotations

import argparse
import curses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pymetaq.client.cli.common import add_servers_option, one_address
from pymetaq.client.cli.wire import Session
from pymetaq.client.protocol import StatsCommand

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
Line = tuple[str, int]  # text, curses attribute


@dataclass
class LagEntry:
    group: str
    topic: str
    partition: int
    lag_bytes: int
    lag_seconds: float | None


@dataclass
class Poll:
    when: float
    general: dict[str, str] = field(default_factory=dict)
    topics: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # parts, msgs, bytes
    lag: list[LagEntry] = field(default_factory=list)


def _body_lines(body: bytes) -> list[str]:
    lines = body.decode("utf-8", "replace").split("\r\n")
    return [line for line in lines if line and line not in ("STATS", "END")]


def parse_general(body: bytes) -> dict[str, str]:
    out = {}
    for line in _body_lines(body):
        key, _, value = line.partition(" ")
        out[key] = value
    return out


def parse_topics(body: bytes) -> dict[str, tuple[int, int, int]]:
    """``stats topics`` -> topic -> (partitions, message_count, message_bytes)."""
    out = {}
    for line in _body_lines(body):
        t = line.split(" ")
        if len(t) >= 7 and t[1] == "partitions":
            out[t[0]] = (int(t[2]), int(t[4]), int(t[6]))
    return out


def parse_lag(body: bytes) -> list[LagEntry]:
    """``stats lag`` lines (see docs/protocol.md)."""
    out = []
    for line in _body_lines(body):
        t = line.split(" ")
        if len(t) != 14 or t[2] != "part":
            continue
        lag_s = None if t[11] == "unknown" else float(t[11])
        out.append(LagEntry(t[0], t[1], int(t[3]), int(t[9]), lag_s))
    return out


def poll(session: Session) -> Poll:
    def body(item: str) -> bytes:
        reply = session.request(StatsCommand(item, 1))
        if reply.code != 200:
            raise ConnectionError(f"stats {item}: result {reply.code}")
        return reply.body

    general = parse_general(body(""))
    return Poll(time.monotonic(), general, parse_topics(body("topics")), parse_lag(body("lag")))


def human_bytes(n: float) -> str:
    for unit in UNITS:
        if abs(n) < 1024 or unit == UNITS[-1]:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return ""  # pragma: no cover


def human_seconds(s: float | None) -> str:
    if s is None:
        return "unknown"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def _per_s(prev: Poll | None, cur: Poll, get: Callable[[Poll], float]) -> float | None:
    if prev is None or cur.when <= prev.when:
        return None
    return max(0.0, (get(cur) - get(prev)) / (cur.when - prev.when))


def _rate(x: float | None, fmt: Callable[[float], str] = lambda v: f"{v:,.1f}") -> str:
    return "-" if x is None else fmt(x)


def _group_lag(p: Poll) -> dict[tuple[str, str], tuple[int, int, float | None]]:
    out: dict[tuple[str, str], tuple[int, int, float | None]] = {}
    for e in p.lag:
        parts, total, worst = out.get((e.group, e.topic), (0, 0, 0.0))
        if e.lag_seconds is None or worst is None:
            worst = None if e.lag_seconds is None else worst
        else:
            worst = max(worst, e.lag_seconds)
        out[(e.group, e.topic)] = (parts + 1, total + e.lag_bytes, worst)
    return out


def _topic_total(topic: str, index: int) -> Callable[[Poll], float]:
    def total(p: Poll) -> float:
        return float(p.topics.get(topic, (0, 0, 0))[index])

    return total


def screen(prev: Poll | None, cur: Poll, server: str, interval: float) -> list[Line]:
    """The lines to show (text, curses attribute)."""
    g = cur.general
    bold, head = curses.A_BOLD, curses.A_REVERSE

    def counter(name: str) -> Callable[[Poll], float]:
        return lambda p: float(p.general.get(name, 0) or 0)

    uptime = human_seconds(float(g.get("uptime", 0) or 0))
    lines: list[Line] = [
        (f"pymetaq top - broker {g.get('broker_id', '?')} at {server} - up {uptime} - "
         f"{g.get('curr_connections', '?')} connection(s) - {time.strftime('%H:%M:%S')}", bold),
        (f"puts/s {_rate(_per_s(prev, cur, counter('cmd_put')))}   "
         f"gets/s {_rate(_per_s(prev, cur, counter('cmd_get')))}   "
         f"messages/s {_rate(_per_s(prev, cur, counter('total_messages')))}   "
         f"put_failed {g.get('put_failed', '?')}   get_miss {g.get('get_miss', '?')}", 0),
        ("", 0),
        (f"{'TOPIC':<28} {'PARTS':>5} {'MSGS/S IN':>12} {'BYTES/S IN':>12} {'MESSAGES':>14}", head),
    ]  # fmt: skip
    for topic, (parts, count, _size) in sorted(cur.topics.items()):
        msgs = _per_s(prev, cur, _topic_total(topic, 1))
        nbytes = _per_s(prev, cur, _topic_total(topic, 2))
        lines.append(
            (f"{topic[:28]:<28} {parts:>5} {_rate(msgs):>12} {_rate(nbytes, human_bytes) + '/s':>12} "
             f"{count:>14,}", 0)
        )  # fmt: skip
    if not cur.topics:
        lines.append(("(no topic has data yet)", 0))
    lines += [
        ("", 0),
        (
            f"{'GROUP':<20} {'TOPIC':<20} {'PARTS':>5} {'LAG':>12} {'LAG TIME':>12} {'TREND':>16}",
            head,
        ),
    ]
    before = _group_lag(prev) if prev is not None else {}
    now = _group_lag(cur)
    for (group, topic), (parts, total, worst) in sorted(now.items(), key=lambda kv: -kv[1][1]):
        trend = "-"
        if (group, topic) in before and prev is not None and cur.when > prev.when:
            delta = (total - before[(group, topic)][1]) / (cur.when - prev.when)
            trend = (
                "="
                if abs(delta) < 1
                else ("up " if delta > 0 else "down ") + human_bytes(abs(delta)) + "/s"
            )
        attr = bold if total else 0
        lines.append(
            (f"{group[:20]:<20} {topic[:20]:<20} {parts:>5} {human_bytes(total):>12} "
             f"{human_seconds(worst):>12} {trend:>16}", attr)
        )  # fmt: skip
    if not now:
        lines.append(("(no consumer group has fetched yet)", 0))
    lines += [("", 0), (f"q quit - refresh {interval:g} s - lag = bytes behind the durable end", 0)]
    return lines


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("top", help="live view of a broker: rates per topic, lag per group")
    add_servers_option(p)
    p.add_argument("--interval", type=float, default=1.0, help="seconds (default %(default)s)")
    p.add_argument("--once", action="store_true", help="print one screen as text and exit")
    p.set_defaults(func=run)


class Poller:
    """Polls one broker, reconnecting after a failure."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.session: Session | None = None
        self.prev: Poll | None = None
        self.cur: Poll | None = None
        self.error = ""

    def step(self) -> None:
        try:
            if self.session is None:
                self.session = Session(self.host, self.port, self.timeout)
            self.prev, self.cur = self.cur, poll(self.session)
            self.error = ""
        except (OSError, ValueError) as exc:
            self.error = f"{self.host}:{self.port}: {getattr(exc, 'strerror', None) or exc}"
            if self.session is not None:
                self.session.close()
            self.session = None


def _draw(stdscr: Any, lines: list[Line]) -> None:
    height, width = stdscr.getmaxyx()
    stdscr.erase()
    for y, (text, attr) in enumerate(lines[: max(0, height - 1)]):
        stdscr.addnstr(y, 0, text, max(1, width - 1), attr)
    stdscr.refresh()


def _live(stdscr: Any, poller: Poller, server: str, interval: float) -> None:
    try:
        curses.curs_set(0)
    except curses.error:
        pass
    stdscr.timeout(100)
    due = 0.0
    while True:
        if time.monotonic() >= due:
            poller.step()
            due = time.monotonic() + interval
            if poller.cur is not None and not poller.error:
                _draw(stdscr, screen(poller.prev, poller.cur, server, interval))
            else:
                _draw(stdscr, [(f"broker not answering: {poller.error} (retrying; q quits)", 0)])
        key = stdscr.getch()
        if key in (ord("q"), ord("Q")):
            return
        if key == curses.KEY_RESIZE and poller.cur is not None:
            _draw(stdscr, screen(poller.prev, poller.cur, server, interval))


def run(args: argparse.Namespace) -> int:
    host, port = one_address(args, "top")
    server = f"{host}:{port}"
    if args.interval <= 0:
        print("pymetaq top: --interval must be positive", file=sys.stderr)
        return 2
    poller = Poller(host, port, max(2.0, args.interval))
    if args.once or not sys.stdout.isatty():
        poller.step()
        time.sleep(args.interval)  # a second poll one interval later: real rates
        poller.step()
        if poller.cur is None or poller.error:
            print(f"pymetaq top: {poller.error}", file=sys.stderr)
            return 1
        print("\n".join(text for text, _ in screen(poller.prev, poller.cur, server, args.interval)))
        return 0
    try:
        curses.wrapper(_live, poller, server, args.interval)
    except KeyboardInterrupt:
        pass
    return 0
