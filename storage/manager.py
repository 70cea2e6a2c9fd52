"""The message store manager: every partition log of a broker, their flusher, retention jobs,
the id worker, the data directory's lock and its clean-shutdown marker.

Layout: ``<dataPath>/<topic>-<partition>/<20-digit start offset>.meta`` (a topic may override
``dataPath``).  ``open()`` locks ``data_path`` (:mod:`pymetaq.storage.datadir`: a second broker
is refused with the holder's pid; an unwritable directory is refused with the reason), takes
the clean-shutdown marker and loads every partition directory under it; directories under a
per-topic ``data_path`` are locked and opened on first ``get_log``.

One log per real directory: a partition directory is ``<root>/<topic>-<partition>`` and must
resolve (``realpath``) to a direct child of the resolved root, so no name — and no symlink —
reaches outside the root or opens a second log on another partition's files
(:class:`~pymetaq.storage.errors.InvalidTopic`).  Storage checks this on its own, whatever the
broker validated before.  ``get_log(create=False)`` (gets, offsets) never creates a directory or
a segment.

Damage is contained: a partition whose files are inconsistent (a hole or overlap between
segments, an unreadable file) is **fenced** — its :class:`RecoveryReport` says why, ``get_log``
raises :class:`~pymetaq.storage.errors.PartitionFenced` for it, and every other partition is
served.  Each report is logged (INFO; WARNING when something was cut, adopted or skipped; ERROR
when fenced) and returned.  The id worker is seeded from the marker and the scanned logs.

Thread-safety: ``get_log`` and the registry are guarded by one lock; logs are thread-safe;
``open``/``start``/``close`` are called once by the owner.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Callable

from pymetaq.storage.config import StoreConfig, TopicStoreConfig
from pymetaq.storage.consumed import ConsumerProgress
from pymetaq.storage.cron import next_fire, validate_schedule
from pymetaq.storage.datadir import CLEAN_MARKER, DataDirLock, Marker, take_marker, write_marker
from pymetaq.storage.disk import Disk, MmapDisk, transient_error
from pymetaq.storage.errors import (
    CorruptLogError,
    InvalidTopic,
    LogClosed,
    PartitionFenced,
    PartitionOutOfRange,
    StorageError,
    UnknownTopic,
)
from pymetaq.storage.flusher import Flusher
from pymetaq.storage.highwater import HighWater
from pymetaq.storage.ids import IdWorker
from pymetaq.storage.log import PartitionLog
from pymetaq.storage.metrics import StoreMetrics
from pymetaq.storage.recovery import RecoveryReport, open_segments
from pymetaq.storage.retention import RetentionAction, apply_retention
from pymetaq.storage.scan import TailState
from pymetaq.storage.segment import Segment, parse_partition_dir, partition_dir_name
from pymetaq.storage.space import SpaceGuard
from pymetaq.storage.truncate import TruncateReport, truncate_partition

log = logging.getLogger(__name__)

__all__ = ["CLEAN_MARKER", "MessageStoreManager", "TopicConfigFn", "partition_directory"]

TopicConfigFn = Callable[[str], TopicStoreConfig | None]


def partition_directory(root: str, topic: str, partition: int) -> str:
    """``<root>/<topic>-<partition>``, or :class:`InvalidTopic` unless that path, resolved, is
    a direct child of the resolved ``root`` with that same name (no separators, ``.``/``..``,
    NUL, and no symlink: neither out of the root nor onto another partition's directory)."""
    if not topic or "/" in topic or "\0" in topic or topic in (".", "..") or partition < 0:
        raise InvalidTopic(f"{topic!r}/{partition} cannot name a partition directory")
    name = partition_dir_name(topic, partition)
    directory = os.path.join(root, name)
    real = os.path.realpath(directory)
    if real != os.path.join(os.path.realpath(root), name):
        raise InvalidTopic(f"{directory} resolves to {real}, not a directory of its own in {root}")
    return directory


def _transient(exc: OSError, what: str) -> Exception:
    """The retriable storage error for a shortage, else ``exc`` itself (re-raised)."""
    return transient_error(exc, what) or exc


class MessageStoreManager:
    """Owns all partition logs of one broker."""

    def __init__(
        self,
        config: StoreConfig,
        topic_config: TopicConfigFn,
        *,
        disk: Disk | None = None,
        id_clock: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self._topic_config = topic_config
        self._disk: Disk = disk or MmapDisk(config.segment_writes)
        self.ids = IdWorker(config.broker_id, id_clock) if id_clock else IdWorker(config.broker_id)
        self._flusher = Flusher()
        #: fsync latency, group-commit batches, retention (read by the broker's monitoring)
        self.metrics = StoreMetrics()
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._by_dir: dict[tuple[int, int], PartitionLog] = {}  # (dev, inode) -> its one log
        #: (topic, partition) -> why it is fenced (damaged at open; see the module doc)
        self.fenced: dict[tuple[str, int], str] = {}
        self._roots: dict[str, DataDirLock] = {}  # real root -> its lock
        self._spaces: dict[int, SpaceGuard] = {}  # st_dev -> the filesystem's reserve
        self._marker = Marker()
        self._opened = False
        self._closed = False
        self.recovery_reports: list[RecoveryReport] = []
        self._ret_cond = threading.Condition()
        self._ret_thread: threading.Thread | None = None
        self._ret_stop = False
        #: where ``deletePolicy=consumed`` reads committed offsets (set by the broker)
        self.consumer_progress: ConsumerProgress | None = None

    # -- open / lookup -------------------------------------------------------------------

    def open(self) -> list[RecoveryReport]:
        """Lock ``data_path`` and load (recover, or fence) every partition directory in it."""
        root = self.config.data_path
        self._lock_root(root)
        self._marker = take_marker(root)
        self._disk.sync_dir(root)
        self.ids.observe(self._marker.max_msg_id)
        self._opened = True
        reports = []
        for name in sorted(os.listdir(root)):
            parsed = parse_partition_dir(name)
            if parsed is None or not os.path.isdir(os.path.join(root, name)):
                continue
            with self._lock:
                report = self._open_dir(*parsed, root, create=True, found=True)
            if report is not None:
                reports.append(report)
        return reports

    def _lock_root(self, root: str) -> None:
        real = os.path.realpath(root)
        if real not in self._roots:
            lock = DataDirLock(root)
            lock.acquire()
            self._roots[real] = lock

    def _space_for(self, root: str) -> SpaceGuard | None:
        if self.config.min_free_disk_bytes <= 0:
            return None
        dev = os.stat(root).st_dev
        guard = self._spaces.get(dev)
        if guard is None:
            guard = self._spaces[dev] = SpaceGuard(root, self.config.min_free_disk_bytes)
        return guard

    def _open_dir(
        self,
        topic: str,
        partition: int,
        root: str,
        *,
        create: bool,
        found: bool = False,
        start_offset: int = 0,
    ) -> RecoveryReport | None:
        """Open one partition (lock held); None if it does not exist and ``create`` is False.
        A damaged partition is fenced and its report returned; so is a directory ``found`` at
        open whose name is unusable (asked for by name, it raises :class:`InvalidTopic`)."""
        try:
            directory = self._directory(root, topic, partition, create)
        except InvalidTopic as e:
            if found:
                return self._fence(topic, partition, os.path.join(root, f"{topic}-{partition}"), e)
            raise
        if directory is None:
            return None
        cfg = self._topic_config(topic)
        if cfg is None:
            log.warning("%s-%d: no topic config matches; using defaults", topic, partition)
            cfg = TopicStoreConfig()
        try:
            opened = open_segments(
                self._disk,
                directory,
                topic,
                partition,
                max_segment_size=self.config.max_segment_size,
                marker=self._marker.entry(directory),
                initial_offset=start_offset,
                create=create,
            )
        except CorruptLogError as e:
            return self._fence(topic, partition, directory, e)
        except OSError as e:
            raise _transient(e, directory) from e
        if opened is None:
            return None
        segments, report = opened
        self._register(topic, partition, directory, segments, cfg, root)
        self._record(report)
        return report

    def _directory(self, root: str, topic: str, partition: int, create: bool) -> str | None:
        """The checked partition directory (created if ``create``), None if absent; refuses
        (:class:`InvalidTopic`) one that is already another log's (same inode: an alias on a
        case-insensitive filesystem, a hard-linked or bind-mounted directory)."""
        directory = partition_directory(root, topic, partition)
        if create:
            try:
                os.mkdir(directory, 0o755)
            except FileExistsError:
                pass
            except OSError as e:
                raise _transient(e, directory) from e
        try:
            st = os.stat(directory)
        except FileNotFoundError:
            return None
        other = self._by_dir.get((st.st_dev, st.st_ino))
        if other is not None:
            raise InvalidTopic(f"{topic}-{partition} is the directory of {other.name}")
        return directory

    def _register(
        self,
        topic: str,
        partition: int,
        directory: str,
        segments: list[Segment],
        cfg: TopicStoreConfig,
        root: str,
    ) -> PartitionLog:
        try:
            high_water = HighWater(directory, segments[-1].end)
        except OSError as e:
            for seg in segments:
                seg.file.close()
            raise _transient(e, directory) from e
        plog = PartitionLog(
            topic,
            partition,
            directory,
            segments,
            self.config,
            cfg,
            self._disk,
            self.ids,
            self._flusher,
            high_water=high_water,
            space=self._space_for(root),
            metrics=self.metrics,
        )
        self._logs[(topic, partition)] = plog
        st = os.stat(directory)
        self._by_dir[(st.st_dev, st.st_ino)] = plog
        if not cfg.group_commit:
            self._flusher.watch(plog)
        with self._ret_cond:  # a new log may bring a deleteWhen schedule: reschedule
            self._ret_cond.notify()
        return plog

    def _record(self, report: RecoveryReport) -> None:
        self.ids.observe(report.last_msg_id)
        self.recovery_reports.append(report)
        noteworthy = report.bytes_cut or report.records_cut or report.gap or report.adopted
        level = logging.WARNING if noteworthy else logging.DEBUG if report.created else logging.INFO
        log.log(level, "%s", report.describe())

    def _fence(self, topic: str, partition: int, directory: str, exc: Exception) -> RecoveryReport:
        reason = f"partition {topic}-{partition} is damaged and fenced: {exc}"
        self.fenced[(topic, partition)] = reason
        log.error("%s", reason)
        report = RecoveryReport(topic, partition, directory, fenced=str(exc))
        self.recovery_reports.append(report)
        return report

    def get_log(
        self, topic: str, partition: int, *, create: bool = True, start_offset: int = 0
    ) -> PartitionLog | None:
        """The log of ``topic``/``partition``, opening it (or, with ``create``, creating it).

        ``start_offset``: where a log created now starts (a replica on an empty disk starts
        at its master's first offset); an existing log is opened as it is.

        Raises :class:`UnknownTopic`, :class:`PartitionOutOfRange`, :class:`InvalidTopic` (the
        name cannot be a directory of this store) or :class:`PartitionFenced`."""
        cfg = self._topic_config(topic)
        if cfg is None:
            raise UnknownTopic(f"no configuration for topic {topic!r}")
        if not 0 <= partition < cfg.num_partitions:
            raise PartitionOutOfRange(
                f"{topic}: partition {partition} outside 0..{cfg.num_partitions - 1}"
            )
        key = (topic, partition)
        plog = self._logs.get(key)
        if plog is not None:
            return plog
        with self._lock:
            if self._closed:
                raise LogClosed("message store is closed")
            plog = self._logs.get(key)
            if plog is not None:
                return plog
            if key not in self.fenced:
                root = cfg.data_path or self.config.data_path
                self._lock_root(root)
                self._open_dir(topic, partition, root, create=create, start_offset=start_offset)
            if key in self.fenced:
                raise PartitionFenced(self.fenced[key])
            return self._logs.get(key)

    def truncate(self, topic: str, partition: int, offset: int) -> TruncateReport:
        """Cut an open log at ``offset`` (a replica rejoining its new master): the log is
        closed, cut crash-safely (:mod:`pymetaq.storage.truncate`, which counts what it
        discards) and opened again; callers must drop references to the old log object.
        The caller makes sure nothing appends meanwhile (:class:`StorageError` if the cut is
        not inside the log; the log is open either way)."""
        with self._lock:
            plog = self._logs.get((topic, partition))
            if plog is None:
                raise StorageError(f"{topic}-{partition} is not open")
            self._flusher.unwatch(plog)
            plog.close()
            del self._logs[(topic, partition)]
            st = os.stat(plog.directory)
            self._by_dir.pop((st.st_dev, st.st_ino), None)
            self._marker.logs.pop(os.path.realpath(plog.directory), None)
            try:
                report = truncate_partition(plog.directory, offset)
            finally:
                root = os.path.dirname(plog.directory)
                self._open_dir(topic, partition, root, create=False)
        return report

    def logs(self) -> list[PartitionLog]:
        return list(self._logs.values())

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self._logs})

    def reload_topic_config(self) -> None:
        """Re-read every open log's topic config (SIGHUP) and reschedule retention."""
        for plog in self.logs():
            cfg = self._topic_config(plog.topic)
            if cfg is None or cfg == plog.config:
                continue
            validate_schedule(cfg.delete_when)
            plog.config = cfg
            if cfg.group_commit:
                self._flusher.unwatch(plog)
                self._flusher.request(plog)
            else:
                self._flusher.watch(plog)
        with self._ret_cond:
            self._ret_cond.notify()

    # -- retention -----------------------------------------------------------------------

    def run_retention(
        self, now: float | None = None, *, delete_when: str | None = None
    ) -> list[RetentionAction]:
        """Apply each log's delete policy now (only logs whose schedule is ``delete_when``,
        if given)."""
        now = time.time() if now is None else now
        actions: list[RetentionAction] = []
        for plog in self.logs():
            if plog.closed or (delete_when is not None and plog.config.delete_when != delete_when):
                continue
            actions += apply_retention(
                plog, plog.config.delete_policy, now, self._disk, self.consumer_progress
            )
        self.metrics.retention_run([(a.kind.value, a.size) for a in actions])
        self.metrics.unconsumed_removed([(a.topic, g, b, n) for a in actions for g, b, n in a.lost])
        return actions

    def _retention_loop(self) -> None:
        while True:
            now = dt.datetime.now()
            schedule: dict[str, dt.datetime] = {}
            for expr in {p.config.delete_when for p in self.logs()}:
                try:
                    fire = next_fire(expr, now)
                except ValueError as e:
                    log.error("bad deleteWhen %r: %s", expr, e)
                    continue
                if fire is not None:
                    schedule[expr] = fire
            wait = min((f - now).total_seconds() for f in schedule.values()) if schedule else None
            with self._ret_cond:
                if self._ret_stop:
                    return
                if self._ret_cond.wait(wait if wait is None else min(wait, 3600.0)):
                    continue  # woken: stop or reschedule
                if self._ret_stop:
                    return
            now = dt.datetime.now()
            for expr, fire in schedule.items():
                if fire <= now:
                    try:
                        self.run_retention(delete_when=expr)
                    except Exception:
                        log.exception("retention for deleteWhen %r failed", expr)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the flusher and the retention scheduler threads."""
        self._flusher.start()
        if self._ret_thread is None:
            self._ret_thread = threading.Thread(
                target=self._retention_loop, name="pymetaq-retention", daemon=True
            )
            self._ret_thread.start()

    def close(self) -> None:
        """Flush everything, stop the threads, trim active segments, write the clean marker
        (vouching for every log that closed cleanly), release the data directory locks."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with self._ret_cond:
            self._ret_stop = True
            self._ret_cond.notify()
        if self._ret_thread is not None:
            self._ret_thread.join()
        self._flusher.stop()
        tails: dict[str, TailState] = {}
        try:
            for plog in self.logs():
                self._flusher.unwatch(plog)
                plog.close()
                if plog.tail_state is not None:
                    tails[os.path.realpath(plog.directory)] = plog.tail_state
            if self._opened:
                self._write_marker(tails)
        finally:
            self._release_locks()

    def abort(self) -> None:
        """Give up after a failed :meth:`open`: close what was opened, write no marker (the
        next start scans), release the locks."""
        with self._lock:
            self._closed = True
        try:
            for plog in self.logs():
                plog.close()
        finally:
            self._release_locks()

    def _write_marker(self, tails: dict[str, TailState]) -> None:
        try:
            write_marker(self.config.data_path, self.ids.high_water(), tails)
        except OSError as e:  # e.g. a full disk: the next start scans every partition
            log.error("cannot write the clean-shutdown marker (%s): next start will scan", e)

    def _release_locks(self) -> None:
        for lock in self._roots.values():
            lock.release()
        self._roots.clear()
