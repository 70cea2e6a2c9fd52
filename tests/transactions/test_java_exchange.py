"""Replays of MetaQ 1.4's Java client in transactions, byte for byte, against a real broker.

The request bytes are what the Java code writes (``TransactionContext``, ``TransactionCommand
.encode``, ``PutCommand.encode``, ``SimpleMessageProducer.send0``, ``SimpleXAMessageProducer``):

- the session id is ``IdGenerator.generateId()``: ``<local ip>-<startMs>-<n>``; local
  transaction numbers come from a ``LongSequenceGenerator`` (first is 1);
- a local BEGIN is sent lazily before the first message, with the producer's
  ``transactionTimeout`` (default 0: no timeout token) and no qualifier; COMMIT_ONE_PHASE /
  ROLLBACK likewise;
- an XA context carries the qualifier ``XAMessageProducer-<hostname>``: BEGIN has
  ``[<timeout>] <qualifier>``, every other command ``<qualifier>``; RECOVER's key is ``null``;
  END is sent with ``sendToGroup`` and no reply is awaited;
- a put inside a transaction is the 8-token form with ``CheckSum.crc32(data)``.

Every reply byte is asserted; the message id in a put reply is unknowable in advance, so it
is read from the reply and then asserted to be the id the message carries in the log.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import Record
from tests._broker import BrokerProcess
from tests.transactions._txwire import Wire, log_when, read_log, result

pytestmark = pytest.mark.integration

SID = "192.168.1.10-1386000000000-1"
Q = "XAMessageProducer-host1"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    topics = {f"java-{i}": {} for i in range(8)}
    with BrokerProcess.start(tmp_path_factory.mktemp("javatx"), topics=topics) as b:
        yield b


def java_put(topic: str, data: bytes, key: str, opaque: int, flag: int = 0) -> bytes:
    # PutCommand.encode: put topic partition len flag checksum txKey opaque \r\n data
    return f"put {topic} 0 {len(data)} {flag} {checksum(data)} {key} {opaque}\r\n".encode() + data


def send_put(w: Wire, topic: str, data: bytes, key: str, opaque: int, flag: int = 0) -> int:
    w.send(java_put(topic, data, key, opaque, flag))
    head = w.read_exact(len(b"result 200 "))
    assert head == b"result 200 "
    rest = b""
    while not rest.endswith(b"\r\n"):
        rest += w.read_exact(1)
    length, op = (int(x) for x in rest[:-2].split(b" "))
    body = w.read_exact(length)
    msg_id = int(body.split(b" ")[0])
    assert op == opaque and body == b"%d 0 -1" % msg_id  # "<msgId> <partition> -1"
    return msg_id


def attribute_data(attribute: str, payload: bytes) -> bytes:
    raw = attribute.encode()
    return struct.pack(">i", len(raw)) + raw + payload  # MessageUtils with an attribute, flag 1


def stored(address: tuple[str, int], topic: str, count: int = 0) -> list[tuple[int, int, bytes]]:
    """(msg id, flag, data) of the topic's records, once there are at least ``count``."""
    records: list[Record] = (
        log_when(address, topic, 0, count) if count else read_log(address, topic, 0)
    )
    return [(r.msg_id, r.flag, r.data) for r in records]


def test_local_transaction_commit(broker: BrokerProcess) -> None:
    key = f"TX:{SID}:1"
    with Wire(broker.address) as w:
        w.exact(f"transaction {key} {SID} BEGIN 1\r\n".encode(), result(200, b"", 1))
        a = send_put(w, "java-0", b"order-1", key, 2)
        with_attr = attribute_data("tag", b"order-2")
        b = send_put(w, "java-0", with_attr, key, 3, flag=1)
        assert stored(broker.address, "java-0") == []
        w.exact(f"transaction {key} {SID} COMMIT_ONE_PHASE 4\r\n".encode(), result(200, b"", 4))
    assert stored(broker.address, "java-0", 2) == [(a, 0, b"order-1"), (b, 1, with_attr)]


def test_local_transaction_with_timeout_rolled_back(broker: BrokerProcess) -> None:
    key = f"TX:{SID}:2"
    with Wire(broker.address) as w:
        w.exact(f"transaction {key} {SID} BEGIN 30 5\r\n".encode(), result(200, b"", 5))
        send_put(w, "java-1", b"cancelled", key, 6)
        w.exact(f"transaction {key} {SID} ROLLBACK 7\r\n".encode(), result(200, b"", 7))
    assert stored(broker.address, "java-1") == []


