"""A replaced master rejoins as its successor's slave by itself (real processes, real ZooKeeper).

- SIGSTOP the samsa master past its session timeout with a producer running; its gregor slave
  is promoted; SIGCONT: the old master refuses writes (fenced, then as a slave: exact replies),
  cuts the tail it wrote that was never acknowledged (logged with counts), and follows the new
  master as its synchronous slave: ``pymetaq verify --strict`` says ``same`` for every
  partition, every acknowledged message is on the new master exactly once and in order, each
  put acknowledged afterwards is on the rejoined slave when its ack arrives, and the epoch node
  names it in sync.  The slave stopped again: puts are not acknowledged without it, then the
  master detaches it (acks alone, ``insync`` cleared); woken, it rejoins again.
- The restart path: the old master SIGKILLed, restarted after the promotion with its
  ``-Fsamsa`` command line: it starts, rejoins, and ends ``same``; then the other way round
  (the new master killed, the rejoined slave promoted at epoch 3, the killed one restarted
  with its ``-Fgregor`` command line rejoins it).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client import Producer
from pymetaq.client.protocol import ResultReply
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.cluster.conftest import new_client
from tests.ha._helpers import Sender, records, stats
from tests.ha.test_failover import assert_all_acked_once_in_order, start_pair, value
from tests.server._helpers import Wire

pytestmark = [pytest.mark.integration, pytest.mark.zk]

EPOCH = "/meta/brokers/ids/0/epoch"
MASTER = "/meta/brokers/ids/0/master"
EXPIRED = (
    "broker 0 is not accepting writes: its ZooKeeper session expired: "
    "not a master until it has confirmed its epoch"
)
SYNC_REFUSED = b"500 sync is only accepted by a slave broker; this broker is not a slave"
GREGOR_REFUSAL = (
    "broker 0 is a gregor slave (the synchronous replica of its samsa master): "
    "send messages to the master"
)


def verify_strict(master: BrokerProcess, slave: BrokerProcess) -> str:
    pair = ["--master", f"127.0.0.1:{master.port}", "--slave", f"127.0.0.1:{slave.port}"]
    out = subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", "verify", "--strict", *pair],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()[1:]
    assert len(lines) == 2 and all(ln.endswith(" same") for ln in lines), out.stdout
    return out.stdout


def epoch_doc(zk: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(value(zk, EPOCH) or b"{}")
    return doc


def replica_of(broker: BrokerProcess) -> str:
    return (broker.data_path / ".replica_id").read_text().strip()


def rejoined(old: BrokerProcess, new: BrokerProcess, zk: Any, times: int = 1) -> bool:
    """The old master follows the new one, which (its process for the ``times``-th time) sent
    it everything it lacked and names it in sync."""
    line = f"rejoin: meta://127.0.0.1:{old.port} holds everything: it is the in-sync slave"
    done = new.log_text().count(line)
    head = stats(new, "replication")[0]
    in_sync = epoch_doc(zk).get("insync") == replica_of(old)
    link = head.startswith(f"gregor 127.0.0.1:{old.port} state connected form bsync")
    return done >= times and link and in_sync


def put_reply(broker: BrokerProcess, partition: int, data: bytes) -> ResultReply:
    with Wire(broker.address) as w:
        reply = w.call(b"put orders %d %d 0 3\r\n%s" % (partition, len(data), data))
    assert isinstance(reply, ResultReply), reply
    return reply


def cut_lines(broker: BrokerProcess) -> dict[int, tuple[int, int]]:
    """partition -> (records, bytes) discarded, from the rejoin's log lines."""
    found = re.findall(
        r"rejoin: orders-(\d) cut at \d+ \(the new master's end at its promotion\): "
        r"(\d+) record\(s\), (\d+) byte\(s\)",
        broker.log_text(),
    )
    return {int(p): (int(r), int(b)) for p, r, b in found}


def acked_on_slave_at_once(new: BrokerProcess, old: BrokerProcess, n: int) -> None:
    """Each put acknowledged by the new master is on the rejoined slave when the ack comes."""
    with Producer(f"meta://127.0.0.1:{new.port}", retries=0) as p:
        for i in range(n):
            sent = p.send("orders", b"held-%d" % i, partition=i % 2, timeout_s=10)
            assert sent.success, sent
            ids = {mid for _, mid, _ in records(old, i % 2)}
            assert sent.msg_id in ids, f"acknowledged {sent.msg_id} before the slave held it"


