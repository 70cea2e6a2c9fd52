"""Automatic failover of a synchronous pair through real ZooKeeper, with real broker processes.

- The master SIGKILLed at a random moment (seeded; a fresh pair per round) while a ``zk://``
  producer sends: the gregor slave takes over at epoch 2 and registers as the master, the
  same producer's sends succeed again without a restart, and every acknowledged message is on
  the new master exactly once and in order.  The old master started again does not start
  as master (fenced): it rejoins as the slave (tests/ha/test_rejoin.py).
- The master SIGSTOPped past its session timeout: the slave takes over, mapping a consumer
  group's offset by its msgId first (recoverOffset); after SIGCONT the old master accepts no
  write (its syncs are refused, then it knows it is fenced and says so) and stays out of
  ZooKeeper.
- A clean stop of the master is no failover: the slave stays a slave.
"""

from __future__ import annotations

import random
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from pymetaq.client import Producer
from pymetaq.client.protocol import ResultReply
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests._services import free_port
from tests.cluster.conftest import new_client
from tests.ha._helpers import Sender, records, start_gregor, start_samsa, stats
from tests.server._helpers import Wire

pytestmark = [pytest.mark.integration, pytest.mark.zk]


def failover_line(broker: BrokerProcess) -> str:
    return next(ln for ln in stats(broker, "replication") if ln.startswith("epoch "))


def value(zk: Any, path: str) -> bytes | None:
    """A node's data, None while it does not exist (it may go between two calls)."""
    from kazoo.exceptions import NoNodeError

    try:
        return bytes(zk.get(path)[0])
    except NoNodeError:
        return None


def start_pair(tmp_path: Path, zk_hosts: str) -> tuple[BrokerProcess, BrokerProcess]:
    port = free_port()
    slave = start_gregor(tmp_path, port, zk_hosts)
    master = start_samsa(tmp_path, port, zk_hosts)
    url = f"meta://127.0.0.1:{master.port}"
    wait_for(lambda: failover_line(slave) == f"epoch - state gregor master {url}", 30, "watching")
    assert failover_line(master) == "epoch 1 state master master -"
    return slave, master


def assert_all_acked_once_in_order(
    broker: BrokerProcess, acked: list[tuple[int, int, int, bytes]]
) -> None:
    for part in (0, 1):
        stored = [(mid, value) for _, mid, value in records(broker, part)]
        ids = [mid for mid, _ in stored]
        assert len(ids) == len(set(ids)), "a message twice on the new master"
        position = {mid: i for i, mid in enumerate(ids)}
        mine = [(mid, value) for p, _, mid, value in acked if p == part]
        missing = [mid for mid, _ in mine if mid not in position]
        assert not missing, f"acknowledged {missing[:5]} missing from the new master"
        assert [position[m] for m, _ in mine] == sorted(position[m] for m, _ in mine)
        assert all(stored[position[m]][1] == v for m, v in mine)


@pytest.mark.slow
def test_master_killed_the_slave_takes_over_and_producers_follow(
    tmp_path: Path, zk_hosts: str
) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for round_no in range(3):
        root = tmp_path / f"round{round_no}"
        root.mkdir()
        hosts = f"{zk_hosts}/r{round_no}"  # a fresh registry per pair
        zk = new_client(zk_hosts)
        zk.ensure_path(f"/r{round_no}")
        zk.stop()
        zk.close()
        slave, master = start_pair(root, hosts)
        with slave, master:
            sender = Sender(f"zk://{hosts}/meta")
            try:
                wait_for(lambda s=sender: len(s.acked) >= 20, 60, "acks through the master")  # type: ignore[misc]
                threading.Event().wait(rng.uniform(0.0, 0.5))  # a random moment
                master.kill()
                at_kill = len(sender.acked)
                wait_for(
                    lambda s=sender, a=at_kill: len(s.acked) >= a + 20,  # type: ignore[misc]
                    60,
                    "acks through the promoted slave (the same producer, not restarted)",
                )
            finally:
                sender.stop()
            assert failover_line(slave).startswith("epoch 2 state master")
            assert_all_acked_once_in_order(slave, sender.acked)
            master.restart()  # replaced: it does not start as the master, it rejoins
            new = f"epoch - state gregor master meta://127.0.0.1:{slave.port}"
            wait_for(lambda m=master, n=new: failover_line(m) == n, 60, "rejoined")  # type: ignore[misc]


