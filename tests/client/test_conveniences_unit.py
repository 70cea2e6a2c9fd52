"""Pure pieces of the client conveniences: the key in MetaQ's attribute, timestamps from ids,
the error tree, helpful messages for unknown options, iteration's exact positions."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pymetaq.client import Consumer, Producer
from pymetaq.client.consumer.batch import Messages
from pymetaq.client.consumer.iterate import partly
from pymetaq.client.errors import (
    InvalidConfig,
    InvalidGroupName,
    MetaClientError,
    MissingDependency,
    SerializationError,
    UnknownOption,
)
from pymetaq.client.producer.config import ProducerConfig
from pymetaq.client.transport.records import (
    KEY_PREFIX,
    build_record,
    decode_messages,
    join_key,
    split_key,
)
from pymetaq.client.types import ID_EPOCH_MS, ID_TIME_SHIFT, Message, TopicPartition
from pymetaq.offsets import CorruptOffsetData, OffsetStoreError, OffsetStoreUnavailable
from pymetaq.storage import ids


@given(st.binary(max_size=64), st.none() | st.text(max_size=64))
def test_a_key_and_an_attribute_round_trip_through_the_attribute(
    key: bytes, attribute: str | None
) -> None:
    stored = join_key(key, attribute)
    assert stored is not None and stored.startswith(KEY_PREFIX)
    assert split_key(stored) == (key, attribute)
    # what a MetaQ client reads: a record with the attribute flag and that text
    [m], _ = decode_messages(build_record(b"v", stored), "t", 0, 0)
    assert (m.key, m.attribute, m.value) == (key, attribute, b"v")


def test_the_attribute_encoding_is_readable_and_documented() -> None:
    assert join_key(b"user-42", None) == "pymetaq-key:user-42"
    assert join_key(b"user 42", "x;y") == "pymetaq-key:user%2042;x;y"
    assert join_key(b"k", "") == "pymetaq-key:k;"
    assert join_key(None, "plain") == "plain" and join_key(None, None) is None
    assert split_key("from a MetaQ producer") == (None, "from a MetaQ producer")
    with pytest.raises(ValueError, match="may not start with 'pymetaq-key:'"):
        join_key(None, "pymetaq-key:forged")


def test_timestamp_is_the_ids_time_bits() -> None:
    assert (ID_EPOCH_MS, ID_TIME_SHIFT) == (ids.EPOCH_MS, ids.TIME_SHIFT)
    worker = ids.IdWorker(3, clock=lambda: 1_795_000_000_123)
    msg_id = worker.reserve()
    m = Message("t", 0, 0, msg_id, b"")
    assert m.timestamp == 1_795_000_000_123 == ids.id_time_ms(msg_id)


def test_every_client_error_is_a_meta_client_error() -> None:
    for cls in (
        InvalidConfig,
        OffsetStoreError,
        OffsetStoreUnavailable,
        CorruptOffsetData,
        InvalidGroupName,
        SerializationError,
        UnknownOption,
        MissingDependency,
    ):
        assert issubclass(cls, MetaClientError), cls
    # and what Python code caught before still catches them
    assert issubclass(InvalidGroupName, ValueError) and issubclass(InvalidConfig, ValueError)
    assert issubclass(SerializationError, TypeError) and issubclass(UnknownOption, TypeError)
    assert issubclass(MissingDependency, ImportError)
    assert OffsetStoreUnavailable("x").retriable and not CorruptOffsetData("x").retriable


def test_unknown_options_say_what_was_meant() -> None:
    with pytest.raises(UnknownOption) as e:
        Consumer("meta://127.0.0.1:1", None, group_id="g", fetch_max_sise=10)
    assert str(e.value) == (
        "unknown consumer option(s): 'fetch_max_sise' (did you mean 'fetch_max_size'?), "
        "'group_id' (pass the group as the second argument, group=); the options are the "
        "fields of ConsumerConfig"
    )
    with pytest.raises(UnknownOption) as e:
        Producer("meta://127.0.0.1:1", acks="all")
    assert str(e.value) == (
        "unknown producer option(s): 'acks' (a send is acknowledged once it is durable under "
        "the broker's flush policy); the options are the fields of ProducerConfig"
    )
    with pytest.raises(InvalidGroupName, match=re.escape("group name 'a.b' contains '.'")):
        Consumer("meta://127.0.0.1:1", "a.b")
    with pytest.raises(InvalidConfig, match="at most 4096 messages per batch"):
        ProducerConfig(batch_messages=5000)
    with pytest.raises(InvalidConfig, match="broadcast needs a group"):
        Consumer("meta://127.0.0.1:1", None, broadcast=True)


def _msg(p: int, offset: int, msg_id: int) -> Message:
    return Message("t", p, offset, msg_id, b"", None, offset + 21, 0)


def test_partly_names_the_first_unprocessed_message_per_partition() -> None:
    a = [_msg(0, 0, 10), _msg(0, 21, 11), _msg(0, 42, 12)]
    b = [_msg(1, 0, 20), _msg(1, 21, 21)]
    batch = Messages([a, b])
    tp0, tp1 = TopicPartition("t", 0, 0), TopicPartition("t", 0, 1)
    assert partly(batch, 5) == {}
    assert partly(batch, 2) == {tp0: (42, 11), tp1: (0, None)}
    assert partly(batch, 4) == {tp1: (21, 20)}
    assert partly(batch, 0) == {tp0: (0, None), tp1: (0, None)}