def test_a_stopped_master_rejoins_as_the_slave_of_its_successor(
    tmp_path: Path, zk_hosts: str
) -> None:
    new, old = start_pair(tmp_path, zk_hosts)  # the gregor slave will be the new master
    with new, old:
        new_url, old_url = f"meta://127.0.0.1:{new.port}", f"meta://127.0.0.1:{old.port}"
        zk = new_client(zk_hosts)
        sender = Sender(f"zk://{zk_hosts}/meta")
        try:
            wait_for(lambda: len(sender.acked) >= 30, 60, "acks through the first master")
            old.signal(signal.SIGSTOP)
            try:
                wait_for(lambda: value(zk, MASTER) == new_url.encode(), 60, "the promotion")
                at = len(sender.acked)
                wait_for(lambda: len(sender.acked) >= at + 20, 60, "acks through the new master")
                stale = Wire(old.address)  # a put waiting in the stopped master's socket
                stale.send(b"put orders 0 5 0 77\r\nstale")
            finally:
                old.signal(signal.SIGCONT)
            first = stale.reply()
            stale.close()
            assert isinstance(first, ResultReply) and first.code in (403, 500), first
            assert first.code == 403 or first.body.endswith(SYNC_REFUSED), first
            fenced = (
                f"broker 0 is not accepting writes: brokerId 0's master is {new_url} since "
                f"epoch 2 (this broker at {old_url} had epoch 1): it was replaced"
            )

            def refused() -> bool:
                """Until it knows, a put is written and then fails (the new master refuses
                its sync: never acknowledged, cut later); then it is refused as it is."""
                reply = put_reply(old, 1, b"late")
                if reply.code == 500:
                    assert reply.body.endswith(SYNC_REFUSED), reply
                    return False
                assert reply.code == 403, reply
                assert reply.body.decode() in (EXPIRED, fenced, GREGOR_REFUSAL), reply
                return reply.body.decode() != EXPIRED

            wait_for(refused, 60, "the old master refuses writes")
            wait_for(lambda: rejoined(old, new, zk), 60, "the old master rejoined as the slave")
            assert put_reply(old, 1, b"late").body.decode() == GREGOR_REFUSAL
            assert "not accepting writes: " + fenced.split(": ", 1)[1] in old.log_text()
            at = len(sender.acked)
            wait_for(lambda: len(sender.acked) >= at + 30, 60, "acks with the rejoined slave")
        finally:
            sender.stop()
        cuts = cut_lines(old)
        assert set(cuts) == {0, 1}, old.log_text()
        if first.code == 500:  # it wrote "stale" before it knew, and the new master refused it
            assert cuts[0][0] >= 1 and cuts[0][1] >= 25
        stored = b"".join(v for part in (0, 1) for _, _, v in records(new, part))
        assert b"stale" not in stored and b"late" not in stored
        assert_all_acked_once_in_order(new, sender.acked)
        verify_strict(new, old)
        acked_on_slave_at_once(new, old, 10)
        assert failover_state(old) == f"epoch - state gregor master {new_url}"
        # the rejoined slave stops: nothing is acknowledged without it, then it is detached
        old.signal(signal.SIGSTOP)
        try:
            assert put_reply(new, 0, b"alone?").code == 500
            wait_for(lambda: epoch_doc(zk).get("insync") == "", 30, "insync cleared")
            none = "gregor - state none form - batches 0 failures 0"
            wait_for(lambda: stats(new, "replication")[0] == none, 30, "detached")
            assert put_reply(new, 0, b"alone").code == 200  # Kafka's min.insync.replicas=1
        finally:
            old.signal(signal.SIGCONT)
        wait_for(lambda: rejoined(old, new, zk, 2), 60, "rejoined again")
        acked_on_slave_at_once(new, old, 4)
        verify_strict(new, old)
        # the promoted master stopped cleanly and started again with its -Fgregor command
        # line: no failover (a planned stop), it serves as the master of its epoch again
        assert new.terminate() == 0
        assert epoch_doc(zk)["stopped"] is True
        new.restart()
        assert failover_state(new) == "epoch 2 state master master -"
        wait_for(lambda: rejoined(old, new, zk), 60, "its slave followed it again")
        acked_on_slave_at_once(new, old, 4)
        verify_strict(new, old)
        zk.stop()
        zk.close()


def failover_state(broker: BrokerProcess) -> str:
    return next(ln for ln in stats(broker, "replication") if ln.startswith("epoch "))


def test_a_killed_master_restarted_after_the_promotion_rejoins(
    tmp_path: Path, zk_hosts: str
) -> None:
    new, old = start_pair(tmp_path, zk_hosts)
    with new, old:
        new_url = f"meta://127.0.0.1:{new.port}"
        zk = new_client(zk_hosts)
        sender = Sender(f"zk://{zk_hosts}/meta")
        try:
            wait_for(lambda: len(sender.acked) >= 30, 60, "acks through the first master")
            threading.Event().wait(0.1)
            old.kill()
            wait_for(lambda: value(zk, MASTER) == new_url.encode(), 60, "the promotion")
            at = len(sender.acked)
            wait_for(lambda: len(sender.acked) >= at + 20, 60, "acks through the new master")
            old.restart()  # with its -Fsamsa command line: it starts, and rejoins
            wait_for(lambda: rejoined(old, new, zk), 60, "the restarted master rejoined")
            assert put_reply(old, 0, b"late").body.decode() == GREGOR_REFUSAL
            at = len(sender.acked)
            wait_for(lambda: len(sender.acked) >= at + 20, 60, "acks with the rejoined slave")
        finally:
            sender.stop()
        assert set(cut_lines(old)) == {0, 1}, old.log_text()
        assert_all_acked_once_in_order(new, sender.acked)
        verify_strict(new, old)
        acked_on_slave_at_once(new, old, 6)
        # and back: the new master killed, the rejoined (in-sync) slave takes over at epoch 3;
        # the killed one restarted with its -Fgregor command line rejoins in turn
        old_url = f"meta://127.0.0.1:{old.port}"
        again = Sender(f"zk://{zk_hosts}/meta")
        try:
            wait_for(lambda: len(again.acked) >= 20, 60, "acks through the second master")
            new.kill()
            wait_for(lambda: value(zk, MASTER) == old_url.encode(), 60, "the second promotion")
            assert epoch_doc(zk)["epoch"] == 3 and epoch_doc(zk)["insync"] == ""
            at = len(again.acked)
            wait_for(lambda: len(again.acked) >= at + 20, 60, "acks through the third master")
            new.restart()
            wait_for(lambda: rejoined(new, old, zk), 60, "the killed master rejoined")
        finally:
            again.stop()
        assert_all_acked_once_in_order(old, sender.acked + again.acked)
        assert f"rejoin: {old_url} follows this master" not in old.log_text()  # not itself
        assert "cannot take" not in old.log_text() + new.log_text()
        verify_strict(old, new)
        acked_on_slave_at_once(old, new, 4)
        zk.stop()
        zk.close()
