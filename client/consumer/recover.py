"""What happens to a message the listener keeps failing on: reject policies and redelivery.

After ``1 + max_fetch_retries`` failed listener attempts the consumer hands the message to its
:class:`RejectPolicy` and moves on (MetaQ's ``RejectConsumptionHandler``):

* :class:`LocalRecoverPolicy` (default, MetaQ's ``LocalRecoverPolicy``): the message is
  journaled in a local spool, ``<recover_dir>/<topic>@<group>/`` (:mod:`pymetaq.client.spool`,
  fsynced before the consumer moves past it), and a background thread re-feeds every spooled
  message to the topic's listener every ``recover_interval_s`` seconds, deleting it on success.
  An *undecodable* record (CRC-valid, but unreadable: see
  :class:`~pymetaq.client.errors.UndecodableRecord`) is kept byte for byte in
  ``<recover_dir>/<topic>@<group>.undecodable/`` for an operator and never redelivered.
  The spool survives restarts: a new consumer of the same group and ``recover_dir`` redelivers
  what an earlier one spooled.
* :class:`DropPolicy`: log and drop (undecodable records too).

A policy receives ``reject(message, error)``: for an undecodable record ``error`` is an
:class:`~pymetaq.client.errors.UndecodableRecord` (``error.record`` holds the stored bytes) and
``message.value`` the record's raw data section.

One process at a time holds a spool directory (``flock``). If another process of the same group
on this host has it, redelivery skips it and a rejection raises ``SpoolLocked``: the consumer
then keeps the message unconsumed and retries it later (never dropped).

A redelivered message is the original (topic, partition, offset, id, value, attribute); its
``next_offset`` is only informational (the record it came from is long passed).

Thread-safety: ``reject`` may be called from any listener thread; the redelivery thread is the
policy's own; ``close`` stops it and closes the spools.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pymetaq.client.errors import SpoolLocked, UndecodableRecord
from pymetaq.client.spool import Spool, SpoolEntry
from pymetaq.client.transport.records import join_key, split_key
from pymetaq.client.types import Message, TopicPartition
from pymetaq.storage.record import decode_data, encode_data, encode_record, iter_records

log = logging.getLogger("pymetaq.client.consumer")

Listener = Callable[[Message], object]


class RejectPolicy(Protocol):
    """Receives messages whose processing failed ``1 + max_fetch_retries`` times."""

    def bind(self, group: str, listeners: dict[str, Listener]) -> None: ...

    def reject(self, message: Message, error: BaseException) -> None: ...

    def close(self) -> None: ...


class DropPolicy:
    """Log the message and drop it."""

    def __init__(self) -> None:
        self.dropped = 0

    def bind(self, group: str, listeners: dict[str, Listener]) -> None:
        pass

    def reject(self, message: Message, error: BaseException) -> None:
        self.dropped += 1
        log.error(
            "dropping %s/%s offset %s id %s after repeated failures: %r",
            message.topic,
            message.partition_key,
            message.offset,
            message.id,
            error,
        )

    def close(self) -> None:
        pass


def dead_letter_name(topic: str, group: str) -> str:
    """The directory (under the recover dir) that keeps a group's undecodable records."""
    return f"{topic}@{group}.undecodable"


def default_recover_dir() -> str:
    """``~/.pymetaq_recover`` (MetaQ: ``~/.meta_recover``)."""
    return str(Path.home() / ".pymetaq_recover")


def message_record(m: Message) -> bytes:
    """The message as one storage record (what the spool keeps)."""
    data, flag = encode_data(m.value, join_key(m.key, m.attribute))
    return bytes(encode_record(data, flag, m.id))


def entry_message(e: SpoolEntry) -> Message:
    """A spooled message rebuilt."""
    rec = next(iter_records(e.record))
    stored, value = decode_data(rec.data, rec.flag)
    key, attribute = split_key(stored)
    p = TopicPartition.from_key(e.topic, e.partition) if e.partition else None
    return Message(
        e.topic,
        p.partition if p is not None else -1,
        e.offset,
        rec.msg_id,
        value,
        attribute,
        e.offset + len(e.record),
        p.broker_id if p is not None else 0,
        key,
    )


