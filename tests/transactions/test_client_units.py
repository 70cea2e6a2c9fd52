"""Pure pieces of the client's transactions: XA error parsing, xids and keys, qualifiers, the
broker choice, session ids, and what importing them loads."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from pymetaq.client.errors import MetaClientError
from pymetaq.client.transaction import TransactionRolledBack, XAError, Xid
from pymetaq.client.transaction.errors import (
    XAER_NOTA,
    XAER_PROTO,
    XAER_RMERR,
    XAER_RMFAIL,
    xa_error_from_body,
)
from pymetaq.client.transaction.wire import new_session_id
from pymetaq.client.transaction.xa import check_qualifier, default_qualifier, pick_broker


def test_xa_errors_parse_as_metaqs_java_client() -> None:
    e = xa_error_from_body(b"XAException:code=-4,msg=XA transaction 'k' has not been started.")
    assert (e.code, e.name, e.message) == (
        XAER_NOTA,
        "XAER_NOTA",
        "XA transaction 'k' has not been started.",
    )
    assert str(e) == "XAER_NOTA (-4): XA transaction 'k' has not been started."
    multi = xa_error_from_body("XAException:code=-6,msg=a\r\nb")
    assert (multi.code, multi.message) == (XAER_PROTO, "a\r\nb")
    plain = xa_error_from_body(b"Local transaction 'TX:s:1' has not been started.")
    assert plain.code == XAER_RMERR  # MetaQ's throwRMFailException
    assert xa_error_from_body(b"XAException:garbage").code == XAER_RMERR
    assert isinstance(e, MetaClientError) and not e.retriable
    assert XAError(XAER_RMFAIL).retriable and XAError(XAER_PROTO).retriable
    assert TransactionRolledBack("x").retriable


def test_xid_keys() -> None:
    xid = Xid(0x1234, b"gtrid", b"bq")
    assert xid.key("XAMessageProducer-host1") == "XID:4660:6774726964:6271:XAMessageProducer-host1"
    assert Xid.from_key("XID:4660:6774726964:6271:q") == (xid, "q")
    assert Xid.from_key("XID:1:AABB::q")[0] == Xid(1, b"\xaa\xbb", b"")
    for bad in ("TX:s:1", "null", "XID:1:zz:00:q"):
        with pytest.raises(ValueError):
            Xid.from_key(bad)
    with pytest.raises(ValueError, match="at most 64"):
        Xid(1, b"x" * 65, b"")
    with pytest.raises(ValueError, match="32-bit"):
        Xid(1 << 31, b"", b"")


def test_qualifiers_follow_metaqs_rule() -> None:
    assert default_qualifier().startswith("XAMessageProducer-")
    assert check_qualifier("billing-1") == "billing-1"
    for bad in ("", "  ", "a:b", "a b", "a\nb", "a\tb"):
        with pytest.raises(ValueError, match="invalid unique qualifier"):
            check_qualifier(bad)


def test_the_broker_serves_every_topic() -> None:
    rng = random.Random(1)
    chosen = {pick_broker([{0, 1, 2}, {1, 2}], [0, 1, 2, 3], rng)[0] for _ in range(50)}
    assert chosen == {1, 2}
    assert pick_broker([], [3, 1], rng)[1] == [1, 3]  # no topic: every known broker
    with pytest.raises(XAError, match="no broker serves every published topic"):
        pick_broker([{0}, {1}], [0, 1], rng)


def test_session_ids_are_tokens() -> None:
    a, b = new_session_id(), new_session_id()
    assert a != b
    for sid in (a, b):
        _ip, ms, n = sid.split("-")
        assert ":" not in sid and " " not in sid and ms.isdigit() and n.isdigit()


def _loaded(statement: str) -> list[str]:
    code = (
        f"import json, sys\n{statement}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pymetaq', 'sqlalchemy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_a_producer_that_does_not_use_transactions_does_not_load_them() -> None:
    loaded = _loaded("from pymetaq.client import Producer")
    assert not [m for m in loaded if "transaction" in m]


def test_the_transaction_package_loads_sqlalchemy_only_for_the_coordinator() -> None:
    loaded = _loaded("from pymetaq.client.transaction import Xid, XAError, TransactionRolledBack")
    assert not [m for m in loaded if m.startswith("sqlalchemy")]
    assert "pymetaq.client.transaction.coordinator" not in loaded
