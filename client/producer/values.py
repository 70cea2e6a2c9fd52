"""What a producer stores for what it is given: values and keys through the configured
serializers, and the attribute that carries a message's key.

* ``value_serializer`` / ``key_serializer`` (:class:`~pymetaq.client.producer.config.ProducerConfig`)
  turn what ``send`` is given into bytes; without one, a value must be bytes (a key bytes or
  str) and anything else is a :class:`~pymetaq.client.errors.SerializationError` that says how to
  fix it (not Python's ``TypeError ... bytes, not str``).
* The key travels with the message in MetaQ's attribute (``key_in_attribute``, the default;
  the encoding is :func:`pymetaq.client.transport.records.join_key`).

:func:`serializing` wraps a send function so that only producers with serializers pay for them
(the engine binds the wrapper in place of its send path).

Thread-safe: immutable after construction; the serializers are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pymetaq.client.errors import SerializationError
from pymetaq.client.producer.config import ProducerConfig
from pymetaq.client.producer.partitioner import key_bytes
from pymetaq.client.transport.records import join_key


def not_bytes(what: str, value: object, serializing: bool) -> str:
    """Why a value or key cannot be sent as it is, and what to do."""
    kind = type(value).__name__
    if serializing:
        return f"the {what}_serializer returned {kind}, not bytes"
    example = "str.encode" if isinstance(value, str) else "lambda v: json.dumps(v).encode()"
    return (
        f"{what} must be bytes, not {kind}: encode it, or give the producer a "
        f"{what}_serializer (e.g. {what}_serializer={example})"
    )


def _apply(fn: Callable[[Any], bytes], value: object, name: str) -> object:
    try:
        return fn(value)
    except Exception as e:
        raise SerializationError(f"{name} failed on a {type(value).__name__}: {e!r}") from e


class MessageValues:
    """A producer's serializers and key encoding (see the module docstring)."""

    def __init__(self, cfg: ProducerConfig) -> None:
        self._value_serializer = cfg.value_serializer
        self._key_serializer = cfg.key_serializer
        self._key_in_attribute = cfg.key_in_attribute
        #: a serializer is configured (the send paths run them)
        self.serializing = cfg.value_serializer is not None or cfg.key_serializer is not None

    def value(self, value: object) -> Any:
        """``value`` through the ``value_serializer`` (if any); the caller checks the result."""
        fn = self._value_serializer
        return value if fn is None else _apply(fn, value, "value_serializer")

    def key(self, key: object) -> Any:
        """``key`` through the ``key_serializer`` (if any, and a key is given)."""
        fn = self._key_serializer
        if fn is None or key is None:
            return key
        out = _apply(fn, key, "key_serializer")
        if not isinstance(out, bytes):
            raise SerializationError(not_bytes("key", out, True))
        return out

    def attribute(self, key: bytes | str | None, attribute: str | None) -> str | None:
        """The attribute a message is stored with (the key travels in it)."""
        kb = key_bytes(key) if self._key_in_attribute else None
        try:
            return join_key(kb, attribute)
        except ValueError as e:
            raise SerializationError(str(e)) from None


def serializing(values: MessageValues, send: Callable[..., Any]) -> Callable[..., Any]:
    """``send(topic, value, key, partition, attribute, force)`` through the serializers."""

    def send_serialized(
        topic: str,
        value: object,
        key: object = None,
        partition: Any = None,
        attribute: str | None = None,
        force: bool = False,
    ) -> Any:
        return send(topic, values.value(value), values.key(key), partition, attribute, force)

    return send_serialized
