"""Errors of the cluster components (every one a :class:`~pymetaq.client.errors.MetaClientError`).

```
MetaClientError
└── ClusterError (retriable: bool)
    ├── ClusterUnavailable   ZooKeeper cannot be reached, or kazoo is not installed
    └── MembershipConflict   another live session already holds our consumer id (never retriable)
```

Thread-safety: plain exception classes.
"""

from __future__ import annotations

from pymetaq.client.errors import MetaClientError


class ClusterError(MetaClientError):
    """Base class of the cluster errors."""

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class ClusterUnavailable(ClusterError):
    """ZooKeeper did not answer in time (retriable), or the ``zk`` extra is missing."""

    retriable = True


class MembershipConflict(ClusterError):
    """A consumer id is registered in the group by another live ZooKeeper session."""

    retriable = False
