"""The wire codec's values: one frozen dataclass per request and reply, the codes, the limits.

Every field holds exactly what the wire carries (no defaults are invented by the parser except
the ones MetaQ itself applies: bare ``stats``/``version`` => opaque ``2147483647``, put/sync
checksum ``-1`` => ``None``).  Byte fields (``data``, ``body``) are fresh objects owned by the
receiver; ``BatchPutCommand.body`` is a ``bytearray`` so the broker can stamp ids in place.

Thread-safety: immutable values (a ``bytearray`` body is mutable; whoever owns the event owns it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, TypeAlias

#: MetaQ's "no opaque given" value (``Integer.MAX_VALUE``): bare ``stats`` / ``version``.
MAX_OPAQUE: Final = 2147483647
INT32_MIN: Final = -(1 << 31)
INT32_MAX: Final = (1 << 31) - 1
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1

#: MetaQ's default ``maxTransferSize`` (server.ini): the most a ``get`` reply carries.
DEFAULT_MAX_TRANSFER_SIZE: Final = 1 << 20
#: an idempotent producer's id on the wire: a UUID as 32 lowercase hex digits
PRODUCER_ID_RE: Final = r"[0-9a-f]{32}"
#: Room above a transfer size for a put body's own slack (attribute, header) - see Limits.
BODY_SLACK: Final = 4096


class HttpStatus(enum.IntEnum):
    """MetaQ's reply codes (``com.taobao.metamorphosis.network.HttpStatus``)."""

    SUCCESS = 200
    MOVED = 301  # get: body = the offset to fetch from instead
    BAD_REQUEST = 400
    UNAUTHORIZED = 401  # defined by MetaQ, never sent
    FORBIDDEN = 403
    NOT_FOUND = 404
    INTERNAL_SERVER_ERROR = 500
    SERVICE_UNAVAILABLE = 503
    GATEWAY_TIMEOUT = 504


class Role(enum.Enum):
    """Which side a :class:`~pymetaq.client.protocol.Parser` is on."""

    SERVER = "server"  # parses requests
    CLIENT = "client"  # parses replies (result, value)


class PutForm(enum.Enum):
    """Which put line a client sent (so the broker can answer a legacy client as MetaQ does).

    | form     | tokens without tx key | with tx key | checksum slot          |
    |----------|-----------------------|-------------|------------------------|
    | CHECKSUM | 7                     | 8           | yes (``-1`` = none)    |
    | LEGACY   | 6 (pre-1.4.4, Python) | 7           | no                     |
    """

    CHECKSUM = "checksum"
    LEGACY = "legacy"


class TransactionType(enum.Enum):
    """``TransactionInfo.TransactionType``; the wire token is the member name."""

    BEGIN = "BEGIN"
    PREPARE = "PREPARE"
    COMMIT_ONE_PHASE = "COMMIT_ONE_PHASE"
    COMMIT_TWO_PHASE = "COMMIT_TWO_PHASE"
    ROLLBACK = "ROLLBACK"
    RECOVER = "RECOVER"
    FORGET = "FORGET"
    END = "END"


@dataclass(frozen=True, slots=True)
class Limits:
    """Named bounds the parser enforces: a line over ``max_line`` is a *fatal* ProtocolError; a
    body over its limit is discarded unbuffered and reported non-fatally (the framing is intact).

    ``max_line``: bytes in a command line, CRLF excluded.  ``max_body``: body of ``put``,
    ``sync``, ``result`` and ``value`` - default MetaQ's 1 MiB ``maxTransferSize`` plus
    :data:`BODY_SLACK`, so a full-size ``get`` reply fits; a broker passes
    :meth:`for_transfer_size` of its own setting.  ``max_batch_body``: body of ``bput`` and ``bsync``.
    """

    max_line: int = 4096
    max_body: int = DEFAULT_MAX_TRANSFER_SIZE + BODY_SLACK
    max_batch_body: int = 16 << 20

    def __post_init__(self) -> None:
        if self.max_line < 1 or self.max_body < 0 or self.max_batch_body < 0:
            raise ValueError(f"invalid limits {self}: max_line >= 1, bodies >= 0")

    @classmethod
    def for_transfer_size(cls, max_transfer_size: int, max_batch_body: int = 16 << 20) -> Limits:
        """The limits of a broker (or its clients) whose ``maxTransferSize`` is given."""
        return cls(max_body=max_transfer_size + BODY_SLACK, max_batch_body=max_batch_body)


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class PutCommand:
    """``put <topic> <partition> <len> <flag> [<checksum>] [<txKey>] <opaque>\\r\\n<data>``.

    ``data`` is a record's data section (attribute + payload); partition ``-1`` = broker picks;
    ``checksum`` ``None`` = not supplied (``-1`` on the wire, or no slot in the LEGACY form).
    """

    topic: str
    partition: int
    data: bytes
    flag: int = 0
    checksum: int | None = None
    tx_key: str | None = None
    opaque: int = 0
    form: PutForm = PutForm.CHECKSUM

    @property
    def token_count(self) -> int:
        base = 7 if self.form is PutForm.CHECKSUM else 6
        return base + (self.tx_key is not None)


