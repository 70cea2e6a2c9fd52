"""Operations MetaQ offered through JMX and ``metamorphosis-tools``: close and open partitions for
publishing, reload the configuration, slave status - run by the ``admin`` command.

``admin <action> [<arg>...] <opaque>`` (pymetaq protocol extension, docs/protocol.md) is
accepted only from loopback peers until the broker authenticates clients; the dashboard's
reload button runs the same :meth:`Admin.run`.  Replies are ``result <code>`` with a text body:

| action                           | 200 body                               | errors            |
|----------------------------------|----------------------------------------|-------------------|
| ``close <topic> <start> [<end>]``| ``closed <topic> partition(s) a..b``   | 404 unknown topic,|
|                                  |                                        | 400 bad range     |
| ``open <topic> [<start> [<end>]]``| ``opened <topic> partition(s) ...``   | as close          |
| ``closed``                       | ``<topic> <p>,<p>...`` per topic, or   |                   |
|                                  | ``no closed partitions``               |                   |
| ``reload``                       | ``config reloaded: ...``               | 500 the reason    |
| ``slaves``                       | a slave: its lag per partition; a      |                   |
|                                  | master: its slaves' (``no slaves ...``)|                   |
| ``help``                         | the actions                            |                   |

Closing is MetaQ's ``closePartitions(topic, start, end)``: puts to a closed partition are
answered ``403`` (MetaQ's text: ``Put message to [broker '...'] [partition 't-2'] failed.Detail:
partition[0-2] has been closed``); a put with partition ``-1`` picks among the open ones.  Unlike
MetaQ, gets are still served, so consumers drain a closed partition (the reason to close one:
moving or retiring it).  ``open <topic>`` with no range opens all of the topic's partitions
(MetaQ's ``openPartitions(topic)``).  The state is in memory: a restart opens everything, as
in MetaQ.

Thread-safety: everything runs on the broker's event-loop thread.
"""

from __future__ import annotations

import ipaddress
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from pymetaq.client.protocol.names import topic_name_error

if TYPE_CHECKING:
    from pymetaq.server.broker import Broker
    from pymetaq.server.config import TopicConfig

log = logging.getLogger("pymetaq.server")

NO_SLAVES = "no slaves: this broker is a master and no slave replicates from it"
ACTIONS = {
    "close": "close <topic> <start> [<end>]: puts to these partitions get 403",
    "open": "open <topic> [<start> [<end>]]: accept puts again (no range: every partition)",
    "closed": "closed: list the closed partitions",
    "reload": "reload: re-read the config file's [topic=...] sections (as SIGHUP)",
    "slaves": "slaves: replication status",
    "help": "help: this list",
}


def is_loopback(host: str) -> bool:
    """Whether a peer address is this host's loopback (127.0.0.0/8, ::1, ::ffff:127.x)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


class ClosedPartitions:
    """Which partitions refuse puts: topic -> partitions (only configured topics)."""

    def __init__(self) -> None:
        self._closed: dict[str, set[int]] = {}
        #: any partition closed? (a plain attribute: the put path reads it on every put)
        self.active = False

    def __bool__(self) -> bool:
        return self.active

    def is_closed(self, topic: str, partition: int) -> bool:
        parts = self._closed.get(topic)
        return parts is not None and partition in parts

    def check_put(
        self, broker: Broker, tc: TopicConfig, topic: str, partition: int
    ) -> tuple[int, str | None]:
        """(the partition to put to, why the put is refused or None): ``-1`` becomes a random
        open partition; a closed one is refused with MetaQ's text."""
        parts = self._closed.get(topic)
        if not parts:
            return partition, None
        if partition == -1:
            choices = [p for p in range(tc.num_partitions) if p not in parts]
            if not choices:
                return partition, f"every partition of `{topic}` is closed"
            return random.choice(choices), None
        if partition not in parts:
            return partition, None
        broker_id = broker.config.system.broker_id
        return partition, (
            f"Put message to [broker 'meta://{broker.host}:{broker.port}'] [partition "
            f"'{topic}-{partition}'] failed.Detail:partition[{broker_id}-{partition}] "
            "has been closed"
        )

    def close(self, topic: str, partitions: range) -> None:
        self._closed.setdefault(topic, set()).update(partitions)
        self.active = True

    def open(self, topic: str, partitions: range | None) -> list[int]:
        """Open ``partitions`` (None: all) of ``topic``; the ones that were closed."""
        parts = self._closed.get(topic, set())
        opened = sorted(parts if partitions is None else parts.intersection(partitions))
        parts.difference_update(opened)
        if not parts:
            self._closed.pop(topic, None)
        self.active = bool(self._closed)
        return opened

    def items(self) -> list[tuple[str, list[int]]]:
        return [(t, sorted(p)) for t, p in sorted(self._closed.items())]

    def count(self) -> int:
        return sum(len(p) for p in self._closed.values())


