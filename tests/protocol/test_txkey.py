"""Transaction keys exactly as MetaQ's TransactionId writes and splits them."""

from __future__ import annotations

import pytest

from pymetaq.client.protocol import (
    InvalidTxKey,
    LocalTxKey,
    XidKey,
    format_tx_key,
    parse_tx_key,
)


def test_local_key() -> None:
    key = LocalTxKey("192.168.1.10-1386000000000-1", 42)
    assert format_tx_key(key) == "TX:192.168.1.10-1386000000000-1:42"
    assert parse_tx_key("TX:192.168.1.10-1386000000000-1:42") == key


def test_xa_key_is_lowercase_hex() -> None:
    key = XidKey(1, b"\x0a\xbc", b"\xff", "XAMessageProducer-host1")
    assert format_tx_key(key) == "XID:1:0abc:ff:XAMessageProducer-host1"
    assert parse_tx_key("XID:1:0ABC:FF:XAMessageProducer-host1") == key
    assert parse_tx_key("XID:-5:::q") == XidKey(-5, b"", b"", "q")


def test_null_key() -> None:
    assert parse_tx_key("null") is None
    assert format_tx_key(None) == "null"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "TX",
        "TX:s",
        "TX::1",
        "TX:s:x",
        "TX:s:1:2",
        "XID:1:ab:cd",
        "XID:x:ab:cd:q",
        "XID:1:abc:cd:q",
        "XID:1:zz:cd:q",
        "XID:1:ab:cd:q:r",
        "tx:s:1",
        "NULL",
        "123",
    ],
)
def test_malformed_keys(text: str) -> None:
    with pytest.raises(InvalidTxKey):
        parse_tx_key(text)


@pytest.mark.parametrize(
    "key",
    [LocalTxKey("a:b", 1), LocalTxKey("", 1), LocalTxKey("a b", 1), XidKey(1, b"", b"", "q:r")],
)
def test_unformattable_keys(key: LocalTxKey | XidKey) -> None:
    with pytest.raises(InvalidTxKey):
        format_tx_key(key)
