"""MetaQ's synchronous pair (samsa master, gregor slave) with real broker processes.

A put is acknowledged only when both hold it: after the master is SIGKILLed at random moments
(seeded, several rounds) every acknowledged message is on the slave exactly once and in order;
with the slave SIGKILLed puts fail with 500 and nothing is acknowledged that the slave lacks.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pymetaq.client import Producer
from pymetaq.client.protocol import ResultReply
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import free_port
from tests.ha._helpers import SYNC_TOPICS, Sender, records, start_gregor, start_samsa
from tests.server._helpers import Wire

pytestmark = pytest.mark.integration


def pymetaq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pymetaq.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_verify_finds_replicas_that_differ(tmp_path: Path) -> None:
    with (
        BrokerProcess.start(tmp_path, name="a", topics=SYNC_TOPICS) as a,
        BrokerProcess.start(tmp_path, name="b", topics=SYNC_TOPICS) as b,
    ):
        for broker, fill in ((a, b"a"), (b, b"b")):
            with Producer(f"meta://127.0.0.1:{broker.port}") as p:
                assert p.send("orders", fill * 10, partition=0).success
        out = pymetaq("verify", "--master", f"127.0.0.1:{a.port}", "--slave", f"127.0.0.1:{b.port}")
        assert out.returncode == 1
        assert "DIFFERS" in out.stdout and "orders  0" in " ".join(out.stdout.split("|"))
    bad = pymetaq("verify", "--master", "nonsense", "--slave", "127.0.0.1:1")
    assert bad.returncode == 2 and bad.stderr.startswith("pymetaq verify: bad address")
    assert "Traceback" not in bad.stderr


def test_acks_wait_for_the_slave_and_the_logs_are_identical(tmp_path: Path) -> None:
    port = free_port()
    with start_gregor(tmp_path, port) as slave, start_samsa(tmp_path, port) as master:
        with Producer(f"meta://127.0.0.1:{master.port}") as p:
            handles = [p.send_async("orders", b"v%d" % i, partition=i % 2) for i in range(400)]
            results = [h.result(30) for h in handles]
        assert all(r.success for r in results)
        for part in (0, 1):
            ours, theirs = records(master, part), records(slave, part)
            assert ours == theirs and len(ours) == 200
        verify = pymetaq(
            "verify", "--master", f"127.0.0.1:{master.port}", "--slave", f"127.0.0.1:{slave.port}"
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert verify.stdout.count(" same") == 2 and "DIFFERS" not in verify.stdout
        strict = pymetaq(
            "verify",
            "--strict",
            "--json",
            "--master",
            f"127.0.0.1:{master.port}",
            "--slave",
            f"127.0.0.1:{slave.port}",
        )
        assert strict.returncode == 0
        docs = json.loads(strict.stdout)
        assert [(d["topic"], d["partition"], d["identical"]) for d in docs] == [
            ("orders", 0, True),
            ("orders", 1, True),
        ]
        with Wire(slave.address) as w:  # the slave takes no puts of its own
            reply = w.call(b"put orders 0 5 0 7\r\nhello")
        assert isinstance(reply, ResultReply) and reply.code == 403
        assert b"gregor slave" in reply.body
        assert slave.terminate() == 0 and master.terminate() == 0
    for part in (0, 1):
        name = f"orders-{part}/{0:020d}.meta"
        assert (slave.data_path / name).read_bytes() == (master.data_path / name).read_bytes()


def test_slave_killed_puts_fail_and_nothing_acked_is_missing(tmp_path: Path) -> None:
    port = free_port()
    with start_gregor(tmp_path, port) as slave, start_samsa(tmp_path, port) as master:
        sender = Sender(f"meta://127.0.0.1:{master.port}")
        try:
            wait_for(lambda: len(sender.acked) >= 50, 60, "acks before the crash")
            slave.kill()
            failed = sender.failed
            wait_for(
                lambda: sender.failed >= failed + 5, 60, "puts failing while the slave is down"
            )
            acked = len(sender.acked)
            wait_for(lambda: sender.failed >= failed + 20, 60, "more failures")
            assert len(sender.acked) <= acked + 1  # at most one in flight when it died
            slave.restart()  # same port: the master reconnects
            wait_for(lambda: len(sender.acked) >= acked + 50, 60, "acks after the slave's return")
        finally:
            sender.stop()
        on_slave = {(p, mid) for p in (0, 1) for _, mid, _ in records(slave, p)}
        for part, _off, mid, _value in sender.acked:
            assert (part, mid) in on_slave, f"acknowledged {mid} is not on the slave"


@pytest.mark.slow
def test_master_killed_every_acked_message_is_on_the_slave_once_in_order(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    port = free_port()
    acked: list[tuple[int, int, int, bytes]] = []
    with start_gregor(tmp_path, port) as slave, start_samsa(tmp_path, port) as master:
        for _round in range(4):
            sender = Sender(f"meta://127.0.0.1:{master.port}")
            start = len(sender.acked)
            wait_for(lambda s=sender, a=start: len(s.acked) >= a + 20, 60, "acks")  # type: ignore[misc]
            threading.Event().wait(rng.uniform(0.0, 0.5))  # a random moment (not a sync point)
            master.kill()
            sender.stop()
            acked += sender.acked
            master.restart()
        for part in (0, 1):
            ids = [mid for _, mid, _ in records(slave, part)]
            assert len(ids) == len(set(ids)), "a message twice on the slave"
            position = {mid: i for i, mid in enumerate(ids)}
            mine = [mid for p, _, mid, _ in acked if p == part]
            assert all(mid in position for mid in mine), "an acknowledged message is missing"
            assert [position[m] for m in mine] == sorted(position[m] for m in mine)  # in order


def test_no_ack_while_the_slave_cannot_answer(tmp_path: Path) -> None:
    """SIGSTOP the slave: its socket stays open, so only its reply can release the ack; the put
    fails after sendToSlaveTimeoutInMills instead, and succeeds again after SIGCONT."""
    port = free_port()
    with start_gregor(tmp_path, port) as slave, start_samsa(tmp_path, port) as master:
        _stopped_slave_blocks_acks(slave, master)


def _stopped_slave_blocks_acks(slave: BrokerProcess, master: BrokerProcess) -> None:
    with Producer(f"meta://127.0.0.1:{master.port}", retries=0) as p:
        assert p.send("orders", b"before", partition=0, timeout_s=10).success
        slave.signal(signal.SIGSTOP)
        try:
            r = p.send("orders", b"during", partition=0, timeout_s=10)
            assert not r.success and "slave" in str(r.error)
        finally:
            slave.signal(signal.SIGCONT)
        wait_for(lambda: p.send("orders", b"after", partition=0, timeout_s=10).success, 30, "acks")


@pytest.mark.zk
def test_failing_slave_takes_the_master_out_of_zookeeper_until_it_heals(
    tmp_path: Path, zk_hosts: str
) -> None:
    """slaveContinuousFailureThreshold failures in a row: the master deletes its nodes (the
    producers move away); once the slave answers again it registers again (MetaQ)."""
    from tests.cluster.conftest import new_client

    port = free_port()
    props = tmp_path / "samsa_master.properties"
    props.write_text(
        f"slave=127.0.0.1:{port}\nslaveContinuousFailureThreshold=3\ncheckSlaveIntervalInMills=50\n"
    )
    zk_keys = {"zk.zkEnable": "true", "zk.zkConnect": zk_hosts, "zk.zkSyncTimeMs": 100}
    zk = new_client(zk_hosts)
    try:
        with (
            start_gregor(tmp_path, port) as slave,
            BrokerProcess.start(
                tmp_path,
                name="samsa",
                topics=SYNC_TOPICS,
                zookeeper=zk_keys,
                extra_args=[f"-Fsamsa={props}"],
            ) as master,
        ):
            node = "/meta/brokers/ids/0/master"
            wait_for(lambda: zk.exists(node), 30, "the master registered")
            slave.kill()
            with Producer(f"meta://127.0.0.1:{master.port}", retries=0) as p:
                for _ in range(3):
                    r = p.send("orders", b"x", partition=0, timeout_s=10)
                    assert not r.success and "Slave is disconnected" in str(r.error)
            wait_for(lambda: not zk.exists(node), 30, "the master left ZooKeeper")
            wait_for(
                lambda: not zk.exists("/meta/brokers/topics-pub/orders/0-m"), 30, "topics gone"
            )
            slave.restart()
            wait_for(lambda: zk.exists(node), 30, "the master registered again")
            with Producer(f"meta://127.0.0.1:{master.port}", retries=0) as p:
                assert p.send("orders", b"healed", partition=0, timeout_s=10).success
    finally:
        zk.stop()
        zk.close()
