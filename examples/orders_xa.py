"""An order row in PostgreSQL and an "order created" message, both or neither.

Start the broker on the shipped configuration, give a PostgreSQL database whose server has
``max_prepared_transactions > 0``, and run::

    .venv/bin/pymetaq server -f conf/server.ini &
    .venv/bin/pip install -q -e '.[pg]'
    .venv/bin/python examples/orders_xa.py --db postgresql+psycopg://postgres@127.0.0.1:5432/shop
    .venv/bin/python examples/orders_xa.py --db ... --fail      # neither row nor message

Each run is one global transaction of the two-phase-commit coordinator: the ``orders`` row
is inserted through a SQLAlchemy connection in a prepared transaction, the message is sent
into the broker's XA branch, and both commit together (or, with ``--fail``, both roll back).
The coordinator's decision log is ``./orders-decisions.log``; a coordinator started after a
crash finishes whatever was in doubt before it does anything else.
"""

from __future__ import annotations

import argparse
import os
import sys

import sqlalchemy as sa

from pymetaq.client import Producer
from pymetaq.client.transaction import Coordinator, TransactionError

ORDERS = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("customer", sa.String(40), nullable=False),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="SQLAlchemy URL of a PostgreSQL database")
    ap.add_argument(
        "--server",
        default=os.environ.get("PYMETAQ_SERVERS", "meta://127.0.0.1:8123"),
        help="the broker (default: $PYMETAQ_SERVERS, else meta://127.0.0.1:8123, as the CLI)",
    )
    ap.add_argument("--topic", default="test", help="topic of the message (default: test)")
    ap.add_argument("--log", default="orders-decisions.log", help="the decision log")
    ap.add_argument("--customer", default="alice")
    ap.add_argument("--fail", action="store_true", help="fail after both writes: roll back")
    args = ap.parse_args(argv)

    engine = sa.create_engine(args.db)
    ORDERS.metadata.create_all(engine)
    with Producer(args.server) as producer:
        producer.partitions(args.topic)  # publish: the XA resource picks a broker serving it
        try:
            with Coordinator("orders-example", args.log, producer, engine) as coordinator:
                report = coordinator.last_recovery
                if report is not None and (report.committed or report.rolled_back):
                    print(f"recovered: {report}")
                with coordinator.transaction() as gtx:
                    next_id = gtx.connection.execute(
                        sa.select(sa.func.coalesce(sa.func.max(ORDERS.c.id), 0) + 1)
                    ).scalar_one()
                    gtx.connection.execute(
                        ORDERS.insert().values(id=next_id, customer=args.customer)
                    )
                    sent = producer.send(args.topic, f"order {next_id} created".encode())
                    if not sent.success:
                        raise RuntimeError(f"send failed: {sent.error}")
                    if args.fail:
                        raise RuntimeError("failing on purpose (--fail)")
                print(f"order {next_id}: {gtx.outcome} (message id {sent.msg_id})")
        except RuntimeError as e:
            print(f"rolled back: {e}")
        except TransactionError as e:
            print(f"pymetaq: {e}", file=sys.stderr)
            return 1
    with engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(ORDERS)).scalar_one()
    print(f"orders in the database: {count}")
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
