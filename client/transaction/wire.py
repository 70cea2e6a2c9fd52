"""The transaction commands as MetaQ's Java client writes them, and their replies read back.

* :func:`new_session_id` — MetaQ's ``IdGenerator``: ``<ip>-<startMs>-<n>`` (no ``:``, no
  whitespace: the id is a token of the wire line and part of ``TX:<sid>:<n>``).
* :func:`tx_put` — the 8-token ``put <topic> <partition> <len> <flag> <checksum> <txKey>
  <opaque>`` (``SimpleMessageProducer.send0``: the checksum is always sent);
  :func:`put_msg_id` reads its reply ``"<msgId> <partition> -1"``.
* :func:`tx_bput` — pymetaq's transactional ``bput`` (8 tokens: ``... <checksum> <txKey>
  <opaque>``), several messages of one transaction and partition in one request, which
  pymetaq's producer sends; :func:`bput_first_id` reads its reply
  ``"<firstMsgId> <partition> -1 <count>"``.
* :func:`xa_request` — one XA command; a failure is an :class:`XAError` exactly as
  ``TransactionContext.syncSendXATxCommand`` makes it: the broker's
  ``XAException:code=<n>,msg=<text>``, XAER_RMERR for any other error reply, XAER_RMFAIL when
  the broker could not be asked or did not answer (MetaQ answers a timeout with XA_RBTIMEOUT,
  which claims a rollback nobody knows happened; pymetaq says "resource failed, retry").
* :func:`local_request` — BEGIN / COMMIT_ONE_PHASE / ROLLBACK of a local transaction; the
  caller maps its failures (the reply, or the transport error) to the outcome.

Thread-safety: pure functions and coroutines for the connection's loop.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Sequence

from pymetaq.client.errors import MetaClientError, error_for_reply
from pymetaq.client.protocol import (
    BatchPutCommand,
    PutCommand,
    ResultReply,
    TransactionCommand,
    TransactionType,
)
from pymetaq.client.transaction.errors import XAER_RMFAIL, XAError, xa_error_from_body
from pymetaq.client.transport.connection import BrokerConnection
from pymetaq.storage.checksum import checksum
from pymetaq.storage.record import encode_record

#: MetaQ's ``transactionRequestTimeoutInMills`` default: 5 s for every transaction command
DEFAULT_TX_REQUEST_TIMEOUT_S = 5.0

_session_counter = itertools.count(1)
_START_MS = int(time.time() * 1000)


def _local_ip() -> str:
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    return "".join(c for c in ip if c not in ": \t\r\n") or "127.0.0.1"


_IP = _local_ip()


def new_session_id() -> str:
    """``<ip>-<startMs>-<n>``: unique per process start and call (MetaQ's ``IdGenerator``)."""
    return f"{_IP}-{_START_MS}-{next(_session_counter)}"


def tx_command(
    key: str,
    session_id: str,
    kind: TransactionType,
    *,
    timeout_s: int | None = None,
    qualifier: str | None = None,
) -> TransactionCommand:
    return TransactionCommand(key, session_id, kind, timeout_s, qualifier)


def tx_put(topic: str, partition: int, data: bytes, flag: int, key: str) -> PutCommand:
    """A transactional put (the 8-token form, with the data's checksum)."""
    return PutCommand(topic, partition, data, flag, checksum(data), key)


def tx_bput(
    topic: str, partition: int, records: Sequence[tuple[bytes, int]], key: str
) -> BatchPutCommand:
    """A transactional ``bput`` (8 tokens, pymetaq): ``records`` = (data, flag) in order."""
    body = b"".join([encode_record(data, flag) for data, flag in records])
    return BatchPutCommand(topic, partition, body, len(records), checksum(body), 0, tx_key=key)


def bput_first_id(reply: ResultReply, count: int) -> int:
    """The first message id of a transactional ``bput``'s reply
    (``"<firstMsgId> <partition> -1 <count>"``), or the reply's error (raised)."""
    if reply.code != 200:
        raise error_for_reply(reply.code, reply.body)
    fields = bytes(reply.body).split(b" ")
    try:
        first, stored = int(fields[0]), int(fields[3])
    except (ValueError, IndexError):
        raise error_for_reply(500, b"unexpected bput reply: " + bytes(reply.body[:80])) from None
    if stored != count:
        raise error_for_reply(500, b"bput reply counts %d records, %d were sent" % (stored, count))
    return first


def put_msg_id(reply: ResultReply) -> int:
    """The message id of a transactional put's reply, or the reply's error (raised)."""
    if reply.code != 200:
        raise error_for_reply(reply.code, reply.body)
    head = reply.body.split(b" ", 1)[0]
    try:
        return int(head)
    except ValueError:
        raise error_for_reply(500, b"unexpected put reply: " + bytes(reply.body[:80])) from None


async def xa_request(conn: BrokerConnection, cmd: TransactionCommand, timeout_s: float) -> bytes:
    """Send an XA command and return the reply body; raises :class:`XAError`."""
    try:
        reply = await conn.request(cmd, timeout_s)
    except MetaClientError as e:  # timeout, lost connection: the resource is not answering
        raise XAError(XAER_RMFAIL, f"{cmd.type.value} on {conn.address}: {e}") from e
    if not isinstance(reply, ResultReply):
        raise XAError(XAER_RMFAIL, f"{cmd.type.value} on {conn.address}: unexpected reply")
    if reply.code != 200:
        raise xa_error_from_body(reply.body)
    return bytes(reply.body)


async def local_request(
    conn: BrokerConnection, cmd: TransactionCommand, timeout_s: float
) -> ResultReply:
    """Send a local-transaction command; the reply as it came (transport errors raise)."""
    reply = await conn.request(cmd, timeout_s)
    assert isinstance(reply, ResultReply), reply
    return reply
