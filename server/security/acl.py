"""Identities and their rights: who may publish to, subscribe to, or administer what.

A right is a comma-separated list of names and patterns: ``orders``, ``logs.*`` (``*`` is any
run of characters), ``*`` (everything); empty = nothing.  ``groups`` limits the consumer groups
an identity may fetch and commit as (default ``*``).  The exact denial texts (the body of
``result 403``) are built here, once:

- ``identity 'alice' may not publish to topic 'orders'``
- ``identity 'alice' may not subscribe to topic 'orders'``
- ``identity 'alice' may not use group 'billing'``
- ``identity 'alice' may not run admin commands``

The anonymous identity (no client certificate, no ``auth``) is written ``anonymous`` and its
denials end with ``; authenticate first`` so a plain client's user knows what to do.

Thread-safe: immutable values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ANONYMOUS = "anonymous"


def _compile(spec: str) -> re.Pattern[str] | None:
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        return None
    alts = "|".join(re.escape(i).replace(r"\*", ".*") for i in items)
    return re.compile(f"(?:{alts})\\Z")


def check_spec(spec: str) -> str | None:
    """A reason ``spec`` is not a valid rights list, or None."""
    for item in (s.strip() for s in spec.split(",")):
        if item and not re.fullmatch(r"[A-Za-z0-9._*-]+", item):
            return f"{item!r} is not a topic or group name or pattern ([A-Za-z0-9._-] and *)"
    return None


@dataclass(frozen=True)
class Rights:
    """What one identity may do (the values of a ``[user=NAME]`` or ``[anonymous]`` section)."""

    publish: str = ""
    subscribe: str = ""
    groups: str = "*"
    admin: bool = False
    _pub: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _sub: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _grp: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pub", _compile(self.publish))
        object.__setattr__(self, "_sub", _compile(self.subscribe))
        object.__setattr__(self, "_grp", _compile(self.groups))

    def may_publish(self, topic: str) -> bool:
        return self._pub is not None and self._pub.match(topic) is not None

    def may_subscribe(self, topic: str) -> bool:
        return self._sub is not None and self._sub.match(topic) is not None

    def may_use_group(self, group: str) -> bool:
        return self._grp is not None and self._grp.match(group) is not None

    @property
    def publishes(self) -> bool:
        return self._pub is not None


NO_RIGHTS = Rights()


@dataclass(frozen=True)
class Identity:
    """Who a connection is: a name, how it was established, and its rights."""

    name: str
    rights: Rights
    via: str = "anonymous"  # "anonymous" | "certificate" | "password"

    @property
    def anonymous(self) -> bool:
        return self.via == "anonymous"

    def _deny(self, what: str) -> bytes:
        tail = "; authenticate first" if self.anonymous else ""
        return f"identity '{self.name}' may not {what}{tail}".encode()

    def publish_denied(self, topic: str) -> bytes | None:
        if self.rights.may_publish(topic):
            return None
        return self._deny(f"publish to topic '{topic}'")

    def subscribe_denied(self, topic: str, group: str) -> bytes | None:
        if not self.rights.may_subscribe(topic):
            return self._deny(f"subscribe to topic '{topic}'")
        if not self.rights.may_use_group(group):
            return self._deny(f"use group '{group}'")
        return None

    def admin_denied(self) -> bytes | None:
        return None if self.rights.admin else self._deny("run admin commands")

    def transaction_denied(self) -> bytes | None:
        return None if self.rights.publishes else self._deny("run transactions")
