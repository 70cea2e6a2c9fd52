"""Idempotent batch puts: the broker's memory of each producer's last batches per partition.

A ``bput`` in its 9-token form names a producer (``producer_id``) and numbers the batch
(``sequence``, per producer and partition, see ``docs/protocol.md``).  Per partition log a
:class:`PartitionProducers` keeps, for each producer, its last :data:`WINDOW` batches and
decides what a new ``bput`` is:

* **next** (``sequence`` = last + 1; 0 from a producer it does not know - or, when every
  remembered batch of the producer was lost in a crash, the first lost one): append it; the log's ``before_write`` hook records the batch (:meth:`IdemBatch.before_write`) in
  memory - *pending* until storage reports it durable - and in ``producers.idem``;
* **duplicate** (a sequence among the remembered batches): answer with the original batch's
  result - at once if it is durable, else when it becomes durable (or fails);
* **older** than the window: ``409 duplicate sequence ...`` (it was stored, its result is
  gone - only a producer with more than :data:`WINDOW` batches in flight can see this);
* **a gap** (a sequence after last + 1): ``409 out of order sequence ...``; nothing stored
  (``... unknown producer, expected 0`` for a producer it does not know).

After a restart the memory is rebuilt from ``producers.idem`` (:mod:`pymetaq.storage.producers`),
each producer's batches checked against the log (:func:`~pymetaq.storage.producers.batch_intact`)
the first time that producer is seen again.  At most :data:`MAX_PRODUCERS` producers are
remembered per partition (least recently used forgotten first: a forgotten producer's next
batch gets ``unknown producer`` and the client starts the partition over under a new id); the file is rewritten when it holds more
than :data:`COMPACT_BYTES` and four times the live entries.

Thread-safety: loop thread only, except :meth:`IdemBatch.sync_file` (the flusher thread).
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from pymetaq.client.protocol.model import INT32_MAX, PRODUCERS_MAX_ENTRIES
from pymetaq.storage import PartitionLog
from pymetaq.storage.producers import (
    ENTRY_SIZE,
    FILE_NAME,
    ProducerEntry,
    ProducerFile,
    batch_intact,
)

if TYPE_CHECKING:
    from pymetaq.server.connection import Connection

log = logging.getLogger("pymetaq.server")

#: batches remembered per producer and partition (a producer may have this many in flight)
WINDOW = 5
#: producers remembered per partition (least recently used forgotten first)
MAX_PRODUCERS = 1000
#: ``producers.idem`` is compacted once it is larger than this (and 4x its live entries)
COMPACT_BYTES = 1 << 20
#: entries kept in memory in log order for an async slave's ``producers`` requests; older
#: ones are read from the file
RECENT = 8192


class SequenceConflict(Exception):
    """A ``bput`` whose sequence is not the next one: 409 with this text."""


def next_sequence(seq: int) -> int:
    return 0 if seq >= INT32_MAX else seq + 1


class Stored:
    """One remembered batch: its place in the log and, while it is not durable yet, the
    duplicates waiting for its result."""

    __slots__ = ("entry", "waiters")

    def __init__(self, entry: ProducerEntry, pending: bool) -> None:
        self.entry = entry
        self.waiters: list[tuple[Connection, int]] | None = [] if pending else None

    def body(self, partition: int) -> bytes:
        e = self.entry
        return b"%d %d %d %d" % (e.first_id, partition, e.offset, e.count)


class PartitionProducers:
    """The producers of one partition log (see the module docstring)."""

    def __init__(self, plog: PartitionLog, sync: str = "auto") -> None:
        self.plog = plog
        self.file = ProducerFile(plog.directory, sync=sync)
        self._producers: collections.OrderedDict[str, collections.deque[Stored]] = (
            collections.OrderedDict()
        )
        #: entries loaded from the file, checked against the log on the producer's next bput
        self._unchecked: dict[str, list[ProducerEntry]] = {}
        #: producers whose every remembered batch was lost in a crash: the sequence expected
        self._lost_next: dict[str, int] = {}
        loaded = self.file.load()
        for entry in loaded:
            self._unchecked.setdefault(entry.producer_id, []).append(entry)
        #: the newest entries in log order (an async slave asks for them by range)
        self._recent: collections.deque[ProducerEntry] = collections.deque(maxlen=RECENT)
        self._recent.extend(sorted(loaded, key=lambda e: e.offset))
        # the file is made durable with the log's own fsync (storage.log's companion)
        plog.companion = self.file
        #: entries ending at or before this are no longer all in ``_recent``
        self._recent_from = self._recent[0].offset if len(loaded) > RECENT else 0
        for entries in self._unchecked.values():
            del entries[:-WINDOW]
        while len(self._unchecked) > MAX_PRODUCERS:
            del self._unchecked[next(iter(self._unchecked))]

    def _batches(self, pid: str) -> collections.deque[Stored] | None:
        batches = self._producers.get(pid)
        if batches is not None:
            self._producers.move_to_end(pid)
            return batches
        loaded = self._unchecked.pop(pid, None)
        if not loaded:
            return None
        kept: list[Stored] = []
        lost: ProducerEntry | None = None
        for entry in loaded:
            if not batch_intact(self.plog, entry):
                log.warning(
                    "%s: producer %s batch %d (offset %d) did not survive; forgotten",
                    self.plog.name,
                    pid,
                    entry.sequence,
                    entry.offset,
                )
                lost = entry
                break  # a lost batch: the ones after it were lost too
            kept.append(Stored(entry, pending=False))
        if not kept:
            if lost is not None:  # its retry must come first
                self._lost_next[pid] = lost.sequence
                while len(self._lost_next) > MAX_PRODUCERS:
                    del self._lost_next[next(iter(self._lost_next))]
            return None
        batches = collections.deque(kept, maxlen=WINDOW)
        self._remember(pid, batches)
        return batches

    def _remember(self, pid: str, batches: collections.deque[Stored]) -> None:
        self._producers[pid] = batches
        while len(self._producers) + len(self._unchecked) > MAX_PRODUCERS:
            if self._unchecked:
                del self._unchecked[next(iter(self._unchecked))]
            else:
                self._producers.popitem(last=False)

    def check(self, pid: str, seq: int) -> Stored | None:
        """The remembered batch ``seq`` is a duplicate of, or None when it is the next one;
        raises :class:`SequenceConflict` for a gap or a duplicate older than the window."""
        batches = self._batches(pid)
        if not batches:
            expected = self._lost_next.get(pid)
            if seq == (expected or 0):
                return None
            if expected is None:
                raise SequenceConflict(
                    f"out of order sequence {seq} of producer {pid}: unknown producer, expected 0"
                )
            raise SequenceConflict(
                f"out of order sequence {seq} of producer {pid}: expected {expected}"
            )
        last = batches[-1].entry.sequence
        if seq == next_sequence(last):
            return None
        for stored in batches:
            if stored.entry.sequence == seq:
                return stored
        behind = (last - seq) % (INT32_MAX + 1)
        if behind < (INT32_MAX + 1) // 2:
            raise SequenceConflict(
                f"duplicate sequence {seq} of producer {pid}: stored before the last "
                f"{WINDOW} batches (last {last}), its result is no longer known"
            )
        raise SequenceConflict(
            f"out of order sequence {seq} of producer {pid}: expected {next_sequence(last)}"
        )

    def record(self, pid: str, seq: int, offset: int, first_id: int, count: int, n: int) -> Stored:
        """A next batch was stamped and placed (the log's ``before_write``): file and memory."""
        return self._keep(ProducerEntry(pid, seq, count, first_id, offset, n), pending=True)

    def _keep(self, entry: ProducerEntry, *, pending: bool) -> Stored:
        self.file.append(entry)
        if len(self._recent) == RECENT:
            self._recent_from = self._recent[1].offset
        self._recent.append(entry)
        pid = entry.producer_id
        self._lost_next.pop(pid, None)
        stored = Stored(entry, pending=pending)
        batches = self._producers.get(pid)
        if batches is None:
            self._remember(pid, collections.deque([stored], maxlen=WINDOW))
        else:
            batches.append(stored)
        return stored

    def replicated(self, pid: str, seq: int) -> None:
        """A replica is about to store the master's batch ``seq`` of ``pid`` (its master
        decided it was the next one): a remembered batch with that sequence - one the master
        failed and stored again after a retry - is forgotten, with every later one."""
        batches = self._batches(pid)
        for stored in batches or ():
            if stored.entry.sequence == seq:
                self.forget(pid, stored)
                return

    def adopt(self, entry: ProducerEntry) -> None:
        """A replica copied the master's batch ``entry`` names (an async slave, the entry
        from the master's ``producers.idem``): file and memory, as the master recorded it."""
        self.replicated(entry.producer_id, entry.sequence)
        self._keep(entry, pending=False)

    def forget(self, pid: str, stored: Stored) -> None:
        """A recorded batch failed (nothing acknowledged): drop it and every later one."""
        batches = self._producers.get(pid)
        if batches is None or stored not in batches:
            return
        while batches and batches[-1] is not stored:
            batches.pop()
        batches.pop()

    def between(self, after: int, upto: int, most: int) -> list[ProducerEntry]:
        """The entries of the batches ending in ``(after, upto]``, oldest first, at most
        ``most`` (an async slave's ``producers`` request)."""
        if after < self._recent_from:  # older than memory: the file (bounded by compaction)
            entries = sorted(self.file.read(), key=lambda e: e.offset)
        else:
            entries = []
            for entry in reversed(self._recent):
                if entry.offset + entry.length <= after:
                    break
                entries.append(entry)
            entries.reverse()
        out = [e for e in entries if after < e.offset + e.length <= upto]
        return out[:most]

    def maybe_compact(self) -> None:
        """Rewrite the file when it is over COMPACT_BYTES and four times the live entries
        (runs after every acknowledged batch: the size is checked first, the entries are
        counted - a walk over every producer - only past COMPACT_BYTES)."""
        if self.file.size <= COMPACT_BYTES:
            return
        live = sum(len(b) for b in self._producers.values())
        live += sum(len(e) for e in self._unchecked.values())
        if self.file.size <= 4 * live * ENTRY_SIZE:
            return
        entries = [s.entry for b in self._producers.values() for s in b]
        entries += [e for es in self._unchecked.values() for e in es]
        try:
            self.file.rewrite(entries)
        except OSError as exc:  # the old file is intact: keep appending to it
            log.warning("%s: compacting %s failed: %s", self.plog.name, self.file.path, exc)


def next_piece(
    producers: PartitionProducers | None, start: int, n: int, most: int
) -> tuple[int, tuple[str, int] | None]:
    """How much of the ``n`` bytes of whole records at ``start`` a promoted master sends its
    rejoining replica as one ``bsync`` (:mod:`pymetaq.server.rejoin`), and the producer of
    that piece: an idempotent producer's batch goes alone, with its (producer id, sequence),
    so the replica records it in its ``producers.idem`` as this broker did; the bytes before
    it go without.  ``most``: the largest batch (batches end at most that far past ``start +
    n``)."""
    if producers is None:
        return n, None
    ending = producers.between(start, start + n + most, PRODUCERS_MAX_ENTRIES)
    batch = next((e for e in ending if start <= e.offset < start + n), None)
    if batch is None:
        return n, None
    if batch.offset > start:
        return batch.offset - start, None
    if batch.length > n:  # not all of it was read: sent as plain bytes
        return n, None
    return batch.length, (batch.producer_id, batch.sequence)


class IdemBatch:
    """One next batch on its way to storage: the hooks the append path calls."""

    __slots__ = ("pid", "producers", "seq", "stored", "ticket")

    def __init__(self, producers: PartitionProducers, pid: str, seq: int) -> None:
        self.producers = producers
        self.pid = pid
        self.seq = seq
        self.stored: Stored | None = None
        self.ticket: int | None = None  # the entry's place in producers.idem (its sync)

    def before_write(self, n: int) -> Callable[[int, int, int], None]:
        def hook(offset: int, first_id: int, count: int) -> None:
            self.stored = self.producers.record(self.pid, self.seq, offset, first_id, count, n)
            self.ticket = self.producers.file.appended

        return hook

    def sync_file(self) -> None:
        """Before the batch is acknowledged (group commit): its entry is durable too (at
        once when the fsync the log started alongside its own covered it)."""
        if self.producers.plog.group_commit:
            self.producers.file.sync(self.ticket)

    def acknowledged(self) -> list[tuple[Connection, int]]:
        """The batch is durable and answered: the duplicates that waited for its result."""
        stored = self.stored
        if stored is None:
            return []
        waiters, stored.waiters = stored.waiters or [], None
        self.producers.maybe_compact()
        return waiters

    def failed(self) -> list[tuple[Connection, int]]:
        """The batch failed: forget it (a retry is the next batch again); the duplicates that
        waited get the same failure."""
        stored = self.stored
        if stored is None:
            return []
        waiters, stored.waiters = stored.waiters or [], None
        self.producers.forget(self.pid, stored)
        return waiters


class Idempotence:
    """Every partition's producers (created on a partition's first idempotent ``bput``)."""

    def __init__(self, sync: str = "auto") -> None:
        self._sync = sync  # [system] producersSync
        self._parts: dict[tuple[str, int], PartitionProducers] = {}

    def producers(self, plog: PartitionLog) -> PartitionProducers:
        key = (plog.topic, plog.partition)
        found = self._parts.get(key)
        if found is None or found.plog is not plog:  # a new log (the partition was reopened)
            if found is not None:
                found.file.close()
            found = self._parts[key] = PartitionProducers(plog, self._sync)
        return found

    def known(self, plog: PartitionLog) -> PartitionProducers | None:
        """The partition's producers if it has any (its file exists), else None (no file is
        created)."""
        found = self._parts.get((plog.topic, plog.partition))
        if found is not None and found.plog is plog:
            return found
        if not os.path.exists(os.path.join(plog.directory, FILE_NAME)):
            return None
        return self.producers(plog)

    def adopt(self, plog: PartitionLog, entries: list[ProducerEntry]) -> Callable[[], None]:
        """An async slave is about to write the records these master's entries describe (the
        log's ``before_write``): record them; returns what makes them durable (any thread)."""
        producers = self.producers(plog)
        for entry in entries:
            producers.adopt(entry)
        return producers.file.sync

    def close(self) -> None:
        for parts in self._parts.values():
            parts.file.close()
        self._parts.clear()
