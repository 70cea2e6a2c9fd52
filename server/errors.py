"""The broker's exception tree (one base class; every error says whether a retry can help).

```
ServerError (retriable: bool)
├── ConfigError          server.ini is unreadable or invalid (never retriable)
├── StartupError         the broker cannot start: its data directory is locked by another
│                        broker, unwritable, or damaged beyond fencing; the port is taken
└── BrokerStateError     start()/stop() used out of order (never retriable)
```

Also :func:`describe_os_error`, the reply text of an I/O fault (running out of descriptors says
it is transient).

Thread-safe: plain exception classes and a pure function.
"""

from __future__ import annotations

import errno

#: errnos that mean "out of descriptors": transient, never a reason to fail a partition
FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
OUT_OF_FDS = "the broker is out of file descriptors ({}); retry later"


def describe_os_error(exc: BaseException) -> str:
    """A reply text for an I/O failure (the exception or its cause); out-of-descriptor errors
    say so and that a retry will help."""
    for e in (exc, exc.__cause__):
        if isinstance(e, OSError) and e.errno in FD_ERRNOS:
            return OUT_OF_FDS.format(e.strerror)
    return str(exc)


class ServerError(Exception):
    """Base class of every pymetaq.server error."""

    retriable: bool = False


class ConfigError(ServerError):
    """server.ini could not be loaded; the message names the file, line, section and key."""

    retriable = False


class StartupError(ServerError):
    """The broker could not start; the message says why and what to do (no traceback)."""

    retriable = False


class BrokerStateError(ServerError):
    """A Broker was started twice, or stopped before it started."""

    retriable = False
