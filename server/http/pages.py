"""The dashboard's HTML pages, rendered on the server from :mod:`pymetaq.server.monitor.views`.

MetaQ's dashboard pages brought up to date: overview (MetaQ's ``/`` and ``/cluster``), topics
and one topic (``/topics``, ``/topics/:topic``), consumer groups with live lag (new: MetaQ's
broker did not know its consumers' lag), config with the reload button (``/config``, POST
``/reload-config``), stats (``/stats/:item``) and thread stacks (``/threads``, MetaQ's
``/thread-dump``).  Every value is escaped; every number a test or a script may read is in a
``data-value`` attribute beside its formatted text.  ``/static/dashboard.js`` polls the JSON
endpoints and keeps the numbers and the lag chart moving; the pages work without it.

Thread-safety: pure functions of their arguments.
"""

from __future__ import annotations

import html
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

NAV = (
    ("/", "Overview"),
    ("/topics", "Topics"),
    ("/groups", "Consumer groups"),
    ("/config", "Config"),
    ("/stats", "Stats"),
    ("/threads", "Threads"),
    ("/metrics", "Metrics"),
)
UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def human_bytes(n: float) -> str:
    n = float(n)
    for unit in UNITS:
        if abs(n) < 1024 or unit == UNITS[-1]:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} {UNITS[-1]}"  # pragma: no cover


def human_seconds(s: float | None) -> str:
    if s is None:
        return "unknown"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def num(value: float, text: str | None = None, cls: str = "") -> str:
    """A numeric cell: the raw value in ``data-value``, the formatted one shown."""
    shown = text if text is not None else f"{value:,}"
    klass = f' class="num {cls}"' if cls else ' class="num"'
    return f'<td{klass} data-value="{esc(value)}">{esc(shown)}</td>'


def rate(value: float, unit: str = "/s") -> str:
    return num(round(value, 3), f"{value:,.1f}{unit}")


def table(head: Sequence[str], rows: Iterable[str], cls: str = "", empty: str = "none") -> str:
    body = "".join(rows)
    if not body:
        body = f'<tr class="empty"><td colspan="{len(head)}">{esc(empty)}</td></tr>'
    cols = "".join(f"<th>{esc(h)}</th>" for h in head)
    thead = f"<thead><tr>{cols}</tr></thead>" if any(head) else ""
    return f'<table class="{esc(cls)}">{thead}<tbody>{body}</tbody></table>'


