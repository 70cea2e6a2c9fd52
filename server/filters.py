"""Server-side filters: a group's ``get`` returns only the messages its filter keeps.

Configured as MetaQ does, in a topic section: ``group.<group>=module:function`` (MetaQ names a
``ConsumerMessageFilter`` class there), the module imported from ``appClassPath`` (MetaQ's key:
a directory, put first on ``sys.path``).  The function is called as ``function(attribute,
data)`` - the message's attribute (``str`` or ``None``) and its payload (``bytes``) - and keeps
the message when it returns a true value.

**What a filtered get answers.**  MetaQ decodes the slice, concatenates the kept messages and
sends them with ``value``; its clients then compute offsets from the concatenation, which is
wrong whenever a skipped message sat between two kept ones.  pymetaq keeps every reply a
contiguous range of the log (so every offset a consumer sees is exact and the bytes still come
from one read): the run of kept messages at the requested offset, up to the first skipped one;
when the message at the requested offset is skipped, ``301 <offset>`` with the offset of the
next kept message in the slice - or, when every message of the slice was filtered, the offset
after the slice, exactly as MetaQ.  A consumer follows the 301 (MetaQ's clients and pymetaq's
do) and reads on.  An lz4 batch record (flag ``0x100``) is one record to the broker: it is
always kept.  Zero-copy is lost only for filtered groups: the slice is read into memory.

**Filters cannot crash or stall the broker.**  Each (topic section, group) has its own worker
thread; the loop never runs a filter.  A filter that raises is logged and the message is kept
or skipped per ``filterErrorPolicy`` (``skip``, MetaQ's behaviour, or ``keep``).  A get whose
filtering takes longer than ``filterTimeoutMs`` is answered with what was decided by then, the
first undecided message taking the error policy; a filter that never returns blocks only its
own group's worker (later gets of that group time out the same way, one message at a time),
never the loop or other groups.  A filter that cannot be imported answers that group's gets
with ``500`` and the reason.

Thread-safety: :class:`Filters` and the answer path run on the loop; a :class:`GroupFilter`'s
``_decide`` runs on its worker thread and shares only the append-only decision list and the
``stop`` flag of one :class:`_Job`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import queue
import re
import struct
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pymetaq.client.protocol import encode_value_header
from pymetaq.storage.record import FLAG_LZ4_BATCH, HEADER, HEADER_SIZE

if TYPE_CHECKING:
    from pymetaq.client.protocol import GetCommand
    from pymetaq.server.config import BrokerConfig
    from pymetaq.server.connection import Connection

log = logging.getLogger("pymetaq.server")

_ATTR_LEN = struct.Struct(">i")
FilterFn = Callable[[str | None, bytes], Any]


class FilterLoadError(Exception):
    """``module:function`` could not be imported or is not callable."""


#: ``module:function``: a dotted module path, a colon, a dotted attribute path
_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def load_filter(ref: str) -> FilterFn:
    if not _REF.fullmatch(ref):
        raise FilterLoadError(
            f"filter {ref} cannot be loaded: not module:function (pymetaq filters are Python "
            f"callables, e.g. myfilters:only_orders; MetaQ's Java classes do not load)"
        )
    module_name, _, attr_path = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr_path.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # ImportError, AttributeError, or the module's own error
        raise FilterLoadError(f"filter {ref} cannot be loaded: {exc!r}") from exc
    if not callable(obj):
        raise FilterLoadError(f"filter {ref} is not callable")
    fn: FilterFn = obj
    return fn


def next_record(data: bytes, pos: int) -> tuple[int, int] | None:
    """(end, flag) of the complete record at ``pos`` of ``data``, None when there is none."""
    if pos + HEADER_SIZE > len(data):
        return None
    length, _crc, _id, flag = HEADER.unpack_from(data, pos)
    end = pos + HEADER_SIZE + length
    if length < 0 or end > len(data):
        return None
    return end, flag


class _Worker:
    """One daemon thread running submitted calls in order (a ``ThreadPoolExecutor``'s threads
    are joined at interpreter exit: a filter that never returns would hang the broker's stop)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[
            tuple[concurrent.futures.Future[None], Callable[[], None]] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> concurrent.futures.Future[None]:
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._queue.put((fut, fn))
        return fut

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fut, fn = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fn()
                fut.set_result(None)
            except BaseException as exc:  # reported to the awaiting get
                fut.set_exception(exc)

    def close(self) -> None:
        self._queue.put(None)


class _Job:
    __slots__ = ("decisions", "stop")

    def __init__(self) -> None:
        #: (start, end, keep) per record, appended by the worker, read by the loop
        self.decisions: list[tuple[int, int, bool]] = []
        self.stop = False


class GroupFilter:
    """One group's filter on one topic section: its function, policy, bound and worker."""

    def __init__(self, ref: str, fn: FilterFn, keep_on_error: bool, timeout_s: float) -> None:
        self.ref = ref
        self.fn = fn
        self.keep_on_error = keep_on_error
        self.timeout_s = timeout_s
        self.errors = 0
        self.timeouts = 0
        self._worker = _Worker(f"filter-{ref}")

    def _decide(self, data: bytes, job: _Job) -> None:
        """Decide records in order until the answer is fixed (the first skip after keeps,
        the first keep after skips) or the slice ends."""
        fn, decisions = self.fn, job.decisions
        pos = 0
        while not job.stop and (rec := next_record(data, pos)) is not None:
            end, flag = rec
            keep = self._one(fn, data, pos, end, flag)
            decisions.append((pos, end, keep))
            if keep != decisions[0][2]:
                return
            pos = end

    def _one(self, fn: FilterFn, data: bytes, start: int, end: int, flag: int) -> bool:
        if flag & FLAG_LZ4_BATCH:
            return True
        body = start + HEADER_SIZE
        attribute: str | None = None
        try:
            if flag & 1:
                (alen,) = _ATTR_LEN.unpack_from(data, body)
                attribute = data[body + 4 : body + 4 + alen].decode("utf-8", "replace")
                body += 4 + alen
            return bool(fn(attribute, data[body:end]))
        except Exception:
            self.errors += 1
            log.exception("filter %s failed on the record at +%d", self.ref, start)
            return self.keep_on_error

    async def select(self, data: bytes) -> tuple[int, int]:
        """(kept bytes from the start, 0) or (0, skip-to position relative to the slice)."""
        first = next_record(data, 0)
        if first is None:
            return len(data), 0
        job = _Job()
        fut = asyncio.wrap_future(self._worker.submit(lambda: self._decide(data, job)))
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
        except TimeoutError:
            job.stop = True
            self.timeouts += 1
            log.warning(
                "filter %s: over %.0f ms, answering with what it decided",
                self.ref,
                self.timeout_s * 1000,
            )
        decisions = list(job.decisions)
        if not fut.done():  # the first undecided message: the policy
            pos = decisions[-1][1] if decisions else 0
            rec = next_record(data, pos)
            if rec is not None:
                decisions.append((pos, rec[0], self.keep_on_error))
        if decisions[0][2]:  # the run of kept messages at the start
            end = 0
            for _start, rec_end, keep in decisions:
                if not keep:
                    break
                end = rec_end
            return end, 0
        for rec_start, _end, keep in decisions:
            if keep:
                return 0, rec_start  # skip to the first kept message
        return 0, decisions[-1][1]  # every decided message filtered: past them

    def close(self) -> None:
        self._worker.close()


class Filters:
    """Every configured group filter of the broker (loaded on first use)."""

    def __init__(self, config: Callable[[], BrokerConfig]) -> None:
        self.config = config  # the broker's current config (it may be reloaded)
        self._loaded: dict[tuple[str, str, str], GroupFilter | FilterLoadError] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def find(self, topic: str, group: str) -> GroupFilter | FilterLoadError | None:
        config = self.config()
        tc = config.topic_config(topic)
        if tc is None or not tc.group_filters:
            return None
        ref = dict(tc.group_filters).get(group)
        if ref is None:
            return None
        key = (tc.name, group, ref)
        found = self._loaded.get(key)
        if found is None:
            path = config.system.app_class_path
            if path and path not in sys.path:
                sys.path.insert(0, path)
            try:
                fn = load_filter(ref)
                found = GroupFilter(
                    ref, fn, tc.filter_error_policy == "keep", tc.filter_timeout_ms / 1000
                )
                log.warning("created filter %s for group %s and topic %s", ref, group, topic)
            except FilterLoadError as exc:
                log.error("%s", exc)
                found = exc
            self._loaded[key] = found
        return found

    def answer(
        self, conn: Connection, cmd: GetCommand, data: bytes, gf: GroupFilter | FilterLoadError
    ) -> None:
        """Answer a filtered get (asynchronously; the loop is never blocked by a filter)."""
        if isinstance(gf, FilterLoadError):
            conn.result(500, str(gf).encode(), cmd.opaque)
            return
        task = asyncio.ensure_future(self._answer(conn, cmd, data, gf))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(
        self, conn: Connection, cmd: GetCommand, data: bytes, gf: GroupFilter
    ) -> None:
        conn.request_started()
        try:
            kept, skip_to = await gf.select(data)
        except Exception as exc:  # a bug: answer, never leave a get unanswered
            log.exception("filtering a get of %s failed", cmd.topic)
            conn.request_done()
            conn.result(500, f"filter failed: {exc!r}".encode(), cmd.opaque)
            return
        conn.request_done()
        if kept:
            conn.reply(encode_value_header(kept, cmd.opaque) + data[:kept])
        else:
            conn.result(301, str(cmd.offset + skip_to).encode(), cmd.opaque)

    def close(self) -> None:
        for gf in self._loaded.values():
            if isinstance(gf, GroupFilter):
                gf.close()


__all__ = ["FilterLoadError", "Filters", "GroupFilter", "load_filter", "next_record"]
