"""The consumer's configuration, its values (``TopicPartition``) and its errors.

``ConsumerConfig`` is a frozen dataclass: every knob of :class:`pymetaq.client.consumer.Consumer`
in one typed value (MetaQ's ``ConsumerConfig`` defaults where MetaQ has one).

Initial position (when a group has no committed offset for a partition), after the Meteor
"initial offset scheme" (``/work/shared/seeds/000_*``):

| scheme     | grouped consumer (offsets kept)    | ungrouped consumer (``group=None``)  |
|------------|------------------------------------|--------------------------------------|
| `earliest` | start at the first available byte  | same                                 |
| `latest`   | start at the end (new messages)    | same                                 |
| `none`     | raise :class:`NoCommittedOffset`   | illegal: ``ValueError`` at creation  |
| `auto`     | acts as `earliest` (MQ style)      | acts as `latest` (pub-sub style)     |

A committed offset always wins over the scheme. Broadcast consumers are grouped (each instance
keeps its own offsets under ``<group>-<instance_id>``), so `auto` means `earliest` for them.

Errors: :class:`~pymetaq.client.errors.NoCommittedOffset`, ``NotAssigned`` (the tree is in
:mod:`pymetaq.client.errors`).

Thread-safety: immutable values and pure functions.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import re
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pymetaq.client.errors import InvalidConfig, InvalidGroupName, unknown_options
from pymetaq.client.protocol import zk

#: the group token sent in ``get``/``offset`` by an ungrouped consumer (never committed).
UNGROUPED_GROUP = "pymetaq-ungrouped"


class InitialPosition(enum.Enum):
    """Where a partition starts when the group has no committed offset (see module doc)."""

    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"
    AUTO = "auto"


@dataclass(frozen=True)
class ConsumerConfig:
    """Every consumer knob. Units are in the names: ``*_ms`` milliseconds, ``*_s`` seconds."""

    #: initial bytes asked per ``get`` (MetaQ's subscribe maxSize); the broker caps a reply at
    #: its ``maxTransferSize`` (1 MiB by default).
    fetch_max_size: int = 1 << 20
    #: a record bigger than the current max size doubles it, up to this cap (MetaQ: 2 MiB).
    fetch_max_size_cap: int = 2 << 20
    #: empty fetch / error backoff: delay += max/10 per empty round, up to this (MetaQ 5000).
    max_delay_fetch_ms: int = 5000
    #: long-poll ``get`` wait (pymetaq extension, 8-token get); 0 = classic 7-token get.
    long_poll_ms: int = 1000
    #: timeout of one request to a broker (long-poll wait excluded).
    request_timeout_ms: int = 10000
    connect_timeout_ms: int = 3000
    #: a failing listener is retried this many times (1 + max_fetch_retries attempts in all),
    #: then the message goes to the reject policy (MetaQ default 5).
    max_fetch_retries: int = 5
    #: commit changed offsets every this many seconds (MetaQ 5 s), and on close.
    commit_interval_s: float = 5.0
    #: False: the consumer never writes offsets itself (the application commits, e.g. with
    #: ``SqlOffsetStore.commit_in`` inside its own transaction).
    enable_auto_commit: bool = True
    initial_position: InitialPosition = InitialPosition.AUTO
    #: every instance gets every message; offsets kept under ``<group>-<instance_id>``.
    broadcast: bool = False
    #: broadcast instance id; default :func:`default_instance_id` (stable per host + cwd).
    instance_id: str | None = None
    #: recover spool root (default ``~/.pymetaq_recover``); ``<dir>/<topic>@<group>/``.
    recover_dir: str | None = None
    #: seconds between redeliveries of spooled messages (MetaQ 5 min).
    recover_interval_s: float = 300.0
    #: listener threads (sync Consumer); 0 = min(number of partitions, CPUs, 8), at least 1.
    fetch_runner_count: int = 0
    #: upper bound of messages one ``poll()`` returns; 0 = everything buffered.
    max_poll_records: int = 0
    #: verify every record's CRC32 (MetaQ always does).
    verify_crc: bool = True
    #: turns each message's value (``bytes``) into what ``Message.value`` holds (e.g.
    #: ``bytes.decode`` or ``json.loads``); None: values stay bytes
    value_deserializer: Callable[[bytes], Any] | None = None
    #: the same for ``Message.key`` (messages without a key keep ``None``)
    key_deserializer: Callable[[bytes], Any] | None = None
    # -- ZooKeeper groups (``servers="zk://..."`` with a group) --------------------------------
    #: how the group divides partitions: ``"DEFAULT"`` (MetaQ's range split), ``"CONSIST"``
    #: (MetaQ's consistent hashing) or ``"STICKY"`` (pymetaq only: moves as few as possible).
    strategy: str = "DEFAULT"
    #: MetaQ's consumerId: the member registers as ``<group>_<consumer_id>``; default
    #: ``<ip>-<pid>-<random>`` (unique per process).
    consumer_id: str | None = None
    #: the ZooKeeper session timeout asked for (MetaQ's zkSessionTimeoutMs): a crashed member's
    #: partitions move after this long.
    zk_session_timeout_ms: int = 30000
    #: ``zk://`` only: fetch from a broker's asynchronous slave (``<id>-s<n>`` in
    #: ``topics-sub``, the lowest ``n``) when one is registered, else from its master.  Default
    #: False: MetaQ's rule, the master while it is registered, a slave only when it is not.  A
    #: slave may be behind its master (``stats replication``); offsets are the same on both.
    read_from_slaves: bool = False
    #: MetaQ's zkSyncTimeMs: how often a member retries claiming a partition whose previous
    #: owner has not released it yet, and the delay after a failed rebalance round.
    zk_sync_time_ms: int = 5000
    #: poll mode: how long a rebalance waits for the application to come back to ``poll()``
    #: (or ``commit()``/``close()``) with the last poll's messages of a partition it must give
    #: up; after that the partition is released anyway and those messages are delivered again.
    max_poll_interval_ms: int = 300000

    def __post_init__(self) -> None:
        if isinstance(self.initial_position, str):
            object.__setattr__(self, "initial_position", InitialPosition(self.initial_position))
        if self.fetch_max_size < 64 or self.fetch_max_size_cap < self.fetch_max_size:
            raise InvalidConfig("need 64 <= fetch_max_size <= fetch_max_size_cap")
        if self.max_fetch_retries < 0 or self.max_delay_fetch_ms < 0 or self.long_poll_ms < 0:
            raise InvalidConfig("max_fetch_retries, max_delay_fetch_ms, long_poll_ms must be >= 0")
        if self.commit_interval_s <= 0 or self.recover_interval_s <= 0:
            raise InvalidConfig("commit_interval_s and recover_interval_s must be > 0")
        if self.instance_id is not None:
            check_group(self.instance_id, what="instance_id")
        if self.strategy.strip().upper() not in ("DEFAULT", "CONSIST", "STICKY"):
            raise ValueError(
                f"strategy must be 'DEFAULT', 'CONSIST' or 'STICKY', not {self.strategy!r}"
            )
        if self.zk_session_timeout_ms <= 0 or self.zk_sync_time_ms <= 0:
            raise ValueError("zk_session_timeout_ms and zk_sync_time_ms must be > 0")
        if self.max_poll_interval_ms < 0:
            raise ValueError("max_poll_interval_ms must be >= 0")


#: keyword names from before the units were in every name -> today's names (still accepted as
#: constructor overrides, with a DeprecationWarning: they are in the 0.1 documentation)
RENAMED = {"commit_interval": "commit_interval_s", "recover_interval": "recover_interval_s"}


def make_config(config: ConsumerConfig | None, overrides: dict[str, Any]) -> ConsumerConfig:
    """``config`` (default ``ConsumerConfig()``) with keyword overrides applied; unknown names
    raise ``TypeError`` naming them."""
    cfg = config or ConsumerConfig()
    if not overrides:
        return cfg
    for old, new in RENAMED.items():
        if old in overrides:
            warnings.warn(
                f"consumer option {old!r} is now {new!r}", DeprecationWarning, stacklevel=3
            )
            overrides[new] = overrides.pop(old)
    known = {f.name for f in dataclasses.fields(ConsumerConfig)}
    unknown = set(overrides) - known
    if unknown:
        raise unknown_options("consumer", unknown, known, KAFKA_NAMES)
    return dataclasses.replace(cfg, **overrides)


#: other clients' option names -> what to use instead (the UnknownOption message says so)
KAFKA_NAMES = {
    "group_id": "pass the group as the second argument, group=",
    "bootstrap_servers": "pass servers as the first argument, 'meta://host:port,...'",
    "auto_offset_reset": "use initial_position='earliest' | 'latest' | 'none' | 'auto'",
    "auto_commit_interval_ms": "use commit_interval_s (seconds)",
    "fetch_max_bytes": "use fetch_max_size",
    "max_partition_fetch_bytes": "use fetch_max_size",
}


def check_group(group: str, *, what: str = "group") -> str:
    """Return ``group`` if MetaQ accepts it as a group name, else raise
    :class:`~pymetaq.client.errors.InvalidGroupName` (a ``ValueError``)."""
    try:
        return zk.check_group(group)
    except ValueError as e:
        raise InvalidGroupName(f"invalid {what}: {e}") from None


def default_instance_id() -> str:
    """A broadcast instance id stable for this host and working directory.

    ``<hostname>-<first 8 hex of sha1(cwd)>`` with MetaQ's rename of ``.`` and ``:`` to ``-``:
    the same process restarted in the same directory keeps its offsets; two processes on one
    host in different directories are different instances. Two instances in the same
    directory must set ``instance_id`` explicitly.
    """
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "host"
    digest = hashlib.sha1(os.getcwd().encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{host}-{digest}"


def effective_group(group: str | None, config: ConsumerConfig) -> str | None:
    """The group offsets are kept under: ``group``, ``<group>-<instance>`` (broadcast), None."""
    if group is None:
        if config.broadcast:
            raise InvalidConfig("broadcast needs a group (offsets are kept per group and instance)")
        if config.initial_position is InitialPosition.NONE:
            raise InvalidConfig("initial position 'none' is illegal for an ungrouped consumer")
        return None
    check_group(group)
    if config.broadcast:
        return f"{group}-{config.instance_id or default_instance_id()}"
    return group