@dataclass(frozen=True, slots=True)
class BatchPutCommand:
    """pymetaq ``bput <topic> <partition> <len> <count> <checksum> [<producerId> <sequence> |
    <txKey>] <opaque>\\r\\n<body>``.

    ``body`` = ``count`` complete records (ids 0); ``checksum`` = CRC32(body) & 0x7FFFFFFF or
    ``None`` (``-1``).  The parser hands out a fresh ``bytearray`` (one copy off the wire).
    The 9-token idempotent form adds ``producer_id`` (32 lowercase hex digits, a UUID) and
    ``sequence`` (the batch's number for this producer and partition, 0 .. INT32_MAX, then 0
    again); both are ``None`` in the 7-token form.  The 8-token transactional form adds
    ``tx_key`` (the ``<txKey>`` of a transactional ``put``; ``null`` parses as ``None``): the
    records go into that transaction, as that many transactional puts would.
    """

    topic: str
    partition: int
    body: bytes | bytearray
    count: int
    checksum: int | None = None
    opaque: int = 0
    producer_id: str | None = None
    sequence: int | None = None
    tx_key: str | None = None


@dataclass(frozen=True, slots=True)
class GetCommand:
    """``get <topic> <group> <partition> <offset> <maxSize> [<maxWaitMs>] <opaque>``.

    ``max_wait_ms`` is pymetaq's 8-token long-poll form; ``None`` = MetaQ's 7-token get.
    """

    topic: str
    group: str
    partition: int
    offset: int
    max_size: int
    opaque: int = 0
    max_wait_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommand:
    """``offset <topic> <group> <partition> <offset> <opaque>``."""

    topic: str
    group: str
    partition: int
    offset: int
    opaque: int = 0


@dataclass(frozen=True, slots=True)
class StatsCommand:
    """``stats <item> <opaque>``; ``item`` ``""`` = the general stats (``stats  <opaque>``)."""

    item: str = ""
    opaque: int = MAX_OPAQUE


@dataclass(frozen=True, slots=True)
class VersionCommand:
    """``version <opaque>`` - also MetaQ's heartbeat."""

    opaque: int = MAX_OPAQUE


@dataclass(frozen=True, slots=True)
class QuitCommand:
    """``quit`` - the server closes the connection without a reply."""


@dataclass(frozen=True, slots=True)
class TransactionCommand:
    """``transaction <txKey> <sessionId> <type> [<timeoutS>] [<uniqueQualifier>] <opaque>``."""

    tx_key: str
    session_id: str
    type: TransactionType
    timeout_s: int | None = None
    unique_qualifier: str | None = None
    opaque: int = 0


