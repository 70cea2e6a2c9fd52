"""The dispatcher's memory of topic sections (``Dispatcher._topic_config``): a put's section is
found once per name and config, hostile names are never remembered, and a client naming
endless new topics that match a ``*`` pattern cannot grow the memory past its bound."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pymetaq.server import dispatch
from pymetaq.server.config import parse_config
from pymetaq.server.dispatch import TOPIC_CACHE_MAX, Dispatcher

INI = (
    "[system]\nserverPort=0\ndataPath=/tmp/unused\n[zookeeper]\nzk.zkEnable=false\n"
    "[topic=orders]\n[topic=logs-*]\n"
)


def _dispatcher(ini: str = INI) -> Any:
    """Only what ``_topic_config`` reads: the broker's current config and the memory."""
    return SimpleNamespace(
        broker=SimpleNamespace(config=parse_config(ini)), _topics={}, _topics_of=None
    )


def _lookup(d: Any, topic: str) -> Any:
    return Dispatcher._topic_config(d, topic)


def test_hostile_and_unknown_names_are_refused_and_never_remembered() -> None:
    d = _dispatcher()
    for name in ("../etc", "a/b", ".", "..", "x" * 201, "", "orders\x00", "nosuch"):
        assert _lookup(d, name) is None, name
    assert d._topics == {}
    assert _lookup(d, "orders").name == "orders"
    assert _lookup(d, "logs-a").name == "logs-*"
    assert set(d._topics) == {"orders", "logs-a"}


def test_the_memory_is_bounded_and_follows_the_config(monkeypatch: Any) -> None:
    d = _dispatcher()
    for i in range(3 * TOPIC_CACHE_MAX):
        assert _lookup(d, f"logs-{i}") is not None
        assert len(d._topics) <= TOPIC_CACHE_MAX
    # a reloaded config is a new object: the old sections are forgotten at the next lookup
    d.broker.config = parse_config(INI.replace("[topic=logs-*]\n", ""))
    assert _lookup(d, "logs-1") is None
    assert d._topics == {}
    # at the bound it starts over (a bound of 2 shows it)
    d.broker.config = parse_config(INI)
    monkeypatch.setattr(dispatch, "TOPIC_CACHE_MAX", 2)
    for name in ("logs-a", "logs-b", "logs-c"):
        assert _lookup(d, name) is not None
    assert list(d._topics) == ["logs-c"]
