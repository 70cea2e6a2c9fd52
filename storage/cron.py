"""Schedules for retention jobs: Quartz cron expressions (MetaQ's ``deleteWhen``) and an
interval form.

Quartz form: ``sec min hour day-of-month month day-of-week [year]``, each field ``*``, ``?``
(day fields only; same as ``*``), a value, a range ``a-b``, a step ``a/n``, ``*/n`` or
``a-b/n``, or a comma list of those.  Months accept ``JAN``..``DEC``, days of week ``SUN``..``SAT``
(Quartz numbering: 1 = Sunday .. 7 = Saturday).  A day matches when both day fields match
(Quartz requires one of them to be ``?``).  Not supported (ValueError: not a value):
``L``, ``W``, ``#``.
Times are naive local datetimes, as Quartz uses the JVM's local time zone.

Interval form: ``every N[s|m|h|d]`` fires ``N`` units after ``after``.

Thread-safe: pure functions.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
    )
}
_DAYS = {d: i + 1 for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}
_EVERY = re.compile(r"^\s*every\s+(\d+)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "": 1}
_MAX_YEARS = 8


@dataclass(frozen=True)
class CronSpec:
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]  # day of month 1..31
    months: frozenset[int]
    weekdays: frozenset[int]  # Quartz 1=SUN..7=SAT
    years: frozenset[int] | None


def _value(token: str, names: dict[str, int] | None) -> int:
    t = token.upper()
    if names and t in names:
        return names[t]
    if not t.isdigit():
        raise ValueError(f"bad cron value {token!r}")
    return int(t)


def _field(text: str, lo: int, hi: int, names: dict[str, int] | None = None) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        if not part:
            raise ValueError(f"empty item in cron field {text!r}")
        rng, _, step_s = part.partition("/")
        step = int(step_s) if step_s else 1
        if step_s and (not step_s.isdigit() or step < 1):
            raise ValueError(f"bad cron step in {part!r}")
        if rng in ("*", "?"):
            a, b = lo, hi
        elif "-" in rng:
            a_s, _, b_s = rng.partition("-")
            a, b = _value(a_s, names), _value(b_s, names)
        else:
            a = _value(rng, names)
            b = hi if step_s else a
        if not (lo <= a <= hi and lo <= b <= hi) or a > b:
            raise ValueError(f"cron item {part!r} outside {lo}..{hi}")
        out.update(range(a, b + 1, step))
    return frozenset(out)


def parse_cron(expr: str) -> CronSpec:
    """Parse a Quartz cron expression (6 or 7 fields)."""
    fields = expr.split()
    if len(fields) not in (6, 7):
        raise ValueError(f"cron {expr!r}: expected 6 or 7 fields, got {len(fields)}")
    return CronSpec(
        _field(fields[0], 0, 59),
        _field(fields[1], 0, 59),
        _field(fields[2], 0, 23),
        _field(fields[3], 1, 31),
        _field(fields[4], 1, 12, _MONTHS),
        _field(fields[5], 1, 7, _DAYS),
        _field(fields[6], 1970, 2199) if len(fields) == 7 else None,
    )


def quartz_weekday(day: dt.date) -> int:
    """Quartz day-of-week number: 1 = Sunday .. 7 = Saturday."""
    return (day.isoweekday() % 7) + 1


def matches(spec: CronSpec, t: dt.datetime) -> bool:
    """Whether the cron fires at second ``t``."""
    return (
        t.second in spec.seconds
        and t.minute in spec.minutes
        and t.hour in spec.hours
        and _day_ok(spec, t.date())
    )


def _day_ok(spec: CronSpec, d: dt.date) -> bool:
    return (
        d.day in spec.days
        and d.month in spec.months
        and quartz_weekday(d) in spec.weekdays
        and (spec.years is None or d.year in spec.years)
    )


def next_fire(expr: str, after: dt.datetime) -> dt.datetime | None:
    """The first firing time strictly after ``after`` (None if there is none in 8 years)."""
    m = _EVERY.match(expr)
    if m:
        n = int(m.group(1))
        if n <= 0:
            raise ValueError(f"interval {expr!r} must be positive")
        return after + dt.timedelta(seconds=n * _UNIT_S[m.group(2).lower()])
    spec = parse_cron(expr)
    start = after.replace(microsecond=0) + dt.timedelta(seconds=1)
    day = start.date()
    first = True
    limit = day + dt.timedelta(days=366 * _MAX_YEARS)
    while day <= limit:
        if _day_ok(spec, day):
            t = _first_time_in_day(spec, start.time() if first else dt.time(0, 0, 0))
            if t is not None:
                return dt.datetime.combine(day, t)
        day += dt.timedelta(days=1)
        first = False
    return None


def _first_time_in_day(spec: CronSpec, frm: dt.time) -> dt.time | None:
    for h in sorted(spec.hours):
        if h < frm.hour:
            continue
        for mi in sorted(spec.minutes):
            if h == frm.hour and mi < frm.minute:
                continue
            floor = frm.second if (h == frm.hour and mi == frm.minute) else 0
            for s in sorted(spec.seconds):
                if s >= floor:
                    return dt.time(h, mi, s)
    return None


def validate_schedule(expr: str) -> None:
    """Raise ValueError if ``expr`` is neither a cron expression nor ``every N[unit]``."""
    if not _EVERY.match(expr):
        parse_cron(expr)
