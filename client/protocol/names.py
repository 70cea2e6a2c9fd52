"""Topic names: the one validator shared by the broker, its configuration and the clients.

A topic name becomes a directory name (``<dataPath>/<topic>-<partition>``), a ZooKeeper path
segment (``/meta/brokers/topics/<topic>``) and a token on the wire, so it is restricted to:

- the safe alphabet ``[A-Za-z0-9._-]`` (the characters MetaQ's and Kafka's tools accept);
- not ``.`` or ``..`` alone (they are directories already);
- at most :data:`MAX_TOPIC_LENGTH` = 200 characters, so that ``<topic>-<partition>`` (and
  suffixes such as repair's ``.damaged-<n>``) stays well below the 255-byte file-name limit
  of common filesystems.  Kafka's limit is 249 for the same reason.

A ``[topic=...]`` section of ``server.ini`` may be a pattern in which ``*`` stands for any run
of safe characters (MetaQ's ``.*``, restricted: it can never match ``/``, a space, or the names
``.``/``..``); :func:`topic_pattern` compiles one.

Pure functions, stdlib only (this is part of the leaf codec package); thread-safe.
"""

from __future__ import annotations

import re

MAX_TOPIC_LENGTH = 200
SAFE_CHARS = "A-Za-z0-9._-"
_SAFE = re.compile(f"[{SAFE_CHARS}]+")
_PATTERN_SAFE = re.compile(rf"[*{SAFE_CHARS}]+")


class InvalidTopicName(ValueError):
    """A topic name (or pattern) outside the safe alphabet, ``.``/``..``, or too long."""


def topic_name_error(name: str) -> str | None:
    """Why ``name`` is not a valid topic name (a message for the client), or None."""
    if len(name) > MAX_TOPIC_LENGTH:
        return f"invalid topic name: {len(name)} characters, at most {MAX_TOPIC_LENGTH}"
    if _SAFE.fullmatch(name) is None or name in (".", ".."):
        return _explain(name, _SAFE)
    return None


def validate_topic(name: str) -> str:
    """``name`` itself, or :class:`InvalidTopicName` saying why it is not a valid topic."""
    reason = topic_name_error(name)
    if reason is not None:
        raise InvalidTopicName(reason)
    return name


def topic_pattern(pattern: str) -> re.Pattern[str]:
    """The regex of a ``[topic=...]`` name, where ``*`` is any run of safe characters;
    :class:`InvalidTopicName` for a name with other characters or over the length limit.

    The regex matches only valid topic names (it also refuses ``.``, ``..`` and names over the
    limit), so a pattern can never route a hostile name to a directory."""
    if len(pattern) > MAX_TOPIC_LENGTH:
        raise InvalidTopicName(
            f"invalid topic name: {len(pattern)} characters, at most {MAX_TOPIC_LENGTH}"
        )
    if _PATTERN_SAFE.fullmatch(pattern) is None or pattern in (".", ".."):
        raise InvalidTopicName(_explain(pattern, _PATTERN_SAFE, "*"))
    body = f"[{SAFE_CHARS}]*".join(re.escape(part) for part in pattern.split("*"))
    return re.compile(rf"(?!\.\.?\Z)(?=.{{1,{MAX_TOPIC_LENGTH}}}\Z){body}", re.ASCII)


def _explain(name: str, allowed: re.Pattern[str], extra: str = "") -> str:
    shown = name if len(name) <= 60 else name[:57] + "..."
    if not name:
        return "invalid topic name: empty"
    if name in (".", ".."):
        return f"invalid topic name {shown!r}: '.' and '..' are not names"
    bad = next(c for c in name if allowed.fullmatch(c) is None)
    return (
        f"invalid topic name {shown!r}: {bad!r} is not allowed "
        f"(letters, digits, '.', '_' and '-' only{extra and ', and * in a pattern'})"
    )


__all__ = [
    "MAX_TOPIC_LENGTH",
    "SAFE_CHARS",
    "InvalidTopicName",
    "topic_name_error",
    "topic_pattern",
    "validate_topic",
]
