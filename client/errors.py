"""The client's exception tree, and the one place that maps wire result codes to exceptions.

```
MetaClientError (retriable: bool, invalid_metadata: bool)
├── BrokerError (code, message)          a non-200 ``result`` reply
│   ├── BadRequest             400       malformed request (never retriable)
│   ├── PartitionClosed        403       partition closed by an operator (retriable)
│   ├── AccessDenied           403       ``identity '<name>' may not ...`` (not retriable)
│   ├── AuthenticationFailed   401       ``auth`` refused: bad credentials or locked out
│   ├── NotFound               404       no data / no store at that offset (retriable)
│   ├── OutOfOrderSequence     409       idempotent batch out of sequence (see the producer)
│   ├── BrokerInternalError    500       broker-side failure: wrong partition, unknown topic,
│   │                                    checksum mismatch, I/O error (not retriable)
│   ├── ServiceBusy            503       broker overloaded (retriable)
│   └── BrokerTimeout          504       broker-side timeout (retriable)
├── OffsetOutOfRange (new_offset)  301   the offset moved; fetch from ``new_offset``
├── UnknownTopicOrPartition              no broker serves the topic / partition (not retriable)
├── MessageTooLarge                      a message is bigger than the configured limit
├── CorruptMessage (offset, reason)      a fetched record failed its CRC or framing
│   └── UndecodableRecord (record, flag) CRC-valid but undecodable (bad flag, attribute
│                                        framing, lz4 flag on non-lz4 data): handed to the
│                                        consumer's reject policy, never retried
├── RequestTimeout (m)                   no reply within the timeout (retriable)
├── ConnectionLost (m)                   the connection failed with the request pending (r)
├── MessageMayBeStored (cause)           a send whose bytes were written failed: the broker
│   │                                    MAY have stored it (retriable; a retry can duplicate)
│   ├── MayBeStoredTimeout (m)           ... also a RequestTimeout
│   └── MayBeStoredConnectionLost (m)    ... also a ConnectionLost
├── NoBrokerAvailable (m)                could not connect to any (or the needed) broker (r)
├── ClientClosed                         the producer/consumer was closed (not retriable)
├── ConsumerError                        the consumer's own usage errors (not retriable)
│   ├── NoCommittedOffset (group, tp)    initial position ``none`` and nothing committed
│   ├── NotAssigned (tp)                 a partition this consumer does not own
│   └── InvalidGroupName                 not a group name MetaQ accepts (also a ValueError)
├── SpoolError                           the local spool (recover / ordered producer)
│   ├── SpoolLocked (r)                  another process has the spool directory open
│   ├── SpoolFull (r)                    ``max_entries`` pending already
│   └── SpoolClosed                      the spool was closed
├── OffsetStoreError                     an offset store (``pymetaq.offsets.base``)
│   ├── OffsetStoreUnavailable (r)       its database, ZooKeeper or file cannot be used now
│   └── CorruptOffsetData                what it holds cannot be parsed
├── SerializationError                   a value or key is not bytes and no serializer is
│                                        set, or the (de)serializer raised (also a TypeError)
├── UnknownOption                        a constructor keyword that is no config field
│                                        (also a TypeError; says what was probably meant)
├── InvalidConfig                        a config value that is not allowed (also a ValueError)
└── MissingDependency (extra)            an optional dependency is not installed: names the
                                         pymetaq extra to install (also an ImportError)
```

(r) retriable; (m) ``invalid_metadata``: the client refreshes the topic's partition list in the
background (a broker that cannot be reached drops out of it). Check the attributes, not the
classes: ``if err.retriable: ...``, ``if err.invalid_metadata: ...``.

**May have been stored.** A send is reported failed with :class:`MessageMayBeStored` when some
attempt's request was written to the broker's connection and then got no answer (timeout, lost
connection): the broker may have appended it and lost the reply. Resending it (``retries`` or
the application) is safe for order but can store it twice (at-least-once). A failure that is
*not* a ``MessageMayBeStored`` was never stored.

Use :func:`error_for_reply` to turn a ``(code, body)`` reply into the matching exception.

Thread-safe: plain exception classes and a pure function.
"""

from __future__ import annotations

from typing import Any


