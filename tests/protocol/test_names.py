"""Topic names: the safe alphabet, the length limit, and config patterns that cannot escape."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pymetaq.client.protocol.names import (
    MAX_TOPIC_LENGTH,
    InvalidTopicName,
    topic_name_error,
    topic_pattern,
    validate_topic,
)

SAFE = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=MAX_TOPIC_LENGTH)


@pytest.mark.parametrize(
    "name", ["test", "meta-test", "log-..", "a.b_c-D9", "...", "x" * MAX_TOPIC_LENGTH, "-", "_"]
)
def test_valid_names(name: str) -> None:
    assert topic_name_error(name) is None and validate_topic(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "invalid topic name: empty"),
        (".", "invalid topic name '.': '.' and '..' are not names"),
        ("..", "invalid topic name '..': '.' and '..' are not names"),
        ("a/b", "invalid topic name 'a/b': '/' is not allowed"),
        ("log-/../../x", "'/' is not allowed"),
        ("a\\b", "'\\\\' is not allowed"),
        ("a b", "' ' is not allowed"),
        ("a\x00b", "'\\x00' is not allowed"),
        ("é", "'é' is not allowed"),
        ("a*", "'*' is not allowed"),
        ("x" * 201, "invalid topic name: 201 characters, at most 200"),
    ],
)
def test_invalid_names(name: str, reason: str) -> None:
    error = topic_name_error(name)
    assert error is not None and reason in error
    with pytest.raises(InvalidTopicName):
        validate_topic(name)


def test_a_long_bad_name_is_shortened_in_the_message() -> None:
    error = topic_name_error("/" + "x" * 150)
    assert error is not None and len(error) < 160 and "..." in error


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("log-*", ["log-a", "log-", "log-..", "log-a.b"], ["log-/x", "log-a/../b", "log- a", "lo"]),
        ("*", ["a", "...", "a-b"], [".", "..", "a/b", "", "x" * 201]),
        ("a*b*c", ["abc", "a-b.c", "axxbyyc"], ["ab/c", "a/bc"]),
    ],
)
def test_patterns_match_only_safe_names(pattern: str, yes: list[str], no: list[str]) -> None:
    rx = topic_pattern(pattern)
    assert all(rx.fullmatch(n) for n in yes)
    assert not any(rx.fullmatch(n) for n in no)


@pytest.mark.parametrize("pattern", ["a/*", "..", ".", "*/..", "a b*", "x" * 201, ""])
def test_bad_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(InvalidTopicName):
        topic_pattern(pattern)


@given(st.text(max_size=300))
def test_a_pattern_match_is_always_a_valid_name(name: str) -> None:
    if topic_pattern("*").fullmatch(name):
        assert topic_name_error(name) is None


@given(SAFE)
def test_every_valid_name_matches_star(name: str) -> None:
    if name not in (".", ".."):
        assert topic_pattern("*").fullmatch(name)
