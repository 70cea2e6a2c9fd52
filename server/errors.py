"""The broker's exception tree (one base class; every error says whether a retry can help).

```
ServerError (retriable: bool)
├── ConfigError          server.ini is unreadable or invalid (never retriable)
├── StartupError         the broker cannot start: its data directory is locked by another
│                        broker, unwritable, or damaged beyond fencing; the port is taken
└── BrokerStateError     start()/stop() used out of order (never retriable)
```

Thread-safe: plain exception classes.
"""

from __future__ import annotations


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
