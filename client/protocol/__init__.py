"""pymetaq's sans-I/O wire codec: MetaQ 1.4's text protocol plus pymetaq's extensions.

``Parser(role, limits)`` turns fed bytes into request/reply dataclasses (``next_event()``
returns one or :data:`NEED_DATA`); ``encode(obj)`` turns them back into bytes.  See
``docs/protocol.md`` for the protocol itself.  Thread-safety: values and functions are safe to
share; a :class:`Parser` belongs to one connection.
"""

from pymetaq.client.protocol.encoder import (
    encode,
    encode_parts,
    encode_result_header,
    encode_value_header,
)
from pymetaq.client.protocol.errors import (
    CodecError,
    InvalidTxKey,
    LocalProtocolError,
    ProtocolError,
)
from pymetaq.client.protocol.model import (
    BODY_SLACK,
    DEFAULT_MAX_TRANSFER_SIZE,
    MAX_OPAQUE,
    AdminCommand,
    AuthCommand,
    BatchPutCommand,
    Command,
    Event,
    GetCommand,
    HttpStatus,
    Limits,
    OffsetCommand,
    PutCommand,
    PutForm,
    QuitCommand,
    Reply,
    ResultReply,
    Role,
    StatsCommand,
    SyncCommand,
    TransactionCommand,
    TransactionType,
    TxAdminCommand,
    TxAdminOp,
    ValueReply,
    VersionCommand,
    error_reply,
)
from pymetaq.client.protocol.parser import NEED_DATA, NeedData, Parser
from pymetaq.client.protocol.txkey import (
    LocalTxKey,
    TxKey,
    XidKey,
    format_tx_key,
    parse_tx_key,
)

__all__ = [
    "BODY_SLACK",
    "DEFAULT_MAX_TRANSFER_SIZE",
    "MAX_OPAQUE",
    "NEED_DATA",
    "AdminCommand",
    "AuthCommand",
    "BatchPutCommand",
    "CodecError",
    "Command",
    "Event",
    "GetCommand",
    "HttpStatus",
    "InvalidTxKey",
    "Limits",
    "LocalProtocolError",
    "LocalTxKey",
    "NeedData",
    "OffsetCommand",
    "Parser",
    "ProtocolError",
    "PutCommand",
    "PutForm",
    "QuitCommand",
    "Reply",
    "ResultReply",
    "Role",
    "StatsCommand",
    "SyncCommand",
    "TransactionCommand",
    "TransactionType",
    "TxAdminCommand",
    "TxAdminOp",
    "TxKey",
    "ValueReply",
    "VersionCommand",
    "XidKey",
    "encode",
    "encode_parts",
    "encode_result_header",
    "encode_value_header",
    "error_reply",
    "format_tx_key",
    "parse_tx_key",
]
