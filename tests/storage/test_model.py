"""Model-based test: a hypothesis state machine against a plain list of (offset, data)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pymetaq.storage import MessageStoreManager, PartitionLog, ReadStatus
from pymetaq.storage.record import iter_records
from tests.storage._helpers import abandon, batch, manager, read_all

SEG = 256


class LogMachine(RuleBasedStateMachine):
    """append / read / roll (tiny segments) / retention / clean and unclean reopen."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="pymetaq-model-")
        self.model: list[tuple[int, bytes]] = []  # (offset, data) of live records
        self.end = 0
        self.threshold = 0
        self.m: MessageStoreManager | None = None

    @initialize(threshold=st.sampled_from([0, 2]))
    def open(self, threshold: int) -> None:
        self.threshold = threshold
        self._open()

    def _open(self) -> None:
        self.m = manager(self.dir, threshold=self.threshold, interval_ms=5, segment=SEG)

    @property
    def log(self) -> PartitionLog:
        assert self.m is not None
        plog = self.m.get_log("t", 0)
        assert plog is not None
        return plog

    @rule(payloads=st.lists(st.binary(max_size=120), min_size=1, max_size=6))
    def append(self, payloads: list[bytes]) -> None:
        res = self.log.append_sync(batch(payloads), timeout=10)
        assert res.offset == self.end and res.count == len(payloads)
        for p in payloads:
            self.model.append((self.end, p))
            self.end += 20 + len(p)

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 10**6), size=st.integers(1, 600))
    def read_at_record(self, i: int, size: int) -> None:
        plog = self.log
        while plog.max_offset < self.end:  # threshold mode: wait for the periodic fsync
            time.sleep(0.001)
        off, _ = self.model[i % len(self.model)]
        res = plog.read(off, size)
        assert res.status is ReadStatus.OK and res.region is not None
        with res.region as r:
            got = [(x.offset, x.data) for x in iter_records(r.read_bytes(), off)]
        k = i % len(self.model)
        assert got == self.model[k : k + len(got)]

    @rule(delta=st.integers(1, 1000))
    def read_out_of_range(self, delta: int) -> None:
        plog = self.log
        hi = plog.max_offset
        res = plog.read(hi + delta, 100)
        assert (res.status, res.offset) == (ReadStatus.OUT_OF_RANGE, hi)
        lo = plog.min_offset
        if lo > 0:
            res = plog.read(max(0, lo - delta), 100)
            assert (res.status, res.offset) == (ReadStatus.OUT_OF_RANGE, lo)

    @rule()
    def retention(self) -> None:
        assert self.m is not None
        plog = self.log
        active = plog.segments[-1].start
        old = time.time() - 200 * 3600  # older than the default delete,168
        for seg in plog.segments:
            os.utime(seg.path, (old, old))
        self.m.run_retention(time.time())
        assert plog.min_offset == active  # every immutable (old) segment went, never the active
        self.model = [(o, d) for o, d in self.model if o >= plog.min_offset]

    @rule()
    def reopen_clean(self) -> None:
        assert self.m is not None
        self.m.close()
        self._open()

    @rule()
    def reopen_unclean(self) -> None:
        assert self.m is not None
        abandon(self.m)  # process death: the kernel keeps every written page
        self._open()

    @invariant()
    def log_equals_model(self) -> None:
        if self.m is None:
            return
        recs = read_all(self.log)
        assert [(r.offset, r.data) for r in recs] == self.model
        assert self.log.write_offset == self.end

    def teardown(self) -> None:
        if self.m is not None:
            self.m.close()
        shutil.rmtree(self.dir, ignore_errors=True)


LogMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
TestLogModel = LogMachine.TestCase