class MetaClientError(Exception):
    """Base class of every pymetaq.client error.

    ``retriable``: a retry can help. ``invalid_metadata``: the topic's cached partition list may
    be stale (the client refreshes it in the background).
    """

    retriable: bool = False
    invalid_metadata: bool = False


class BrokerError(MetaClientError):
    """The broker answered with a non-200 result code."""

    code: int = 0

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(
            f"broker replied {code}: {message}" if message else f"broker replied {code}"
        )
        self.code = code
        self.message = message


class BadRequest(BrokerError):
    retriable = False


class PartitionClosed(BrokerError):
    retriable = True


class AccessDenied(BrokerError):
    """The identity lacks the right (``[security] enable=true``; docs/security.md)."""

    retriable = False


class AuthenticationFailed(BrokerError):
    """``auth`` was refused (wrong user or password, or the address is locked out)."""

    retriable = False


class NotFound(BrokerError):
    retriable = True


class BrokerInternalError(BrokerError):
    retriable = False


class ServiceBusy(BrokerError):
    retriable = True


class OutOfOrderSequence(BrokerError):
    """409: an idempotent batch's sequence is not the next one the broker expects (a gap:
    nothing stored), or a duplicate older than the broker's memory (stored once, result lost).
    The producer retries a gap while an earlier batch of the partition is still being retried;
    otherwise it reports this."""

    retriable = False


class BrokerTimeout(BrokerError):
    retriable = True


class OffsetOutOfRange(MetaClientError):
    """301 Moved: the requested offset is out of range; ``new_offset`` is where to fetch."""

    retriable = True

    def __init__(self, new_offset: int, message: str = "") -> None:
        super().__init__(
            f"offset out of range, moved to {new_offset}" + (f": {message}" if message else "")
        )
        self.code = 301
        self.new_offset = new_offset


class UnknownTopicOrPartition(MetaClientError):
    retriable = False


class MessageTooLarge(MetaClientError):
    retriable = False


class CorruptMessage(MetaClientError):
    """A fetched record failed its checksum or framing; ``offset`` is its byte position."""

    retriable = False

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"corrupt message at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class UndecodableRecord(CorruptMessage):
    """A record whose CRC is valid but which cannot be decoded (a flag this client does not
    know how to read, a bad attribute length, an lz4 flag on data that is not an lz4 frame).

    ``record`` is the whole stored record (header + data) as fetched, ``flag`` its flag,
    ``msg_id`` its id and ``next_offset`` the offset after it. Retrying cannot help: the
    consumer hands it to its reject policy and moves on.
    """

    def __init__(
        self, offset: int, reason: str, *, record: bytes, flag: int, msg_id: int, next_offset: int
    ) -> None:
        super().__init__(offset, reason)
        self.record = record
        self.flag = flag
        self.msg_id = msg_id
        self.next_offset = next_offset


class RequestTimeout(MetaClientError):
    """No reply in time (a put that was written: see :class:`MessageMayBeStored`)."""

    retriable = True
    invalid_metadata = True


class ConnectionLost(MetaClientError):
    """The connection failed while the request was pending (or could not be used)."""

    retriable = True
    invalid_metadata = True


class MessageMayBeStored(MetaClientError):
    """A send whose request was written to the broker failed without an answer: the broker
    MAY have stored it. ``cause`` is the last attempt's error. Retriable: a resend is safe for
    order but may store the message twice (at-least-once)."""

    retriable = True
    invalid_metadata = True

    def __init__(self, what: str, cause: BaseException | None = None) -> None:
        reason = f": {cause}" if cause is not None else ""
        super().__init__(f"{what} may have been stored{reason}")
        self.cause = cause


class MayBeStoredTimeout(MessageMayBeStored, RequestTimeout):
    """No reply to a written send in time: may have been stored (also a RequestTimeout)."""


class MayBeStoredConnectionLost(MessageMayBeStored, ConnectionLost):
    """The connection died with a written send pending: may have been stored."""


def may_be_stored(what: str, cause: MetaClientError) -> MessageMayBeStored:
    """The :class:`MessageMayBeStored` for a written send that failed with ``cause``."""
    if isinstance(cause, MessageMayBeStored):
        return cause
    if isinstance(cause, RequestTimeout):
        return MayBeStoredTimeout(what, cause)
    if isinstance(cause, ConnectionLost):
        return MayBeStoredConnectionLost(what, cause)
    return MessageMayBeStored(what, cause)


