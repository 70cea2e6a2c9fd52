"""Replays of MetaQ's own clients against a broker subprocess.

- The Python producer (``contrib/python/meta-python/metaq/producer.py``, pip ``metaq``): the
  6-token ``put %s %d %d %d %d\\r\\n%s`` (no checksum; opaques start at -2147483647, a Java int
  counter), the reply read with ``readline()`` + ``split(" ")`` into 4 parts and the body split
  into ``msgId, _, offset``; the ``version`` heartbeat on an idle connection.
- The Java client (1.4.4+): 7-token put with checksum, ``get`` → ``value`` whose bytes its
  ``MessageIterator`` walks (header, CRC check, attribute by flag), ``301`` → refetch from the
  offset in the body, ``offset`` to resolve a start position.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Iterator

import pytest

from pymetaq.storage.record import HEADER
from tests._broker import BrokerProcess

pytestmark = pytest.mark.integration

TOPICS = {"py-topic": {"numPartitions": 2}, "java-topic": {}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess.start(tmp_path_factory.mktemp("compat"), topics=TOPICS) as b:
        yield b


class MetaPythonConn:
    """The wire logic of metaq's Python ``Conn`` + ``MessageProducer.send``, ported to py3."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.socket = socket.socket()
        self.socket.setsockopt(socket.SOL_TCP, socket.TCP_NODELAY, 1)
        self.socket.settimeout(10)
        self.socket.connect(address)
        self.fd = self.socket.makefile("rb")
        self.opaque = -2147483648  # JavaInt._MIN; increase_and_get() before each send

    def encode(self, topic: str, partition: int, data: bytes, attribute: bytes | None) -> bytes:
        flag = 0
        payload = data
        if attribute is not None:
            payload = struct.pack(">i", len(attribute)) + attribute + data
            flag = 0 & 0xFFFFFFFE | 1
        self.opaque += 1
        head = b"put %s %d %d %d %d\r\n" % (
            topic.encode(),
            partition,
            len(payload),
            flag,
            self.opaque,
        )
        return head + payload

    def send(
        self, topic: str, partition: int, data: bytes, attribute: bytes | None = None
    ) -> tuple[bool, int, int, bytes]:
        self.socket.sendall(self.encode(topic, partition, data, attribute))
        return self.read_reply(self.opaque)

    def read_reply(self, opaque: int) -> tuple[bool, int, int, bytes]:
        head = self.fd.readline().decode()
        _, status, bodylen, resp_opaque = head.split(" ")
        body = self.fd.read(int(bodylen))
        assert len(body) == int(bodylen)
        assert int(resp_opaque) == opaque
        if int(status) == 200:
            msg_id, _, offset = body.split(b" ")
            return True, int(msg_id), int(offset), body
        return False, -1, -1, body

    def heartbeat(self) -> bytes:
        self.opaque += 1
        self.socket.sendall(b"version %d\r\n" % self.opaque)
        ok, *_rest, body = self.read_reply_raw(self.opaque)
        assert ok
        return body

    def read_reply_raw(self, opaque: int) -> tuple[bool, bytes]:
        head = self.fd.readline().decode()
        _, status, bodylen, resp_opaque = head.split(" ")
        body = self.fd.read(int(bodylen))
        assert int(resp_opaque) == opaque
        return int(status) == 200, body

    def close(self) -> None:
        self.fd.close()
        self.socket.close()


def java_iterate(data: bytes) -> list[tuple[int, int, bytes | None, bytes]]:
    """MetaQ's MessageIterator: (msgId, flag, attribute, payload); stops at a partial record."""
    out = []
    pos = 0
    while pos + 20 <= len(data):
        length, crc, msg_id, flag = HEADER.unpack_from(data, pos)
        if pos + 20 + length > len(data):
            break
        body = data[pos + 20 : pos + 20 + length]
        assert zlib.crc32(body) & 0x7FFFFFFF == crc, "CheckSum failed"
        attribute = None
        if flag & 1:
            (alen,) = struct.unpack_from(">i", body, 0)
            attribute, body = body[4 : 4 + alen], body[4 + alen :]
        out.append((msg_id, flag, attribute, body))
        pos += 20 + length
    return out


