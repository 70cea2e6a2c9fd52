"""Defect 4, behaviour by behaviour, with exact replies: what an unauthenticated client can make
the broker hold is bounded (``tests/server/test_resources.py`` measures the whole attacks).

- partitions created for pattern topics (``maxAutoCreatedPartitions``), and gets create nothing;
- descriptors: pipelined gets hold at most one segment descriptor per connection;
- running out of descriptors (EMFILE) answers 500 per request, the broker keeps serving and
  recovers; RLIMIT_NOFILE is raised to the hard limit at start;
- realtime stats keyed only by topics that exist;
- connections per source IP; a request (line + body) must arrive within ``requestTimeoutMs``,
  and replies must be read within it;
- body bytes being received, across connections (``maxBufferedBodyBytes``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from pymetaq.client.protocol import ResultReply, ValueReply
from pymetaq.server.broker import Broker
from pymetaq.server.config import parse_config
from pymetaq.server.stats import VERSION
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import encode_record, iter_records
from tests._broker import BrokerProcess
from tests.server._attacks import fd_count
from tests.server._helpers import Wire, put_line, result, wait_for

pytestmark = pytest.mark.integration

OUT_OF_FDS = b"the broker is out of file descriptors (Too many open files); retry later"


def assert_closed(w: Wire) -> None:
    """The broker closed (EOF) or reset the connection; TimeoutError if it stays open."""
    try:
        w.read_until_closed(timeout=20)
    except ConnectionResetError:
        pass


def ok(reply: ResultReply | ValueReply) -> ResultReply:
    assert isinstance(reply, ResultReply) and reply.code == 200, reply
    return reply


# --------------------------------------------------------------------------- pattern topics


def test_pattern_topics_create_at_most_max_auto_created_partitions(tmp_path: Path) -> None:
    topics = {"auto-*": {"numPartitions": 2}, "exact": {"numPartitions": 4}}
    system = {"maxAutoCreatedPartitions": 3}
    with BrokerProcess.start(tmp_path, topics=topics, system=system) as broker:
        with Wire(broker.address) as w:
            for n, (topic, p) in enumerate([("auto-a", 0), ("auto-a", 1), ("auto-b", 0)]):
                ok(w.call(put_line(topic, p, b"x", n)))
            w.send(put_line("auto-b", 1, b"x", 10))
            reason = (
                b"The topic `auto-b` cannot get partition 1: the broker holds 3 partitions of "
                b"pattern topics (maxAutoCreatedPartitions=3)"
            )
            assert w.read_exact(len(result(500, reason, 10))) == result(500, reason, 10)
            ok(w.call(put_line("auto-a", 1, b"again", 11)))  # existing ones keep working
            for p in range(4):  # an exact [topic=...] section is not capped
                ok(w.call(put_line("exact", p, b"e", 20 + p)))
            # a get (long-poll or not) never creates a partition
            assert w.call(b"get auto-zz g 0 0 100 30\r\n") == ResultReply(
                404, b"The topic `auto-zz` in partition `0` is not exists", 30
            )
            assert w.call(b"get auto-zz g 1 0 100 50 31\r\n") == ResultReply(
                404, b"The topic `auto-zz` in partition `1` is not exists", 31
            )
        assert not any(p.name.startswith("auto-zz") for p in broker.data_path.iterdir())
        broker.restart()  # the partitions on disk still count
        with Wire(broker.address) as w:
            reply = w.call(put_line("auto-c", 0, b"x", 40))
            assert isinstance(reply, ResultReply) and reply.code == 500, reply
            ok(w.call(put_line("auto-b", 0, b"x", 41)))


def test_a_long_poll_on_a_partition_without_a_store_is_answered_by_the_put_creating_it(
    tmp_path: Path,
) -> None:
    with (
        BrokerProcess.start(tmp_path, topics={"lp": {}}) as broker,
        Wire(broker.address) as waiting,
        Wire(broker.address) as w,
    ):
        waiting.send(b"get lp g 0 0 4096 20000 1\r\n")
        assert w.call(b"version 2\r\n") == ResultReply(200, VERSION.encode(), 2)
        assert not (broker.data_path / "lp-0").exists()  # the get created nothing
        ok(w.call(put_line("lp", 0, b"arrived", 3, checksum(b"arrived"))))
        got = waiting.reply()
        assert isinstance(got, ValueReply) and got.opaque == 1
        assert [r.data for r in iter_records(got.data)] == [b"arrived"]


# --------------------------------------------------------------------------- descriptors


def test_pipelined_gets_hold_at_most_a_few_descriptors(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics={"flood": {}}) as broker, Wire(broker.address) as w:
        assert broker.proc is not None
        ok(w.call(put_line("flood", 0, b"f" * 100, 1)))
        base = fd_count(broker.proc.pid)
        n = 20_000
        frames = b"".join(b"get flood g 0 0 4096 %d\r\n" % (10 + i) for i in range(n))
        sender = threading.Thread(target=w.send, args=(frames,), daemon=True)
        sender.start()  # the broker stops reading: send from a thread, read nothing yet
        # measure for a second while the client reads nothing: the broker answers until its
        # queue is full, then stops reading (before the fix it opened a descriptor per get)
        peak = base
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            peak = max(peak, fd_count(broker.proc.pid))
            time.sleep(0.01)
        opaques = set()
        for _ in range(n):
            got = w.reply()
            assert isinstance(got, ValueReply), got
            opaques.add(got.opaque)
            peak = max(peak, fd_count(broker.proc.pid)) if len(opaques) % 1000 == 0 else peak
        sender.join(30)
        assert opaques == set(range(10, 10 + n))
        print(f"descriptors: {base} before, {peak} at most during {n} pipelined gets")
        assert peak - base <= 4, f"{peak - base} descriptors held for pipelined gets"


def test_rlimit_nofile_is_raised_to_the_hard_limit_at_start(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, nofile=(256, 1024)) as broker:
        assert broker.proc is not None
        limits = Path(f"/proc/{broker.proc.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == ["1024", "1024"], line


def test_out_of_descriptors_is_500_and_the_broker_keeps_serving(tmp_path: Path) -> None:
    limit = 96
    system = {"maxConnectionsPerIp": 1000, "maxConnections": 1000}
    topics = {"fd": {}, "fdnew-*": {}}
    with BrokerProcess.start(tmp_path, topics=topics, system=system, nofile=(limit, limit)) as b:
        assert b.proc is not None
        pid = b.proc.pid
        w = Wire(b.address)
        ok(w.call(put_line("fd", 0, b"kept", 1, checksum(b"kept"))))
        hogs: list[socket.socket] = []
        try:
            for _ in range(limit + 20):  # the kernel completes them; the broker runs out
                hogs.append(socket.create_connection(b.address, timeout=10))
            wait_for(lambda: fd_count(pid) >= limit, what="the broker out of descriptors")
            # reads need a descriptor (sendfile): a clear, retriable 500, nothing else breaks
            reply = w.call(b"get fd g 0 0 4096 2\r\n")
            assert reply == ResultReply(500, b"Could not read fd-0: " + OUT_OF_FDS, 2)
            reply = w.call(put_line("fdnew-1", 0, b"x", 3))
            assert reply == ResultReply(500, b"Put message failed: " + OUT_OF_FDS, 3)
            assert w.call(b"version 4\r\n") == ResultReply(200, VERSION.encode(), 4)
        finally:
            for s in hogs:
                s.close()
        # descriptors come back: everything works again, the same partitions included
        wait_for(lambda: fd_count(pid) < limit - 20, what="descriptors released")
        got = w.call(b"get fd g 0 0 4096 5\r\n")
        assert isinstance(got, ValueReply)
        assert [r.data for r in iter_records(got.data)] == [b"kept"]
        ok(w.call(put_line("fdnew-1", 0, b"x", 6)))
        got = w.call(b"get fdnew-1 g 0 0 4096 7\r\n")
        assert isinstance(got, ValueReply)
        w.close()
        assert b.proc.poll() is None
        with Wire(b.address) as again:
            assert again.call(b"version 8\r\n") == ResultReply(200, VERSION.encode(), 8)


# --------------------------------------------------------------------------- stats


def test_realtime_stats_never_grow_for_invented_topic_names(tmp_path: Path) -> None:
    config = parse_config(
        f"[system]\nserverPort=0\ndashboardHttpPort=0\ndataPath={tmp_path}\nunflushThreshold=0\n"
        "[zookeeper]\nzk.zkEnable=false\n[topic=st-*]\nstat=true\n[topic=real]\nstat=true\n",
        cwd=str(tmp_path),
    )
    with Broker(config) as broker, Wire(broker.address) as w:
        assert broker.dispatcher is not None
        ok(w.call(put_line("real", 0, b"r", 1)))
        n = 5000
        w.send(b"".join(b"get st-%d g 0 0 100 %d\r\n" % (i, i) for i in range(n)))
        for _ in range(n):
            assert isinstance(w.reply(), ResultReply)
        ok(w.call(put_line("st-1", 0, b"s", 2)))  # st-1 exists now: it has its own stats
        assert w.call(b"get st-1 g 0 0 100 3\r\n").opaque == 3
        stats = broker.dispatcher.stats
        # (item, key) pairs: put/message_size for real and st-1, get for st-1 and st-*, get_miss for st-*
        assert stats.realtime_keys() == {
            ("put", "real"),
            ("message_size", "real"),
            ("put", "st-1"),
            ("message_size", "st-1"),
            ("get", "st-1"),
            ("get", "st-*"),  # MetaQ counts every get, misses included
            ("get_miss", "st-*"),
        }
        lines = w.call(b"stats realtime 4\r\n").body.decode().split("\r\n")  # type: ignore[union-attr]
        assert any(x.startswith(f"realtime_get_miss Count={n},") for x in lines), lines


# --------------------------------------------------------------------------- connections


def _closed_at_accept(address: tuple[str, int], source: str) -> bool:
    s = socket.create_connection(address, timeout=10, source_address=(source, 0))
    try:
        s.sendall(b"version 1\r\n")
        return s.recv(100) == b""
    except ConnectionResetError:
        return True
    finally:
        s.close()


def test_connections_per_ip_are_limited(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, system={"maxConnectionsPerIp": 2}) as broker:
        first = socket.create_connection(broker.address, source_address=("127.0.0.1", 0))
        second = socket.create_connection(broker.address, source_address=("127.0.0.1", 0))
        try:
            for s, op in ((first, 1), (second, 2)):
                s.sendall(b"version %d\r\n" % op)
                assert s.recv(100).startswith(b"result 200 ")
            assert _closed_at_accept(broker.address, "127.0.0.1")
            assert not _closed_at_accept(broker.address, "127.0.0.2")  # another IP gets in
        finally:
            first.close()
        wait_for(lambda: not _closed_at_accept(broker.address, "127.0.0.1"), what="a slot")
        second.close()
        wait_for(lambda: "maxConnectionsPerIp reached" in broker.log_text(), what="the log line")


def test_a_request_that_does_not_arrive_in_time_closes_the_connection(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, system={"requestTimeoutMs": 500}) as broker:
        for partial in (b"versio", b"put test 0 10 0 -1 1\r\nhalf"):
            with Wire(broker.address) as w:
                w.send(partial)
                assert_closed(w)
        with Wire(broker.address) as w:  # a complete request restarts nothing: no deadline
            assert w.call(b"version 2\r\n") == ResultReply(200, VERSION.encode(), 2)
            # silent between requests is idleness (idleTimeoutMs), not a late request
            threading.Event().wait(1.0)
            assert w.call(b"version 3\r\n") == ResultReply(200, VERSION.encode(), 3)
        assert "a request did not arrive within 0.5 s" in broker.log_text()


def test_a_client_streaming_longer_than_the_request_timeout_is_not_closed(tmp_path: Path) -> None:
    """The clock times one frame: a stream whose every write ends mid-frame is not late."""
    with BrokerProcess.start(tmp_path, system={"requestTimeoutMs": 400}) as broker:
        with Wire(broker.address) as w:
            frame = put_line("test", 0, b"s" * 100, 1)
            half = len(frame) // 2
            deadline = time.monotonic() + 1.5
            sent = 0
            w.send(frame[:half])
            while time.monotonic() < deadline:  # every write completes one frame, starts one
                w.send(frame[half:] + frame[:half])
                sent += 1
                time.sleep(0.05)  # the client's pace
            w.send(frame[half:])
            for _ in range(sent + 1):
                ok(w.reply())
        assert "did not arrive" not in broker.log_text()


def test_replies_left_unread_close_the_connection(tmp_path: Path) -> None:
    system = {"requestTimeoutMs": 500}
    with BrokerProcess.start(tmp_path, topics={"big": {}}, system=system) as broker:
        with Wire(broker.address) as w:
            data = b"b" * 1_000_000
            ok(w.call(put_line("big", 0, data, 1)))
            w.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            w.send(b"".join(b"get big g 0 0 1048576 %d\r\n" % i for i in range(100)))
            wait_for(
                lambda: "its replies were not read for 0.5 s" in broker.log_text(),
                what="the unread replies noticed",
            )
            assert_closed(w)
        with Wire(broker.address) as w:
            assert w.call(b"version 2\r\n") == ResultReply(200, VERSION.encode(), 2)


# --------------------------------------------------------------------------- body memory


def test_bodies_over_the_budget_take_turns_and_all_complete(tmp_path: Path) -> None:
    mib = 1 << 20
    system = {"maxBufferedBodyBytes": 2 * mib, "maxBatchSize": 4 * mib}
    with BrokerProcess.start(tmp_path, topics={"bb": {}}, system=system) as broker:
        record = encode_record(b"r" * 1000)
        body = record * (1_400_000 // len(record))  # 1.4 MB: two do not fit at once
        frame = b"bput bb 0 %d %d -1 %%d\r\n" % (len(body), len(body) // len(record))
        holder, waiter = Wire(broker.address), Wire(broker.address)
        try:
            holder.send(frame % 1 + body[: len(body) // 2])  # holds its reservation
            waiter.send(frame % 2 + body[:1000])  # must wait: the budget is taken
            with Wire(broker.address) as small:  # a small put never waits
                ok(small.call(put_line("bb", 0, b"small", 3)))
            holder.send(body[len(body) // 2 :])
            ok(holder.reply())
            waiter.send(body[1000:])
            assert ok(waiter.reply()).opaque == 2
        finally:
            holder.close()
            waiter.close()
        assert os.path.isdir(broker.data_path / "bb-0")


def test_a_half_close_after_many_pipelined_commands_still_gets_every_reply(
    tmp_path: Path,
) -> None:
    """More commands than one turn runs (the rest wait for the next loop turn), then EOF."""
    with BrokerProcess.start(tmp_path) as broker:
        n = 5000
        with socket.create_connection(broker.address, timeout=20) as sock:
            sock.sendall(b"".join(b"version %d\r\n" % i for i in range(n)))
            sock.shutdown(socket.SHUT_WR)
            got = b""
            deadline = time.monotonic() + 30
            while (chunk := sock.recv(1 << 20)) and time.monotonic() < deadline:
                got += chunk
        assert got.count(b"result 200 ") == n
