"""The wire codec's exceptions: "the peer sent garbage" versus "the caller misused the API".

```
CodecError                      base; ``retriable`` is False for every codec error
├── ProtocolError               the peer's bytes are invalid (raised by ``Parser.next_event``)
└── LocalProtocolError          we were asked to encode an invalid object (also a ValueError)
    └── InvalidTxKey            a transaction key string that is not ``TX:…``/``XID:…``/``null``
```

A :class:`ProtocolError` is either *non-fatal* (the bad line, and its body when the length token
was readable, has been consumed: the connection stays in sync and the server answers
``result 400 <len> <opaque>\\r\\n<reason>``) or *fatal* (framing is lost: the connection must be
closed).  Thread-safety: immutable values.
"""

from __future__ import annotations


class CodecError(Exception):
    """Base class of every wire-codec error."""

    retriable: bool = False


class ProtocolError(CodecError):
    """The peer sent bytes that are not a valid MetaQ frame.

    ``fatal``: framing is lost and the connection must be closed.  ``opaque``: the frame's last
    token when it parses as a 32-bit integer (so the reply can be matched), else ``None``.
    """

    def __init__(self, reason: str, fatal: bool, opaque: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal
        self.opaque = opaque

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, bool, int | None]]:
        return (type(self), (self.reason, self.fatal, self.opaque))

    def __repr__(self) -> str:
        return f"ProtocolError({self.reason!r}, fatal={self.fatal}, opaque={self.opaque})"


class LocalProtocolError(CodecError, ValueError):
    """The caller asked to encode something the protocol cannot carry (a bug on our side)."""


class InvalidTxKey(LocalProtocolError):
    """A transaction key that is not ``null``, ``TX:<session>:<n>`` or an ``XID:`` key."""
