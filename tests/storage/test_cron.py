"""next_fire: MetaQ's default deleteWhen, Quartz forms, and a brute-force cross-check."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from pymetaq.storage.cron import next_fire, parse_cron, quartz_weekday

D = dt.datetime


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("0 0 6,18 * * ?", D(2026, 11, 21, 5, 59, 59), D(2026, 11, 21, 6, 0, 0)),
        ("0 0 6,18 * * ?", D(2026, 11, 21, 6, 0, 0), D(2026, 11, 21, 18, 0, 0)),
        ("0 0 6,18 * * ?", D(2026, 12, 31, 18, 0, 0, 1), D(2027, 1, 1, 6, 0, 0)),
        ("*/15 * * * * ?", D(2026, 1, 1, 0, 0, 14, 999999), D(2026, 1, 1, 0, 0, 15)),
        ("0 30 2 ? * MON-FRI", D(2026, 11, 21, 0, 0, 0), D(2026, 11, 23, 2, 30, 0)),  # Sat->Mon
        ("0 0 0 29 FEB ?", D(2026, 3, 1), D(2028, 2, 29)),
        ("0 0 12 ? * 1", D(2026, 11, 21, 12), D(2026, 11, 22, 12)),  # 1 = Sunday
        ("0 0/20 9-10 * * ?", D(2026, 5, 5, 9, 41), D(2026, 5, 5, 10, 0)),
        ("0 0 0 1 1 ? 2030", D(2026, 1, 1), D(2030, 1, 1)),
        ("0 0 0 31 2 ?", D(2026, 1, 1), None),
        ("every 10m", D(2026, 1, 1, 0, 0, 5), D(2026, 1, 1, 0, 10, 5)),
        ("every 2h", D(2026, 1, 1), D(2026, 1, 1, 2)),
        ("every 30s", D(2026, 1, 1), D(2026, 1, 1, 0, 0, 30)),
    ],
)
def test_examples(expr: str, after: D, expected: D | None) -> None:
    assert next_fire(expr, after) == expected


@pytest.mark.parametrize(
    "bad", ["0 0 6 * *", "0 0 25 * * ?", "0 0 L * * ?", "0 0 0 ? * 6#3", "0 5-1 * * * ?", "x"]
)
def test_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        next_fire(bad, D(2026, 1, 1))


def _gen_field(
    rng: random.Random, lo: int, hi: int, names: list[str] | None
) -> tuple[str, set[int]]:
    """A random Quartz field and (independently) the set of values it denotes."""
    items, values = [], set()
    for _ in range(rng.choice([1, 1, 2, 3])):
        form = rng.choice(["*", "v", "range", "step", "rstep"])
        a = rng.randint(lo, hi)
        b = rng.randint(a, hi)
        n = rng.randint(1, max(1, (hi - lo) // 2))

        def name(v: int) -> str:
            return names[v - lo] if names and rng.random() < 0.5 else str(v)

        if form == "*":
            items.append("*")
            values |= set(range(lo, hi + 1))
        elif form == "v":
            items.append(name(a))
            values.add(a)
        elif form == "range":
            items.append(f"{name(a)}-{name(b)}")
            values |= set(range(a, b + 1))
        elif form == "step":
            items.append(f"{a}/{n}")
            values |= set(range(a, hi + 1, n))
        else:
            items.append(f"{a}-{b}/{n}")
            values |= set(range(a, b + 1, n))
    return ",".join(items), values


MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]


def test_next_fire_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        sec, secs = _gen_field(rng, 0, 59, None)
        mi, mins = _gen_field(rng, 0, 59, None)
        hr, hrs = _gen_field(rng, 0, 23, None)
        mo, mons = (
            _gen_field(rng, 1, 12, MONTHS) if rng.random() < 0.3 else ("*", set(range(1, 13)))
        )
        if rng.random() < 0.5:
            dom, doms = _gen_field(rng, 1, 31, None)
            dow, dows = "?", set(range(1, 8))
        else:
            dom, doms = "?", set(range(1, 32))
            dow, dows = _gen_field(rng, 1, 7, DAYS)
        expr = f"{sec} {mi} {hr} {dom} {mo} {dow}"
        after = D(2026, 1, 1) + dt.timedelta(
            seconds=rng.randrange(400 * 86400), microseconds=rng.choice([0, 5])
        )
        got = next_fire(expr, after)
        spec = parse_cron(expr)
        assert (spec.seconds, spec.minutes, spec.hours) == (secs, mins, hrs), expr  # type: ignore[comparison-overlap]
        # brute force: minute by minute over 40 days
        t = after.replace(second=0, microsecond=0)
        expected = None
        for _m in range(40 * 24 * 60):
            d = t.date()
            if (
                t.minute in mins
                and t.hour in hrs
                and d.day in doms
                and d.month in mons
                and quartz_weekday(d) in dows
            ):
                cands = [t.replace(second=s) for s in sorted(secs) if t.replace(second=s) > after]
                if cands:
                    expected = cands[0]
                    break
            t += dt.timedelta(minutes=1)
        if expected is not None:
            assert got == expected, (expr, after)
        else:
            assert got is None or got > t, (expr, after, got)