class LocalRecoverPolicy:
    """Spool rejected messages on disk and redeliver them periodically (see module doc)."""

    def __init__(
        self, recover_dir: str | os.PathLike[str] | None = None, interval_s: float = 300.0
    ) -> None:
        self.dir = Path(recover_dir or default_recover_dir())
        self.interval_s = interval_s
        self.group = ""
        self.listeners: dict[str, Listener] = {}
        self.spools: dict[str, Spool] = {}
        self.redelivered = 0
        #: undecodable records kept for an operator (never redelivered)
        self.dead_lettered = 0
        self._dead: dict[str, Spool] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def bind(self, group: str, listeners: dict[str, Listener]) -> None:
        """Open the group's existing spools for ``listeners``' topics, start redelivering.

        A spool directory is created only by the first rejected message.
        """
        with self._lock:
            self.group = group
            self.listeners = dict(listeners)
            for topic in listeners:
                try:
                    self._open(topic, create=False)
                except SpoolLocked:
                    log.warning(
                        "recover spool %s@%s is open in another process; retrying when needed",
                        topic,
                        group,
                    )
            if self._thread is None and listeners:  # poll mode: nothing to redeliver to
                self._thread = threading.Thread(
                    target=self._run, name="pymetaq-recover", daemon=True
                )
                self._thread.start()

    def _open(self, topic: str, create: bool = True) -> Spool | None:
        """The topic's spool, opened if needed; None if it does not exist and not ``create``.

        Raises SpoolLocked if another process has it open.
        """
        spool = self.spools.get(topic)
        if spool is None:
            if not create and not (self.dir / f"{topic}@{self.group}").is_dir():
                return None  # nothing was ever spooled: no directory, no lock
            spool = self.spools[topic] = Spool.for_consumer(self.dir, topic, self.group)
        return spool

    def _spool(self, topic: str) -> Spool:
        with self._lock:
            spool = self._open(topic)
            assert spool is not None
            return spool

    def reject(self, message: Message, error: BaseException) -> None:
        if isinstance(error, UndecodableRecord):
            self._dead_letter(message, error)
            return
        self._spool(message.topic).append(
            message_record(message),
            topic=message.topic,
            partition=message.partition_key,
            offset=message.offset,
        )
        log.warning(
            "spooled %s/%s offset %s id %s for redelivery after repeated failures: %r",
            message.topic,
            message.partition_key,
            message.offset,
            message.id,
            error,
        )

    def _dead_letter(self, message: Message, error: UndecodableRecord) -> None:
        """Keep an undecodable record byte for byte in ``<topic>@<group>.undecodable/``."""
        with self._lock:
            spool = self._dead.get(message.topic)
            if spool is None:
                spool = self._dead[message.topic] = Spool(
                    self.dir / dead_letter_name(message.topic, self.group)
                )
        spool.append(
            error.record,
            topic=message.topic,
            partition=message.partition_key,
            offset=message.offset,
        )
        self.dead_lettered += 1
        log.error(
            "kept undecodable record %s/%s offset %s (%s) in %s",
            message.topic,
            message.partition_key,
            message.offset,
            error.reason,
            spool.dir,
        )

    def pending(self) -> int:
        with self._lock:
            spools = list(self.spools.values())
        return sum(len(s) for s in spools)

    def redeliver_once(self) -> int:
        """Feed every spooled message to its listener once; returns how many succeeded."""
        with self._lock:
            work = []
            for topic, listener in self.listeners.items():
                try:
                    spool = self._open(topic, create=False)
                except SpoolLocked:
                    continue  # another process has it; next round
                if spool is not None:
                    work.append((topic, spool, listener))
        done = 0
        for topic, spool, listener in work:
            if listener is None:
                continue
            for entry in spool.pending():
                if self._stop.is_set():
                    return done
                try:
                    listener(entry_message(entry))
                except Exception as e:
                    log.warning(
                        "redelivery of %s offset %s failed again: %r", topic, entry.offset, e
                    )
                    continue
                spool.remove(entry.key)
                done += 1
        self.redelivered += done
        return done

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.redeliver_once()
            except Exception:
                log.exception("recover redelivery round failed")

    def close(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)
        with self._lock:
            for s in [*self.spools.values(), *self._dead.values()]:
                s.close()
            self.spools.clear()
            self._dead.clear()