class NoBrokerAvailable(MetaClientError):
    retriable = True
    invalid_metadata = True


class ClientClosed(MetaClientError):
    retriable = False


class ConsumerError(MetaClientError):
    """Base of the consumer's own errors."""

    retriable = False


class NoCommittedOffset(ConsumerError):
    """Initial position ``none`` and the group has no committed offset for a partition."""

    def __init__(self, group: str, tp: Any) -> None:
        super().__init__(f"group {group!r} has no committed offset for {tp}")
        self.group = group
        self.topic_partition = tp


class NotAssigned(ConsumerError):
    """The partition is not (or no longer) owned by this consumer."""

    def __init__(self, tp: Any) -> None:
        super().__init__(f"{tp} is not assigned to this consumer")
        self.topic_partition = tp


class InvalidGroupName(ConsumerError, ValueError):
    """A consumer group (or broadcast instance id) MetaQ would refuse."""


class SpoolError(MetaClientError):
    """Base of spool faults; ``retriable`` says whether retrying may succeed."""

    retriable = False


class SpoolLocked(SpoolError):
    """Another process has this spool directory open."""

    retriable = True


class SpoolFull(SpoolError):
    """The spool holds ``max_entries`` pending messages already."""

    retriable = True


class SpoolClosed(SpoolError):
    """The spool was closed."""


class SerializationError(MetaClientError, TypeError):
    """A value or key the client cannot send or decode as asked: not ``bytes`` without a
    serializer, or the configured (de)serializer raised (``__cause__``)."""


class UnknownOption(MetaClientError, TypeError):
    """A keyword option that is no field of the producer's or consumer's configuration."""


class InvalidConfig(MetaClientError, ValueError):
    """A producer or consumer option has a value it cannot take (the message says which)."""


class MissingDependency(MetaClientError, ImportError):
    """A feature needs an optional dependency that is not installed; ``extra`` is the pymetaq
    extra that installs it (``pip install 'pymetaq[<extra>]'``)."""

    def __init__(self, feature: str, package: str, extra: str) -> None:
        super().__init__(
            f"{feature} needs {package}, which is not installed: pip install 'pymetaq[{extra}]'"
        )
        self.feature = feature
        self.package = package
        self.extra = extra


def unknown_options(
    kind: str, unknown: set[str], known: set[str], hints: dict[str, str]
) -> UnknownOption:
    """The :class:`UnknownOption` for ``unknown`` keyword names of a ``kind`` (``"producer"``,
    ``"consumer"``): each with the option meant (``hints``: other clients' names, e.g. Kafka's)
    or the closest known name."""
    import difflib

    parts = []
    for name in sorted(unknown):
        hint = hints.get(name)
        if hint is None:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else ""
        parts.append(f"{name!r}" + (f" ({hint})" if hint else ""))
    return UnknownOption(
        f"unknown {kind} option(s): {', '.join(parts)}; the options are the fields of "
        f"{kind.capitalize()}Config"
    )


_BY_CODE: dict[int, type[BrokerError]] = {
    400: BadRequest,
    403: PartitionClosed,
    404: NotFound,
    409: OutOfOrderSequence,
    500: BrokerInternalError,
    503: ServiceBusy,
    504: BrokerTimeout,
}

#: substrings of a 500 reply's body that mean "this topic/partition does not exist here".
_UNKNOWN_MARKERS = ("unknown topic", "no such topic", "partition out of range", "invalid partition")


def error_for_reply(code: int, body: bytes | str) -> MetaClientError:
    """The exception for a non-200 ``result`` reply (the single code → exception mapping)."""
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body
    if code == 301:
        try:
            return OffsetOutOfRange(int(text.strip()))
        except ValueError:
            return BrokerInternalError(code, f"301 with a non-numeric offset {text!r}")
    if code == 500 and any(m in text.lower() for m in _UNKNOWN_MARKERS):
        return UnknownTopicOrPartition(text)
    if code == 403 and text.startswith("identity '"):
        return AccessDenied(code, text)
    cls = _BY_CODE.get(code)
    if code == 401:
        cls = AuthenticationFailed
    if cls is None:
        cls = BrokerInternalError if code >= 500 else BadRequest
    return cls(code, text)
