"""Storage configuration values: the global :class:`StoreConfig` and per-topic
:class:`TopicStoreConfig`, plus the parser of MetaQ's ``deletePolicy`` strings.

``deletePolicy`` grammar (MetaQ's two forms, plus pymetaq's retention by consumer progress)::

    delete,<age>
    archive,<age>[,true|false]
    consumed,<groups>[,<min-age>]      groups: * | <group>[+<group>...]
    <age>, <min-age>: N | N.N, optionally followed by s, m or h (no unit: hours)

Several groups are joined with ``+`` (a character MetaQ forbids in group names, so
``consumed,a+b,2`` can mean only one thing).  Rejected as ambiguous: a third field that is not
an age (``consumed,a,b``: groups must be joined with ``+``), more than three fields, a group
field that reads as an age (``consumed,24``), ``*`` with other groups, ``|`` or an empty name
between the ``+``s, a group named twice.  Group names are checked again by the broker
(MetaQ's group-name rule).

Thread-safe: frozen dataclasses and pure functions.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TopicStoreConfig:
    """Per-topic settings (MetaQ's ``[topic=...]`` section, defaults from ``[system]``)."""

    num_partitions: int = 1
    unflush_threshold: int = 1000  # 0 => group commit (ack after the covering fsync)
    unflush_interval_ms: int = 10000
    delete_policy: str = "delete,168"
    delete_when: str = "0 0 6,18 * * ?"
    data_path: str | None = None  # per-topic override of StoreConfig.data_path
    #: ``consumed`` policies only: the age past which a closed segment goes even though a named
    #: group has not consumed it (``maxRetention``; 0 = never)
    max_retention_seconds: float = 168 * 3600.0

    @property
    def group_commit(self) -> bool:
        return self.unflush_threshold <= 0


@dataclass(frozen=True)
class StoreConfig:
    """Broker-wide storage settings (MetaQ's ``[system]`` section)."""

    data_path: str
    broker_id: int = 0
    max_segment_size: int = 1 << 30
    max_transfer_size: int = 1 << 20
    #: refuse appends while a data directory's filesystem has less free space (0 = no check;
    #: the broker's ``[system] minFreeDiskBytes``), see :mod:`pymetaq.storage.space`
    min_free_disk_bytes: int = 0
    #: how appended bytes reach the page cache: ``pwrite`` or ``mmap`` (the broker's
    #: ``[system] segmentWrites``), see :mod:`pymetaq.storage.disk`
    segment_writes: str = "pwrite"


#: the values of ``StoreConfig.segment_writes`` (``[system] segmentWrites``)
WRITE_MODES = ("pwrite", "mmap")


class RetentionKind(enum.Enum):
    DELETE = "delete"
    ARCHIVE = "archive"
    CONSUMED = "consumed"  # delete once every named group has passed the segment


@dataclass(frozen=True)
class DeletePolicy:
    """A parsed ``deletePolicy``: ``delete,N``, ``archive,N[,true]`` or
    ``consumed,<groups>[,min-age]``.

    ``N`` is hours, or carries a unit suffix ``s``/``m``/``h`` (MetaQ: ``delete,10m``).  For
    ``consumed``, ``keep_seconds`` is the minimum age (default 0) and ``groups`` the named
    groups (``None`` = ``*``: every group with committed offsets for the topic).
    """

    kind: RetentionKind
    keep_seconds: float
    compress: bool = False
    groups: tuple[str, ...] | None = None


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smh]?)")
_POLICY_FORMS = "delete,N, archive,N[,true] or consumed,<group>[+<group>...]|*[,min-age]"


def parse_duration(text: str) -> float:
    """``N`` / ``N.N`` hours, or with a unit ``s``/``m``/``h`` -> seconds; ValueError if not."""
    m = _DURATION.fullmatch(text.strip().lower())
    if m is None:
        raise ValueError(f"{text!r} is not an age: N[s|m|h] (no unit: hours)")
    return float(m.group(1)) * _UNITS[m.group(2) or "h"]


def parse_delete_policy(text: str) -> DeletePolicy:
    """Parse ``delete,168`` / ``delete,10m`` / ``archive,24,true`` /
    ``consumed,a+b,0.5``; ValueError (saying what is wrong) if malformed or ambiguous."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 2 or parts[0].lower() not in ("delete", "archive", "consumed"):
        raise ValueError(f"bad deletePolicy {text!r}: expected {_POLICY_FORMS}")
    kind = RetentionKind(parts[0].lower())
    if kind is RetentionKind.CONSUMED:
        return _parse_consumed(text, parts)
    amount = parts[1].lower()
    unit = 3600.0
    if amount and amount[-1] in _UNITS:
        unit = _UNITS[amount[-1]]
        amount = amount[:-1]
    try:
        keep = float(int(amount)) * unit
    except ValueError:
        raise ValueError(f"bad deletePolicy {text!r}: {parts[1]!r} is not N[s|m|h]") from None
    if keep < 0:
        raise ValueError(f"bad deletePolicy {text!r}: negative retention")
    compress = False
    if len(parts) > 2:
        if kind is not RetentionKind.ARCHIVE or len(parts) > 3:
            raise ValueError(f"bad deletePolicy {text!r}: extra fields")
        compress = parts[2].lower() == "true"
    return DeletePolicy(kind, keep, compress)


def _parse_consumed(text: str, parts: list[str]) -> DeletePolicy:
    bad = f"bad deletePolicy {text!r}"
    if len(parts) > 3:
        raise ValueError(
            f"{bad}: too many fields; join several groups with '+' "
            "(consumed,<group>+<group>[,min-age])"
        )
    min_age = 0.0
    if len(parts) == 3:
        try:
            min_age = parse_duration(parts[2])
        except ValueError:
            raise ValueError(
                f"{bad}: the third field {parts[2]!r} is not a minimum age N[s|m|h]; "
                f"several groups are joined with '+' (consumed,{parts[1]}+{parts[2]})"
            ) from None
    return DeletePolicy(RetentionKind.CONSUMED, min_age, groups=_parse_groups(bad, parts[1]))


def _parse_groups(bad: str, field: str) -> tuple[str, ...] | None:
    if field == "*":
        return None
    if "|" in field:
        raise ValueError(f"{bad}: join several groups with '+', not '|'")
    names = [g.strip() for g in field.split("+")]
    if "*" in names:
        raise ValueError(f"{bad}: '*' (every group) cannot be combined with named groups")
    if any(not g for g in names):
        raise ValueError(f"{bad}: an empty group name in {field!r} (expected '*' or a+b+...)")
    if len(set(names)) != len(names):
        raise ValueError(f"{bad}: a group is named twice in {field!r}")
    if len(names) == 1 and _DURATION.fullmatch(names[0].lower()):
        raise ValueError(
            f"{bad}: {names[0]!r} reads as an age, not a group; name the groups first: "
            f"consumed,<group>[+<group>...]|*[,min-age]"
        )
    return tuple(names)
