"""A coordinator process for the crash matrix: ``python -m tests.transactions._coordchild
'<json>'``.

It opens a producer, an engine and a :class:`Coordinator` (whose construction runs recovery),
prints ``recovered <json report>``, waits for a line on stdin, then runs its plan: one global
transaction per order (insert the ``orders`` row, send ``order-<id>#<i>`` for i < k), printing
``begin <id>`` and ``done <id> <outcome>``. The order named ``victim`` SIGKILLs this process
at the coordinator step ``step`` (``mid-body``: after the row and the first message); the
parent may also SIGKILL it at any moment. Exit 0 when the plan is done.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys

import sqlalchemy as sa

from pymetaq.client import Producer
from pymetaq.client.transaction import Coordinator


def say(*words: object) -> None:
    """One line for the test, written with one ``write``: the test kills this process at any
    moment, and ``print`` writes each word separately when stdout is unbuffered
    (``PYTHONUNBUFFERED=1``), so a kill between them left a bare ``done`` line behind."""
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


def main(spec: dict[str, object]) -> int:
    victim = spec.get("victim")
    step = spec.get("step")
    current: list[int] = [-1]

    def on_step(name: str) -> None:
        if current[0] == victim and name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    engine = sa.create_engine(str(spec["pg_url"]))
    orders = sa.Table("orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    producer = Producer(str(spec["server"]))
    producer.partitions("orders")
    coordinator = Coordinator(
        "crash-1", str(spec["log"]), producer, engine, timeout_s=10, on_step=on_step
    )
    report = coordinator.last_recovery
    say("recovered", json.dumps(dataclasses.asdict(report) if report else {}))
    sys.stdin.readline()
    plan = spec["plan"]
    assert isinstance(plan, list)
    for oid, k in plan:
        current[0] = oid
        say("begin", oid)
        with coordinator.transaction() as g:
            g.connection.execute(orders.insert().values(id=oid))
            for i in range(k):
                producer.send("orders", b"order-%d#%d" % (oid, i), partition=i % 2)
                if i == 0:
                    on_step("mid-body")
        say("done", oid, g.outcome)
    coordinator.close()
    producer.close()
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