class AdminError(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


class Admin:
    """Runs admin actions against one broker."""

    def __init__(self, broker: Broker, closed: ClosedPartitions) -> None:
        self.broker = broker
        self.closed = closed
        self._actions: dict[str, Callable[[tuple[str, ...]], str]] = {
            "close": self._close,
            "open": self._open,
            "closed": self._list,
            "reload": self._reload,
            "slaves": self._slaves,
            "help": self._help,
        }

    def run(self, action: str, args: tuple[str, ...]) -> tuple[int, str]:
        """(reply code, text) of one action."""
        fn = self._actions.get(action)
        if fn is None:
            return 400, f"unknown admin action {action[:40]!r}; one of: {', '.join(ACTIONS)}"
        try:
            return 200, fn(args)
        except AdminError as exc:
            return exc.code, str(exc)

    def _partitions(self, args: tuple[str, ...], *, need_start: bool) -> tuple[str, range | None]:
        if not args or len(args) > 3:
            raise AdminError(400, "usage: " + ACTIONS["close" if need_start else "open"])
        topic = args[0]
        bad = topic_name_error(topic)
        if bad is not None:
            raise AdminError(400, bad)
        tc = self.broker.config.topic_config(topic)
        # a topic of a [topic=...*...] pattern only once it exists: names here are bounded
        if tc is None or (tc.is_pattern and topic not in self.broker.store.topics()):
            raise AdminError(404, f"The topic `{topic}` is not in topics list of the broker")
        if len(args) == 1:
            if need_start:
                raise AdminError(400, "usage: " + ACTIONS["close"])
            return topic, None
        try:
            start = int(args[1])
            end = int(args[2]) if len(args) == 3 else start
        except ValueError:
            raise AdminError(400, "partition numbers must be integers") from None
        if not 0 <= start <= end < tc.num_partitions:
            raise AdminError(
                400,
                f"bad partition range {start}..{end} for `{topic}`: "
                f"it has partitions 0..{tc.num_partitions - 1}",
            )
        return topic, range(start, end + 1)

    def _close(self, args: tuple[str, ...]) -> str:
        topic, parts = self._partitions(args, need_start=True)
        assert parts is not None
        self.closed.close(topic, parts)
        log.warning("closed %s partition(s) %s for publishing", topic, _span(list(parts)))
        return f"closed {topic} partition(s) {_span(list(parts))}"

    def _open(self, args: tuple[str, ...]) -> str:
        topic, parts = self._partitions(args, need_start=False)
        opened = self.closed.open(topic, parts)
        if not opened:
            return f"{topic} has no closed partitions" + ("" if parts is None else " in that range")
        log.warning("opened %s partition(s) %s for publishing", topic, _span(opened))
        return f"opened {topic} partition(s) {_span(opened)}"

    def _list(self, args: tuple[str, ...]) -> str:
        items = self.closed.items()
        if not items:
            return "no closed partitions"
        return "\r\n".join(f"{t} {','.join(map(str, parts))}" for t, parts in items)

    def _reload(self, args: tuple[str, ...]) -> str:
        ok, message = self.broker.reload_now()
        if not ok:
            raise AdminError(500, message)
        return message

    def _slaves(self, args: tuple[str, ...]) -> str:
        from pymetaq.server.replication import slaves_text

        return slaves_text(self.broker, NO_SLAVES)

    def _help(self, args: tuple[str, ...]) -> str:
        return "\r\n".join(ACTIONS.values())


def _span(parts: list[int]) -> str:
    if len(parts) > 1 and parts == list(range(parts[0], parts[-1] + 1)):
        return f"{parts[0]}..{parts[-1]}"
    return ",".join(map(str, parts))