def test_python_producer_exchange(broker: BrokerProcess) -> None:
    conn = MetaPythonConn(broker.address)
    try:
        sent = []
        for i in range(10):
            attribute = b"attr%d" % i if i % 2 else None
            ok, msg_id, offset, _body = conn.send("py-topic", i % 2, b"message %d" % i, attribute)
            assert ok
            sent.append((i % 2, msg_id, offset, attribute, b"message %d" % i))
        assert conn.opaque == -2147483648 + 10  # negative opaques echoed back exactly
        assert conn.heartbeat().startswith(b"pymetaq")
        ok, _, _, body = conn.send("no-such-topic", 0, b"x")
        assert not ok and body == b"The topic `no-such-topic` is not in topics list of the broker"
    finally:
        conn.close()
    # what the Python producer wrote is what a Java consumer reads
    java = JavaConsumer(broker.address)
    try:
        for partition in (0, 1):
            expected = [(m, a, d) for p, m, _o, a, d in sent if p == partition]
            got = java.fetch_all("py-topic", partition, 0)
            assert [(m, a, d) for m, _f, a, d in got] == expected
    finally:
        java.close()
    offsets = [o for p, _m, o, _a, _d in sent if p == 0]
    assert offsets[0] == 0 and offsets == sorted(offsets)


class JavaConsumer:
    """The request/reply pattern of MetaQ's Java producer and SimpleFetchManager."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.fd = self.sock.makefile("rb")
        self.opaque = 0

    def request(self, line: bytes, body: bytes = b"") -> tuple[str, int, bytes]:
        self.opaque += 1
        self.sock.sendall(line % self.opaque + body)
        head = self.fd.readline().decode().rstrip("\r\n").split(" ")
        if head[0] == "value":
            assert int(head[2]) == self.opaque
            return "value", 200, self.fd.read(int(head[1]))
        assert head[0] == "result" and int(head[3]) == self.opaque
        return "result", int(head[1]), self.fd.read(int(head[2]))

    def close(self) -> None:
        self.fd.close()
        self.sock.close()

    def put(self, topic: str, partition: int, data: bytes) -> tuple[int, int, bytes]:
        crc = zlib.crc32(data) & 0x7FFFFFFF
        line = b"put %s %d %d 0 %d %%d\r\n" % (topic.encode(), partition, len(data), crc)
        _kind, code, body = self.request(line, data)
        return code, self.opaque, body

    def fetch_all(
        self, topic: str, partition: int, offset: int, max_size: int = 64
    ) -> list[tuple[int, int, bytes | None, bytes]]:
        """Fetch until 404, growing maxSize for a partial record and following 301 as Java does."""
        out = []
        while True:
            line = b"get %s group %d %d %d %%d\r\n" % (topic.encode(), partition, offset, max_size)
            kind, code, body = self.request(line)
            if kind == "value":
                records = java_iterate(body)
                if not records:
                    max_size *= 2  # MetaQ: increase maxSize when not even one message fits
                    continue
                out += records
                offset += sum(
                    20 + len(d) + (4 + len(a) if a is not None else 0) for _m, _f, a, d in records
                )
            elif code == 301:
                offset = int(body)
            else:
                assert code == 404, (code, body)
                return out


def test_java_client_exchange(broker: BrokerProcess) -> None:
    java = JavaConsumer(broker.address)
    try:
        java_exchange(java)
    finally:
        java.close()


def java_exchange(java: JavaConsumer) -> None:
    payloads = [b"java-%d-" % i + b"z" * (i * 7) for i in range(20)]
    ids = []
    for data in payloads:
        code, _opaque, body = java.put("java-topic", 0, data)
        assert code == 200
        msg_id, partition, _offset = body.split(b" ")
        assert int(partition) == 0
        ids.append(int(msg_id))
    got = java.fetch_all("java-topic", 0, 0)
    assert [d for _m, _f, _a, d in got] == payloads
    assert [m for m, _f, _a, _d in got] == ids
    # 301: a consumer whose offset fell below the log's start is moved to it
    _kind, code, body = java.request(b"get java-topic group 0 -100 1024 %d\r\n")
    assert (code, body) == (301, b"0")
    # offset: resolves an arbitrary position to a segment start
    _kind, code, body = java.request(b"offset java-topic group 0 77 %d\r\n")
    assert (code, body) == (200, b"0")
    # checksum mismatch is refused (500) as MetaQ 1.4.4+ does
    line = b"put java-topic 0 3 0 12345 %d\r\n"
    _kind, code, body = java.request(line, b"abc")
    assert code == 500 and body.startswith(b"Checksum failed")