def test_stopped_master_is_fenced_when_it_wakes(tmp_path: Path, zk_hosts: str) -> None:
    slave, master = start_pair(tmp_path, zk_hosts)
    with slave, master:
        new_url = f"meta://127.0.0.1:{slave.port}"
        with Producer(f"meta://127.0.0.1:{master.port}", retries=0) as p:
            sent = p.send("orders", b"before", partition=0, timeout_s=10)
            assert sent.success
        zk = new_client(zk_hosts)
        try:
            # a group that consumed "before", at a position the new master does not have
            offsets = "/meta/consumers/g/offsets/orders/0-0"
            zk.create(offsets, b"%d-12345" % sent.msg_id, makepath=True)
            master.signal(signal.SIGSTOP)
            try:
                node = "/meta/brokers/ids/0/master"
                wait_for(
                    lambda: value(zk, node) == new_url.encode(),
                    60,
                    "the slave registered as the master",
                )
            finally:
                master.signal(signal.SIGCONT)
            ((_, _, data),) = records(slave, 0)  # recoverOffset ran before it registered
            assert zk.get(offsets)[0] == b"%d-%d" % (sent.msg_id, sent.offset + 20 + len(data))
            with Wire(master.address) as w:  # at once: the promoted slave refuses its syncs
                reply = w.call(b"put orders 0 5 0 7\r\nstale")
            assert isinstance(reply, ResultReply) and reply.code in (403, 500), reply
            wait_for(lambda: "state fenced" in failover_line(master), 60, "the master fenced")
            replaced = (
                f"broker 0 is not accepting writes: brokerId 0's master is {new_url} since epoch 2"
            )

            def refused_as_replaced() -> bool:
                with Wire(master.address) as w:
                    reply = w.call(b"put orders 1 5 0 8\r\nstale")
                assert isinstance(reply, ResultReply) and reply.code == 403, reply
                text = reply.body.decode()  # then it rejoins as the slave (test_rejoin.py)
                return text.startswith(replaced) or text.startswith("broker 0 is a gregor slave")

            wait_for(refused_as_replaced, 60, "the master knows it was replaced")
            assert zk.get(node)[0] == new_url.encode()  # the old master stays out
            assert b"stale" not in b"".join(v for _, _, v in records(slave, 0) + records(slave, 1))
            with Producer(f"meta://127.0.0.1:{slave.port}", retries=0) as p:
                assert p.send("orders", b"after", partition=0, timeout_s=10).success
            assert [v for _, _, v in records(slave, 0)] == [b"before", b"after"]
        finally:
            zk.stop()
            zk.close()


def test_a_clean_stop_of_the_master_is_no_failover(tmp_path: Path, zk_hosts: str) -> None:
    slave, master = start_pair(tmp_path, zk_hosts)
    with slave, master:
        url = f"meta://127.0.0.1:{master.port}"
        assert master.terminate() == 0
        with Wire(slave.address) as w:  # the slave still refuses puts: it is a slave
            reply = w.call(b"put orders 0 1 0 9\r\nx")
        assert isinstance(reply, ResultReply) and reply.code == 403
        assert failover_line(slave) == f"epoch - state gregor master {url}"
        master.restart()  # the same master comes back: epoch 1, still its master
        assert failover_line(master) == "epoch 1 state master master -"
        with Producer(f"meta://127.0.0.1:{master.port}", retries=0) as p:
            assert p.send("orders", b"back", partition=0, timeout_s=10).success


def test_a_failing_slave_is_no_failover(tmp_path: Path, zk_hosts: str) -> None:
    """The slave SIGSTOPped past slaveContinuousFailureThreshold and its session timeout: the
    master leaves ZooKeeper (MetaQ) and marks the epoch; the slave, back, stays a slave and
    the master registers again."""
    port = free_port()
    slave = start_gregor(tmp_path, port, zk_hosts)
    master = start_samsa(
        tmp_path, port, zk_hosts, slaveContinuousFailureThreshold=2, checkSlaveIntervalInMills=50
    )
    with slave, master:
        url = f"meta://127.0.0.1:{master.port}"
        wait_for(lambda: failover_line(slave) == f"epoch - state gregor master {url}", 30, "watch")
        zk = new_client(zk_hosts)
        try:
            node = "/meta/brokers/ids/0/master"
            slave.signal(signal.SIGSTOP)
            try:
                with Producer(url, retries=0) as p:
                    for _ in range(2):
                        assert not p.send("orders", b"x", partition=0, timeout_s=10).success
                wait_for(lambda: not zk.exists(node), 30, "the master left ZooKeeper")
                assert b'"stopped":true' in zk.get("/meta/brokers/ids/0/epoch")[0]
                threading.Event().wait(5)  # past the slave's 4 s session: it expired meanwhile
            finally:
                slave.signal(signal.SIGCONT)
            wait_for(lambda: zk.exists(node), 60, "the master registered again")
            assert zk.get(node)[0] == url.encode()
            epoch = "/meta/brokers/ids/0/epoch"  # unmarked once its master node exists again
            wait_for(lambda: b'"stopped":false' in (value(zk, epoch) or b""), 30, "unmarked")
            assert failover_line(slave) == f"epoch - state gregor master {url}"
            with Producer(url, retries=0) as p:
                assert p.send("orders", b"healed", partition=0, timeout_s=10).success
        finally:
            zk.stop()
            zk.close()