class TxAdminOp(enum.Enum):
    """pymetaq ``txadmin`` operations on a prepared XA branch (an operator's decision)."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    FORGET = "forget"


@dataclass(frozen=True, slots=True)
class TxAdminCommand:
    """pymetaq ``txadmin <op> <txKey> <opaque>``: heuristic commit/rollback of a prepared XA
    branch, or forget of a heuristic decision (the broker accepts it from loopback peers)."""

    op: TxAdminOp
    tx_key: str
    opaque: int = 0


@dataclass(frozen=True, slots=True)
class SyncCommand:
    """``sync <topic> <partition> <len> <flag> <msgId> [<checksum>] <opaque>\\r\\n<data>``.

    Master to slave.  ``checksum`` ``None`` = not supplied (``-1``, or a pre-1.4.4 master's
    7-token line); the encoder always writes the 8-token form.
    """

    topic: str
    partition: int
    data: bytes
    flag: int
    msg_id: int
    checksum: int | None = None
    opaque: int = 0


@dataclass(frozen=True, slots=True)
class BatchSyncCommand:
    """pymetaq ``bsync <topic> <partition> <len> <count> <checksum> [<offset>] [<producerId>
    <sequence>] <opaque>\\r\\n<body>``.

    Master to slave: ``body`` = ``count`` complete records exactly as the master stored them
    (its ids and flags); ``checksum`` = CRC32(body) & 0x7FFFFFFF or ``None`` (``-1``).  The
    parser hands out a fresh ``bytearray``.  ``offset`` (the 8- and 10-token forms): where the
    batch starts on the master; the slave stores it only if its log ends exactly there (a
    replica kept offset for offset: a rejoined master, pymetaq.ha.rejoin).  ``producer_id`` and
    ``sequence`` (the 9- and 10-token forms): the batch was an idempotent ``bput`` of that
    producer; the slave records it in the partition's ``producers.idem`` as the master did.
    """

    topic: str
    partition: int
    body: bytes | bytearray
    count: int
    checksum: int | None = None
    opaque: int = 0
    offset: int | None = None
    producer_id: str | None = None
    sequence: int | None = None


#: the most entries one ``producers`` reply holds (48 bytes each: 192 KiB)
PRODUCERS_MAX_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class ProducersCommand:
    """pymetaq ``producers <topic> <group> <partition> <after> <upto> <opaque>``.

    An asynchronous slave asks its master for the idempotent producers' entries (the
    ``producers.idem`` file's 48-byte entries, :mod:`pymetaq.storage.producers`) of the batches
    that end in ``(after, upto]``, the range of the log it copied; the reply body is those
    entries, oldest first, at most :data:`PRODUCERS_MAX_ENTRIES` (a full reply: ask again
    after the last one's end).  ``group``: the slave's group (the right checked is a ``get``'s).
    """

    topic: str
    group: str
    partition: int
    after: int
    upto: int
    opaque: int = 0


@dataclass(frozen=True, slots=True)
class AdminCommand:
    """``admin <action> [<arg>...] <opaque>`` - pymetaq's operations extension (close/open a
    partition, reload the config, slave status; see docs/protocol.md).  1 to 5 args."""

    action: str
    args: tuple[str, ...] = ()
    opaque: int = 0


@dataclass(frozen=True, slots=True)
class AuthCommand:
    """``auth <mechanism> <len> <opaque>\\r\\n<body>`` - pymetaq's authentication extension
    (docs/security.md), sent once per connection before anything else.  ``PLAIN`` (RFC 4616):
    body ``<authzid>\\0<user>\\0<password>`` (authzid empty)."""

    mechanism: str
    body: bytes
    opaque: int = 0


# --------------------------------------------------------------------------- replies


@dataclass(frozen=True, slots=True)
class ResultReply:
    """``result <code> <len> <opaque>\\r\\n<body>`` (no body when len is 0)."""

    code: int
    body: bytes = b""
    opaque: int = 0


@dataclass(frozen=True, slots=True)
class ValueReply:
    """``value <len> <opaque>\\r\\n<data>`` - a successful get: a slice of a partition log."""

    data: bytes
    opaque: int = 0


Command: TypeAlias = (
    PutCommand
    | BatchPutCommand
    | GetCommand
    | OffsetCommand
    | StatsCommand
    | VersionCommand
    | QuitCommand
    | TransactionCommand
    | TxAdminCommand
    | SyncCommand
    | BatchSyncCommand
    | ProducersCommand
    | AdminCommand
    | AuthCommand
)
Reply: TypeAlias = ResultReply | ValueReply
Event: TypeAlias = Command | Reply


def error_reply(reason: str, opaque: int | None) -> ResultReply:
    """The ``result 400`` a server sends for a non-fatal protocol error (opaque 0 if unknown)."""
    return ResultReply(
        HttpStatus.BAD_REQUEST, reason.encode("utf-8"), 0 if opaque is None else opaque
    )
