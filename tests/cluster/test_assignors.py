"""Assignment strategies: MetaQ's exact DEFAULT and CONSIST, and pymetaq's STICKY.

The expected MetaQ assignments were produced by ``MetaqAssign.java`` (MetaQ's two strategies
transcribed into Java, run on OpenJDK 17: Java's String order, signed bytes and TreeMap) and
the ketama values are re-derived here by hand from ``md5sum`` output.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymetaq.client.cluster.assignors import (
    CONSIST,
    DEFAULT,
    KETAMA_POINTS,
    STICKY,
    get_assignor,
    ketama_assign,
    ketama_hash,
    ketama_points,
    range_assign,
    sticky_assign,
)
from pymetaq.client.protocol.zk import java_sort_key


def _parts(*spec: tuple[int, int]) -> list[str]:
    return [f"{b}-{p}" for b, n in spec for p in range(n)]


# --------------------------------------------------------------------------- DEFAULT (exact)


def test_default_sorts_consumers_and_partitions_as_strings() -> None:
    # java MetaqAssign DEFAULT g_c1,g_c2,g_c10 0-0..0-11
    got = range_assign(["g_c1", "g_c2", "g_c10"], _parts((0, 12)))
    assert got == {
        "g_c1": ("0-0", "0-1", "0-10", "0-11"),
        "g_c10": ("0-2", "0-3", "0-4", "0-5"),
        "g_c2": ("0-6", "0-7", "0-8", "0-9"),
    }


def test_default_gives_the_first_consumers_one_extra() -> None:
    parts = ["0-0", "0-1", "1-0", "1-1", "2-0", "2-1", "2-2", "10-0", "10-1", "10-2"]
    assert range_assign(["g_b", "g_a", "g_c"], parts) == {
        "g_a": ("0-0", "0-1", "1-0", "1-1"),
        "g_b": ("10-0", "10-1", "10-2"),
        "g_c": ("2-0", "2-1", "2-2"),
    }


def test_default_leaves_surplus_consumers_idle() -> None:
    got = range_assign(["g_a", "g_b", "g_c", "g_d", "g_e"], ["0-0", "1-0", "0-1"])
    assert got == {"g_a": ("0-0",), "g_b": ("0-1",), "g_c": ("1-0",), "g_d": (), "g_e": ()}


def test_java_string_order_differs_from_python_outside_the_bmp() -> None:
    # Java compares UTF-16 code units: U+1D11E (surrogates D834 DD1E) < U+FF5A.
    members = ["g_\U0001d11e", "g_\uff5a", "g_a"]
    assert sorted(members) != sorted(members, key=java_sort_key)
    got = range_assign(members, ["0-0", "0-1", "0-2"])
    assert got == {"g_a": ("0-0",), "g_\U0001d11e": ("0-1",), "g_\uff5a": ("0-2",)}


# --------------------------------------------------------------------------- CONSIST (exact)


def test_ketama_hash_is_the_little_endian_head_of_md5() -> None:
    # md5sum: printf '0-0' -> c7763203e20a64b270352752d6a1e7c6; bytes c7 76 32 03 read as a
    # little-endian uint32 = 0x033276c7.
    assert ketama_hash("0-0") == 0x033276C7 == 53638855
    # java MetaqAssign KETAMA 1-3 a-b g_ü-0
    assert ketama_hash("1-3") == 2061684243
    assert ketama_hash("a-b") == 1508745868
    assert ketama_hash("g_\u00fc-0") == 419673846  # UTF-8 bytes, as String.getBytes("UTF-8")


def test_ketama_points_are_160_per_consumer_four_per_digest() -> None:
    points = ketama_points("g_c1")
    assert len(points) == KETAMA_POINTS == 160
    # md5sum: printf 'g_c1-0' -> 11723a41 c97f6fb2 cfeb50c9 adf354a6
    assert points[:4] == [0x413A7211, 0xB26F7FC9, 0xC950EBCF, 0xA654F3AD]


def test_consist_matches_metaq_small() -> None:
    got = ketama_assign(["g_a", "g_b"], _parts((0, 4), (1, 4)))
    assert got == {
        "g_a": ("0-1", "0-2", "0-3", "1-0", "1-1", "1-2", "1-3"),
        "g_b": ("0-0",),
    }


def test_consist_matches_metaq_three_brokers() -> None:
    got = ketama_assign(["g_c1", "g_c2", "g_c10"], _parts((0, 12), (1, 12), (2, 12)))
    expect = {
        "g_c1": "0-3,0-5,1-4,2-3,2-5,2-7,2-8",
        "g_c10": "0-0,0-1,0-4,0-7,0-8,1-0,1-1,1-3,1-6,1-9,2-0,2-1,2-10,2-4,2-9",
        "g_c2": "0-10,0-11,0-2,0-6,0-9,1-10,1-11,1-2,1-5,1-7,1-8,2-11,2-2,2-6",
    }
    assert got == {m: tuple(v.split(",")) for m, v in expect.items()}


def test_consist_matches_metaq_generated_ids() -> None:
    ids = [f"meta-group_192.168.1.{5 + i}-170000000000{i}-{'abc'[i]}" for i in range(3)]
    got = ketama_assign(ids, _parts((0, 6), (1, 6)))
    assert got == {
        ids[0]: ("0-0", "0-1", "0-3", "0-4", "1-0"),
        ids[1]: ("0-2", "0-5", "1-2", "1-4", "1-5"),
        ids[2]: ("1-1", "1-3"),
    }


def test_consist_moves_only_the_leavers_partitions() -> None:
    members = [f"g_m{i}" for i in range(5)]
    parts = _parts((0, 20), (1, 20))
    before = ketama_assign(members, parts)
    after = ketama_assign(members[:-1], parts)
    for m in members[:-1]:
        assert set(before[m]) <= set(after[m])


# --------------------------------------------------------------------------- STICKY


def test_sticky_join_moves_one_partition() -> None:
    owners = {"0-0": "g_a", "0-1": "g_a", "0-2": "g_b", "0-3": "g_b"}
    got = sticky_assign(["g_a", "g_b", "g_0"], _parts((0, 4)), owners)
    # g_a (first with >= ceil) keeps 2; g_b keeps 1; the newcomer gets g_b's other one.
    assert got == {"g_a": ("0-0", "0-1"), "g_b": ("0-2",), "g_0": ("0-3",)}
    assert range_assign(["g_a", "g_b", "g_0"], _parts((0, 4))) == {
        "g_0": ("0-0", "0-1"),
        "g_a": ("0-2",),
        "g_b": ("0-3",),
    }  # DEFAULT would move three


def test_sticky_leave_moves_only_the_leavers_partitions() -> None:
    base = sticky_assign(["g_a", "g_b", "g_c"], _parts((0, 9)), {})
    owners = {p: m for m, ps in base.items() for p in ps}
    got = sticky_assign(["g_a", "g_c"], _parts((0, 9)), owners)
    assert set(base["g_a"]) <= set(got["g_a"]) and set(base["g_c"]) <= set(got["g_c"])


def test_get_assignor() -> None:
    assert get_assignor("default") is DEFAULT and get_assignor("CONSIST") is CONSIST
    assert get_assignor(" Sticky ") is STICKY and get_assignor(STICKY) is STICKY
    assert not DEFAULT.uses_owners and STICKY.uses_owners
    with pytest.raises(ValueError, match="DEFAULT, CONSIST, STICKY"):
        get_assignor("roundrobin")


# --------------------------------------------------------------------------- properties

MEMBER = st.text(alphabet="abcxyz_-.0123456789\u00fc\U0001d11e", min_size=1, max_size=6)
MEMBERS = st.lists(MEMBER.map(lambda s: "g_" + s), min_size=1, max_size=8, unique=True)
PARTITIONS = st.lists(
    st.tuples(st.integers(0, 12), st.integers(0, 15)).map(lambda t: f"{t[0]}-{t[1]}"),
    max_size=40,
    unique=True,
)


def _owners(draw: st.DrawFn, members: list[str], parts: list[str]) -> dict[str, str]:
    pool = [*members, "g_departed", "g_other"]
    return {p: draw(st.sampled_from(pool)) for p in parts if draw(st.booleans())}


@st.composite
def group_state(draw: st.DrawFn) -> tuple[list[str], list[str], dict[str, str]]:
    members, parts = draw(MEMBERS), draw(PARTITIONS)
    return members, parts, _owners(draw, members, parts)


def _check_partition(members: list[str], parts: list[str], got: dict[str, tuple[str, ...]]) -> None:
    assert set(got) == set(members)
    flat = [p for ps in got.values() for p in ps]
    assert sorted(flat) == sorted(parts), "every partition owned by exactly one member"


@settings(max_examples=300, deadline=None)
@given(group_state())
def test_every_partition_has_exactly_one_owner(
    state: tuple[list[str], list[str], dict[str, str]],
) -> None:
    members, parts, owners = state
    for assignor in (DEFAULT, CONSIST, STICKY):
        _check_partition(members, parts, assignor.assign(members, parts, owners))


@settings(max_examples=300, deadline=None)
@given(group_state())
def test_default_and_sticky_are_balanced(
    state: tuple[list[str], list[str], dict[str, str]],
) -> None:
    members, parts, owners = state
    lo, extra = divmod(len(parts), len(members))
    for assignor in (DEFAULT, STICKY):
        sizes = sorted(len(ps) for ps in assignor.assign(members, parts, owners).values())
        assert sizes == [lo] * (len(members) - extra) + [lo + 1] * extra


@settings(max_examples=200, deadline=None)
@given(group_state(), st.randoms(use_true_random=False))
def test_deterministic_across_input_orderings(
    state: tuple[list[str], list[str], dict[str, str]], rnd: random.Random
) -> None:
    members, parts, owners = state
    for assignor in (DEFAULT, CONSIST, STICKY):
        first = assignor.assign(members, parts, owners)
        m2, p2 = list(members), list(parts)
        rnd.shuffle(m2)
        rnd.shuffle(p2)
        o2 = dict(rnd.sample(sorted(owners.items()), len(owners)))
        assert assignor.assign(m2 + m2[:1], p2, o2) == first  # duplicates are ignored too


def _kept(
    members: list[str], parts: list[str], owners: dict[str, str], got: dict[str, tuple[str, ...]]
) -> int:
    return sum(1 for m, ps in got.items() for p in ps if owners.get(p) == m)


@settings(max_examples=200, deadline=None)
@given(group_state())
def test_sticky_moves_the_fewest_partitions(
    state: tuple[list[str], list[str], dict[str, str]],
) -> None:
    """No balanced assignment keeps more partitions with their current (member) owner."""
    members, parts, owners = state
    got = sticky_assign(members, parts, owners)
    lo, extra = divmod(len(parts), len(members))
    held = {m: sum(1 for p in parts if owners.get(p) == m) for m in members}
    best = max(
        sum(min(held[m], lo + (m in big)) for m in members)
        for big in map(set, itertools.combinations(members, extra))
    )
    assert _kept(members, parts, owners, got) == best


@settings(max_examples=200, deadline=None)
@given(group_state())
def test_sticky_is_a_fixed_point(state: tuple[list[str], list[str], dict[str, str]]) -> None:
    members, parts, owners = state
    got = sticky_assign(members, parts, owners)
    settled = {p: m for m, ps in got.items() for p in ps}
    assert sticky_assign(members, parts, settled) == got


@st.composite
def hand_off(draw: st.DrawFn) -> tuple[list[str], list[str], dict[str, str], dict[str, str]]:
    """A group state and a state part-way through the hand-off towards its sticky target:
    some partitions released by their owners, some claimed by their new owners."""
    members, parts, owners = draw(group_state())
    target = sticky_assign(members, parts, owners)
    new_owner = {p: m for m, ps in target.items() for p in ps}
    mid = dict(owners)
    for p in parts:
        if owners.get(p) != new_owner[p]:
            step = draw(st.sampled_from(["none", "released", "claimed"]))
            if step != "none":
                mid.pop(p, None)
            if step == "claimed":
                mid[p] = new_owner[p]
    return members, parts, owners, mid


@settings(max_examples=400, deadline=None)
@given(hand_off())
def test_sticky_target_is_stable_during_the_hand_off(state: tuple) -> None:
    """Members that read the owners at different moments of one hand-off agree."""
    members, parts, owners, mid = state
    assert sticky_assign(members, parts, mid) == sticky_assign(members, parts, owners)


@settings(max_examples=100, deadline=None)
@given(MEMBERS, PARTITIONS)
def test_consist_ring_is_independent_of_other_members_points(
    members: list[str], parts: list[str]
) -> None:
    """Adding a member only takes partitions; it never moves one between the others."""
    before = ketama_assign(members, parts)
    after = ketama_assign([*members, "g_newcomer"], parts)
    for m in members:
        assert set(after[m]) <= set(before[m])
