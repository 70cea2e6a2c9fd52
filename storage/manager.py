"""The message store manager: every partition log of a broker, their flusher, retention jobs,
the id worker and the clean-shutdown marker.

Layout: ``<dataPath>/<topic>-<partition>/<20-digit start offset>.meta`` (a topic may override
``dataPath``).  ``open()`` loads every partition directory under ``StoreConfig.data_path``;
directories under a per-topic ``data_path`` are opened on first ``get_log`` and always scanned
(the clean marker only vouches for the directories under ``data_path``).

Clean shutdown: ``close()`` writes ``<dataPath>/.clean_shutdown`` (JSON, with the highest id
issued) after flushing and trimming every log; ``open()`` reads and removes it.  Without it every
partition's last segment is scanned and cut at the first bad record (see
:mod:`pymetaq.storage.recovery`); each :class:`RecoveryReport` is logged at INFO (WARNING when
something was cut) and returned.  The id worker is seeded from the marker or the scanned logs.

Thread-safety: ``get_log`` and the registry are guarded by one lock; logs are thread-safe;
``start``/``close`` are called once by the owner.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Callable

from pymetaq.storage.config import StoreConfig, TopicStoreConfig
from pymetaq.storage.cron import next_fire, validate_schedule
from pymetaq.storage.disk import Disk, MmapDisk
from pymetaq.storage.errors import LogClosed, PartitionOutOfRange, UnknownTopic
from pymetaq.storage.flusher import Flusher
from pymetaq.storage.ids import IdWorker
from pymetaq.storage.log import PartitionLog
from pymetaq.storage.recovery import RecoveryReport, open_segments
from pymetaq.storage.retention import RetentionAction, apply_retention
from pymetaq.storage.segment import parse_partition_dir, partition_dir_name

log = logging.getLogger(__name__)

CLEAN_MARKER = ".clean_shutdown"
TopicConfigFn = Callable[[str], TopicStoreConfig | None]


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
        self._disk: Disk = disk or MmapDisk()
        self.ids = IdWorker(config.broker_id, id_clock) if id_clock else IdWorker(config.broker_id)
        self._flusher = Flusher()
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._clean = False
        self._opened = False
        self._closed = False
        self.recovery_reports: list[RecoveryReport] = []
        self._ret_cond = threading.Condition()
        self._ret_thread: threading.Thread | None = None
        self._ret_stop = False

    # -- open / lookup -------------------------------------------------------------------

    def open(self) -> list[RecoveryReport]:
        """Load and recover every ``<topic>-<partition>`` directory under ``data_path``."""
        os.makedirs(self.config.data_path, exist_ok=True)
        marker = os.path.join(self.config.data_path, CLEAN_MARKER)
        self._clean = os.path.exists(marker)
        if self._clean:
            with open(marker) as f:
                self.ids.observe(int(json.load(f).get("max_msg_id", 0)))
            os.unlink(marker)
            self._disk.sync_dir(self.config.data_path)
        self._opened = True
        reports = []
        for name in sorted(os.listdir(self.config.data_path)):
            parsed = parse_partition_dir(name)
            if parsed is None or not os.path.isdir(os.path.join(self.config.data_path, name)):
                continue
            topic, partition = parsed
            with self._lock:
                reports.append(
                    self._open_log(topic, partition, self.config.data_path, clean=self._clean)[1]
                )
        return reports

    def _config_for(self, topic: str) -> TopicStoreConfig | None:
        return self._topic_config(topic)

    def _open_log(
        self, topic: str, partition: int, root: str, *, clean: bool
    ) -> tuple[PartitionLog, RecoveryReport]:
        cfg = self._config_for(topic)
        if cfg is None:
            log.warning("%s-%d: no topic config matches; using defaults", topic, partition)
            cfg = TopicStoreConfig()
        directory = os.path.join(root, partition_dir_name(topic, partition))
        os.makedirs(directory, exist_ok=True)
        segments, report = open_segments(
            self._disk,
            directory,
            topic,
            partition,
            max_segment_size=self.config.max_segment_size,
            clean=clean,
        )
        self.ids.observe(report.last_msg_id)
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
        )
        self._logs[(topic, partition)] = plog
        if not cfg.group_commit:
            self._flusher.watch(plog)
        self.recovery_reports.append(report)
        level = logging.WARNING if report.bytes_cut or report.records_cut else logging.INFO
        log.log(level, "recovered %s", report)
        with self._ret_cond:  # a new log may bring a deleteWhen schedule: reschedule
            self._ret_cond.notify()
        return plog, report

    def get_log(self, topic: str, partition: int, *, create: bool = True) -> PartitionLog | None:
        """The log of ``topic``/``partition``, opening or creating it if needed."""
        cfg = self._config_for(topic)
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
            root = cfg.data_path or self.config.data_path
            exists = os.path.isdir(os.path.join(root, partition_dir_name(topic, partition)))
            if not (create or exists):
                return None
            # a directory outside data_path may not have been open during the last clean
            # shutdown, so the marker says nothing about it: always scan it
            return self._open_log(topic, partition, root, clean=False)[0]

    def logs(self) -> list[PartitionLog]:
        return list(self._logs.values())

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self._logs})

    def reload_topic_config(self) -> None:
        """Re-read every open log's topic config (SIGHUP) and reschedule retention."""
        for plog in self.logs():
            cfg = self._config_for(plog.topic)
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
            actions += apply_retention(plog, plog.config.delete_policy, now, self._disk)
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
        """Flush everything, stop the threads, trim active segments, write the clean marker."""
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
        failed = False
        for plog in self.logs():
            self._flusher.unwatch(plog)
            plog.close()
            failed |= plog.failed
        if self._opened and not failed:
            self._write_marker()

    def _write_marker(self) -> None:
        path = os.path.join(self.config.data_path, CLEAN_MARKER)
        tmp = path + ".tmp"
        state = {"max_msg_id": self.ids.high_water(), "time": time.time()}
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._disk.sync_dir(self.config.data_path)
