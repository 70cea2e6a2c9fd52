"""The client's exception tree, and the one place that maps wire result codes to exceptions.

```
MetaClientError (retriable: bool)
├── BrokerError (code, message)          a non-200 ``result`` reply
│   ├── BadRequest             400       malformed request (never retriable)
│   ├── PartitionClosed        403       partition closed by an operator (retriable)
│   ├── NotFound               404       no data / no store at that offset (retriable)
│   ├── BrokerInternalError    500       broker-side failure: wrong partition, unknown topic,
│   │                                    checksum mismatch, I/O error (not retriable)
│   ├── ServiceBusy            503       broker overloaded (retriable)
│   └── BrokerTimeout          504       broker-side timeout (retriable)
├── OffsetOutOfRange (new_offset)  301   the offset moved; fetch from ``new_offset``
├── UnknownTopicOrPartition              no broker serves the topic / partition (not retriable)
├── MessageTooLarge                      a message is bigger than the configured limit
├── CorruptMessage (offset)              a fetched record failed its CRC or framing
├── RequestTimeout                       no reply within the timeout; a put MAY have been
│                                        stored (retriable; a retry can duplicate)
├── ConnectionLost                       the connection failed with the request pending;
│                                        a put MAY have been stored (retriable)
├── NoBrokerAvailable                    could not connect to any (or the needed) broker
└── ClientClosed                         the producer/consumer was closed (not retriable)
```

Use :func:`error_for_reply` to turn a ``(code, body)`` reply into the matching exception.

Thread-safe: plain exception classes and a pure function.
"""

from __future__ import annotations


class MetaClientError(Exception):
    """Base class of every pymetaq.client error; ``retriable`` says whether a retry can help."""

    retriable: bool = False


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


class NotFound(BrokerError):
    retriable = True


class BrokerInternalError(BrokerError):
    retriable = False


class ServiceBusy(BrokerError):
    retriable = True


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


class RequestTimeout(MetaClientError):
    """No reply in time. For a put the message may or may not have been stored."""

    retriable = True


class ConnectionLost(MetaClientError):
    """The connection failed while the request was pending (or could not be used)."""

    retriable = True


class NoBrokerAvailable(MetaClientError):
    retriable = True


class ClientClosed(MetaClientError):
    retriable = False


_BY_CODE: dict[int, type[BrokerError]] = {
    400: BadRequest,
    403: PartitionClosed,
    404: NotFound,
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
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = BrokerInternalError if code >= 500 else BadRequest
    return cls(code, text)