def page(title: str, path: str, body: str, overview: dict[str, Any], *, live: str = "") -> bytes:
    links = "".join(
        f'<a href="{href}"{" class=active" if href == path else ""}>{esc(name)}</a>'
        for href, name in NAV
    )
    data = f' data-live="{esc(live)}"' if live else ""
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · pymetaq broker {esc(overview["broker_id"])}</title>
<link rel="stylesheet" href="/static/dashboard.css">
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
</head><body{data}>
<header class="top"><a class="brand" href="/"><span class="logo">◆</span> pymetaq</a>
<nav>{links}</nav>
<span class="who">broker {esc(overview["broker_id"])} · {esc(overview["address"])} ·
up <span id="uptime">{esc(human_seconds(overview["uptime_s"]))}</span></span></header>
<main><h1>{esc(title)}</h1>
{body}</main>
<footer>{esc(overview["version"])} · <span id="updated">rendered {time.strftime("%H:%M:%S")}</span></footer>
<script src="/static/dashboard.js"></script>
</body></html>"""
    return doc.encode("utf-8")


def _tile(label: str, value: float, text: str, key: str) -> str:
    return (
        f'<div class="tile"><div class="label">{esc(label)}</div>'
        f'<div class="value" data-key="{esc(key)}" data-value="{esc(value)}">{esc(text)}</div></div>'
    )


def overview_page(ov: dict[str, Any]) -> bytes:
    c = ov["counters"]
    tiles = "".join(
        (
            _tile("Messages in/s", round(ov["rates"]["messages"], 3), f"{ov['rates']['messages']:,.1f}", "rates.messages"),
            _tile("Puts/s", round(ov["rates"]["put"], 3), f"{ov['rates']['put']:,.1f}", "rates.put"),
            _tile("Gets/s", round(ov["rates"]["get"], 3), f"{ov['rates']['get']:,.1f}", "rates.get"),
            _tile("Connections", ov["connections"], f"{ov['connections']:,} / {ov['max_connections']:,}", "connections"),
            _tile("Long-poll waiters", ov["longpoll_waiters"], f"{ov['longpoll_waiters']:,}", "longpoll_waiters"),
            _tile("Topics / partitions", ov["partitions"], f"{ov['topics']} / {ov['partitions']}", "partitions"),
        )
    )  # fmt: skip
    counters = table(
        ("counter", "value"),
        (f"<tr><td>{esc(k)}</td>{num(v)}</tr>" for k, v in c.items()),
        "counters",
    )
    disks = table(
        ("data directory", "free", "size", "used"),
        (
            f"<tr><td>{esc(d['path'])}</td>{num(d['free'], human_bytes(d['free']))}"
            f"{num(d['size'], human_bytes(d['size']))}"
            f"{num(d['size'] - d['free'], _pct(d['size'] - d['free'], d['size']))}</tr>"
            for d in ov["disks"]
        ),
        "disks",
    )
    zk = ov["zookeeper"]
    cluster = (
        f"ZooKeeper <code>{esc(zk['connect'])}</code>; registered: "
        + esc(", ".join(zk["registered"]) or "nothing yet")
        if zk["enabled"]
        else "standalone (ZooKeeper off: <code>zk.zkEnable=false</code>)"
    )
    facts = table(
        ("", ""),
        (
            f"<tr><td>{esc(k)}</td><td>{v}</td></tr>"
            for k, v in (
                ("broker id", esc(ov["broker_id"])),
                ("address", esc(ov["address"])),
                ("version", esc(ov["version"])),
                ("pid", esc(ov["pid"])),
                ("threads", esc(ov["threads"])),
                ("cluster", cluster),
                ("slaves", esc(ov["slaves"])),
                ("closed partitions", esc(ov["closed_partitions"])),
                ("fenced partitions", esc(ov["fenced_partitions"])),
                ("consumer positions tracked", esc(ov["lag_entries"])),
                ("config", f"<code>{esc(ov['config_path'])}</code> (checksum {esc(ov['config_checksum'])})"),
            )
        ),
        "facts",
    )  # fmt: skip
    body = (
        f'<section class="tiles">{tiles}</section>'
        f'<div class="cols"><section><h2>Broker</h2>{facts}<h2>Disks</h2>{disks}</section>'
        f"<section><h2>Counters</h2>{counters}</section></div>"
    )
    return page("Overview", "/", body, ov, live="overview")


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def topics_page(ov: dict[str, Any], topics: list[dict[str, Any]]) -> bytes:
    rows = []
    for t in topics:
        flags = " ".join(
            f'<span class="badge {cls}">{esc(name)}</span>'
            for name, cls, on in (
                ("no publish", "warn", not t["accept_publish"]),
                ("no subscribe", "warn", not t["accept_subscribe"]),
                ("stat", "info", t["stat"]),
                ("closed partitions", "bad", any(p["closed"] for p in t["partitions"])),
            )
            if on
        )
        stored = len(t["partitions"])
        counts = num(stored, f"{stored} / {t['num_partitions']}")
        rows.append(
            f'<tr data-topic="{esc(t["topic"])}"><td><a href="/topics/{esc(q(t["topic"]))}">'
            f"{esc(t['topic'])}</a> {flags}</td>{counts}"
            f"{num(t['messages'])}{num(t['size'], human_bytes(t['size']))}"
            f"{rate(t['msgs_per_s'])}{rate(t['in_bytes_per_s'] / 1024, ' KiB/s')}"
            f"{rate(t['out_bytes_per_s'] / 1024, ' KiB/s')}</tr>"
        )
    head = (
        "topic",
        "partitions (stored / configured)",
        "messages in",
        "size",
        "msgs/s in",
        "in",
        "out",
    )
    body = table(head, rows, "topics", "no topics") + _note_counts()
    return page("Topics", "/topics", body, ov, live="topics")


def _note_counts() -> str:
    return (
        '<p class="note">Messages and bytes in count since the broker opened each partition; '
        "rates are 10-second averages. Out is what gets sent (a get reply is a slice of the log; "
        "the broker does not count the messages in it).</p>"
    )


def topic_page(ov: dict[str, Any], t: dict[str, Any], groups: list[dict[str, Any]]) -> bytes:
    rows = (
        f'<tr data-partition="{p["partition"]}"><td>{p["partition"]}'
        + (' <span class="badge bad">closed</span>' if p["closed"] else "")
        + f"</td>{num(p['min_offset'])}{num(p['max_offset'])}{num(p['messages'])}"
        f"{num(p['max_offset'] - p['min_offset'], human_bytes(p['max_offset'] - p['min_offset']))}"
        f"{rate(p['msgs_per_s'])}{rate(p['in_bytes_per_s'] / 1024, ' KiB/s')}"
        f"{rate(p['out_bytes_per_s'] / 1024, ' KiB/s')}</tr>"
        for p in t["partitions"]
    )
    head = (
        "partition",
        "start offset",
        "end offset",
        "messages in",
        "size",
        "msgs/s in",
        "in",
        "out",
    )
    readers = sorted(
        {g["group"] for g in groups for p in g["partitions"] if p["topic"] == t["topic"]}
    )
    settings = (
        f"section <code>[topic={esc(t['section'])}]</code> · {t['num_partitions']} partition(s) · "
        f"acceptPublish={str(t['accept_publish']).lower()} · "
        f"acceptSubscribe={str(t['accept_subscribe']).lower()} · stat={str(t['stat']).lower()}"
    )
    group_links = ", ".join(f'<a href="/groups#g-{esc(q(g))}">{esc(g)}</a>' for g in readers)
    body = (
        f'<p class="sub">{settings}</p>{table(head, rows, "partitions", "no partition stored yet")}'
        f"<h2>Consumer groups</h2><p>{group_links or 'no group has fetched from this topic'}</p>"
    )
    return page(f"Topic {t['topic']}", "/topics", body, ov, live="topics")


def group_rows(g: dict[str, Any]) -> Iterable[str]:
    for p in g["partitions"]:
        key = f"{p['topic']}/{p['partition']}"
        yield (
            f'<tr data-key="{esc(key)}"><td>{esc(p["topic"])}</td><td>{p["partition"]}</td>'
            f"{num(p['fetch_offset'], cls='fetch_offset')}{num(p['max_offset'], cls='max_offset')}"
            f"{num(p['lag_bytes'], human_bytes(p['lag_bytes']), 'lag_bytes')}"
            f"{num(p['lag_seconds'] if p['lag_seconds'] is not None else -1, human_seconds(p['lag_seconds']), 'lag_seconds')}"
            f"{num(round(p['idle_seconds'], 3), human_seconds(p['idle_seconds']) + ' ago', 'idle_seconds')}</tr>"
        )  # fmt: skip


def groups_page(ov: dict[str, Any], groups: list[dict[str, Any]]) -> bytes:
    head = ("topic", "partition", "fetch offset", "end offset", "lag", "lag (time)", "last fetch")
    cards = []
    for g in groups:
        cards.append(
            f'<section class="group" id="g-{esc(q(g["group"]))}" data-group="{esc(g["group"])}">'
            f'<h2>{esc(g["group"])} <span class="total">lag '
            f'<b class="group-lag" data-value="{g["lag_bytes"]}">{esc(human_bytes(g["lag_bytes"]))}</b>'
            f' · <b class="group-lag-s">{esc(human_seconds(g["lag_seconds"]))}</b></span></h2>'
            f'<canvas class="lagchart" width="900" height="180"></canvas>'
            f"{table(head, group_rows(g), 'lag')}</section>"
        )
    if not cards:
        cards.append('<p class="empty">No consumer group has fetched from this broker yet.</p>')
    body = (
        '<p class="sub">Fetch lag as the broker sees it: how far each group\'s latest get is '
        "behind the durable end of the partition (bytes), and how old the first message it has "
        "not fetched is (time). Updated every second.</p>" + "".join(cards)
    )
    return page("Consumer groups", "/groups", body, ov, live="groups")


def config_page(ov: dict[str, Any], text: str, token: str, last: str) -> bytes:
    result = f'<p class="flash">{esc(last)}</p>' if last else ""
    body = (
        f'{result}<form method="post" action="/reload-config" class="reload">'
        f'<input type="hidden" name="token" value="{esc(token)}">'
        '<button type="submit" id="reload">Reload config</button> '
        "<span>re-reads the file's <code>[topic=...]</code> sections, as SIGHUP; "
        "<code>[system]</code> changes need a restart. Allowed from this host only.</span></form>"
        f'<h2><code>{esc(ov["config_path"])}</code></h2><pre class="config">{esc(text)}</pre>'
    )
    return page("Config", "/config", body, ov)


def text_page(ov: dict[str, Any], title: str, path: str, text: str, links: str = "") -> bytes:
    return page(title, path, f'{links}<pre class="text">{esc(text)}</pre>', ov)