def test_xa_branch_two_phase(broker: BrokerProcess) -> None:
    xid = f"XID:1:0a0b0c:01:{Q}"
    with Wire(broker.address) as w:
        w.exact(f"transaction {xid} {SID} BEGIN {Q} 8\r\n".encode(), result(200, b"", 8))
        a = send_put(w, "java-2", b"xa-1", xid, 9)
        b = send_put(w, "java-2", b"xa-2", xid, 10)
        w.send(f"transaction {xid} {SID} END {Q} 11\r\n".encode())  # no reply
        w.exact(f"transaction {xid} {SID} PREPARE {Q} 12\r\n".encode(), result(200, b"0", 12))
        assert stored(broker.address, "java-2") == []
        w.exact(
            f"transaction {xid} {SID} COMMIT_TWO_PHASE {Q} 13\r\n".encode(), result(200, b"", 13)
        )
    assert stored(broker.address, "java-2", 2) == [(a, 0, b"xa-1"), (b, 0, b"xa-2")]


def test_xa_recovery_by_another_session(broker: BrokerProcess) -> None:
    xid = f"XID:4660:6774726964:6271:{Q}"  # formatId 0x1234, gtrid b"gtrid", bqual b"bq"
    with Wire(broker.address) as w:
        w.exact(f"transaction {xid} {SID} BEGIN 60 {Q} 14\r\n".encode(), result(200, b"", 14))
        a = send_put(w, "java-3", b"in-doubt", xid, 15)
        w.send(f"transaction {xid} {SID} END {Q} 16\r\n".encode())
        w.exact(f"transaction {xid} {SID} PREPARE {Q} 17\r\n".encode(), result(200, b"0", 17))
    sid2 = "192.168.1.11-1386000000500-1"  # the transaction manager restarted elsewhere
    with Wire(broker.address) as w:
        w.exact(f"transaction null {sid2} RECOVER {Q} 1\r\n".encode(), result(200, xid.encode(), 1))
        w.exact(
            f"transaction {xid} {sid2} COMMIT_TWO_PHASE {Q} 2\r\n".encode(), result(200, b"", 2)
        )
        w.exact(f"transaction null {sid2} RECOVER {Q} 3\r\n".encode(), result(200, b"", 3))
    assert stored(broker.address, "java-3", 1) == [(a, 0, b"in-doubt")]


def test_xa_one_phase_rollback_readonly_forget(broker: BrokerProcess) -> None:
    one, rb, ro = (f"XID:1:{g}:00:{Q}" for g in ("aa01", "aa02", "aa03"))
    with Wire(broker.address) as w:
        w.exact(f"transaction {one} {SID} BEGIN {Q} 20\r\n".encode(), result(200, b"", 20))
        a = send_put(w, "java-4", b"one-phase", one, 21)
        w.send(f"transaction {one} {SID} END {Q} 22\r\n".encode())
        w.exact(
            f"transaction {one} {SID} COMMIT_ONE_PHASE {Q} 23\r\n".encode(), result(200, b"", 23)
        )
        w.exact(f"transaction {rb} {SID} BEGIN {Q} 24\r\n".encode(), result(200, b"", 24))
        send_put(w, "java-4", b"rolled-back", rb, 25)
        w.send(f"transaction {rb} {SID} END {Q} 26\r\n".encode())
        w.exact(f"transaction {rb} {SID} ROLLBACK {Q} 27\r\n".encode(), result(200, b"", 27))
        w.exact(f"transaction {ro} {SID} BEGIN {Q} 28\r\n".encode(), result(200, b"", 28))
        w.send(f"transaction {ro} {SID} END {Q} 29\r\n".encode())
        w.exact(f"transaction {ro} {SID} PREPARE {Q} 30\r\n".encode(), result(200, b"3", 30))
        w.exact(f"transaction {ro} {SID} FORGET {Q} 31\r\n".encode(), result(200, b"", 31))
    assert stored(broker.address, "java-4", 1) == [(a, 0, b"one-phase")]


def test_xa_errors_parse_as_the_java_client_expects(broker: BrokerProcess) -> None:
    xid = f"XID:1:bb:cc:{Q}"
    with Wire(broker.address) as w:
        expected = f"XAException:code=-4,msg=XA transaction '{xid}' has not been started."
        w.exact(
            f"transaction {xid} {SID} PREPARE {Q} 40\r\n".encode(),
            result(500, expected.encode(), 40),
        )
