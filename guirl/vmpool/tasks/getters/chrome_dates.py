"""OSWorld's `rule_relativeTime` (getters/misc.py): a rule whose expected dates are written relative to
today ("next Monday", "10th next month") and filled in when the task is scored.

The expected values are format strings (`"{DoW}, {Month} {Day0D}"`); each placeholder is replaced once,
as OSWorld does. Today is taken in the rule's `timezone`, else in UTC (OSWorld asks an IP-geolocation
service, and falls back to UTC without one).
"""

from __future__ import annotations

import copy
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from guirl.vmpool.client import VMClient
from guirl.vmpool.tasks.getters.base import Getter
from guirl.vmpool.tasks.setup import TaskContext

_DOW = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")  # fmt: skip


def format_day(fmt: str, day: date) -> str:
    """Fill OSWorld's date placeholders, each once."""
    month = _MONTHS[day.month - 1]
    for placeholder, value in (
        ("{DoW}", _DOW[day.weekday()]),
        ("{Month}", month[:3]),
        ("{DayD}", str(day.day)),
        ("{Year}", str(day.year)),
        ("{Month0D}", f"{day.month:02d}"),
        ("{month}", month.lower()),
        ("{MonthFull}", month),
        ("{Day0D}", f"{day.day:02d}"),
        ("{MonthD}", str(day.month)),
    ):
        fmt = fmt.replace(placeholder, value, 1)
    return fmt


def _add_months(today: date, months: int, day: int) -> date:
    total = today.month - 1 + months
    return date(today.year + total // 12, total % 12 + 1, day)


def _first_monday(month_start: date) -> date:
    return month_start + timedelta(days=(7 - month_start.weekday()) % 7)


def _next_weekend_day(today: date, weekday: int) -> date:
    """The coming Friday (4) or Saturday (5), a week later when today is that day or past it."""
    wd = today.weekday()
    if wd < weekday:
        return today + timedelta(days=weekday - wd)
    if wd == weekday:
        return today + timedelta(days=7)
    return today + timedelta(days=7 - wd + weekday)


def resolve_day(name: str, today: date) -> date | None:
    """The day a relative name means, on its own (`from`, or a lone time); None for names that depend on
    the range's start (handled in `resolve_end`)."""
    wd = today.weekday()
    next_monday = today + timedelta(days=7 - wd)
    table = {
        "tomorrow": lambda: today + timedelta(days=1),
        "this month": lambda: today,
        "5th next month": lambda: _add_months(today, 1, 5),
        "10th next month": lambda: _add_months(today, 1, 10),
        "11th next month": lambda: _add_months(today, 1, 11),
        "this Saturday": lambda: today + timedelta(days=5 - wd),
        "this Sunday": lambda: today + timedelta(days=6 - wd),
        "next Monday": lambda: next_monday,
        "next Monday split": lambda: next_monday,
        "next Friday": lambda: _next_weekend_day(today, 4),
        "next Saturday": lambda: _next_weekend_day(today, 5),
        "next week Friday": lambda: next_monday + timedelta(days=4),
        "next week Saturday": lambda: next_monday + timedelta(days=5),
        "next week Sunday": lambda: next_monday + timedelta(days=6),
        "first monday four months later": lambda: _first_monday(_add_months(today, 4, 1)),
        "first monday eight months later": lambda: _first_monday(_add_months(today, 8, 1)),
    }
    if name not in table:
        raise ValueError(f"rule_relativeTime: relative time {name!r} is not implemented")
    return table[name]()


def resolve_end(name: str, start_name: str, start: date, today: date) -> date:
    """The day a range's `to` means, given its `from`."""
    wd = today.weekday()
    if name in ("next Friday", "next Friday split"):
        if start_name in ("next Monday", "next Monday split"):
            return start + timedelta(days=4)  # the Friday of that week
        return today + timedelta(days=4 - wd if wd < 4 else 6 - wd + 5)
    if name == "next Sunday":
        if start_name in ("next Friday", "next Saturday"):
            return start + timedelta(days=6 - start.weekday())  # the Sunday of that weekend
        return today + timedelta(days=6 - wd if wd < 6 else 7)
    if name == "next week Sunday" and start_name in ("next week Friday", "next week Saturday"):
        return start + timedelta(days=6 - start.weekday())
    end = resolve_day(name, today)
    assert end is not None
    return end


def relative_time_rules(rules: dict[str, Any], today: date) -> dict[str, Any]:
    """The rule with its expected dates filled in for `today` (the task's own rule is left untouched)."""
    out = copy.deepcopy(rules)
    when, expected = out["relativeTime"], out["expected"]
    start_name = when["from"]
    start = resolve_day(start_name, today)
    assert start is not None
    if "to" not in when:
        expected["time"] = format_day(expected["time"], start)
        return out
    if start_name == "next Monday split":
        for key in ("puDay", "puMonth", "puYear"):
            expected[key] = format_day(expected[key], start)
    else:
        expected["from"] = format_day(expected["from"], start)
    end = resolve_end(when["to"], start_name, start, today)
    if when["to"] == "next Friday split":
        for key in ("doDay", "doMonth", "doYear"):
            expected[key] = format_day(expected[key], end)
    else:
        expected["to"] = format_day(expected["to"], end)
    return out


def today_in(timezone: str | None) -> date:
    try:
        zone = ZoneInfo(timezone or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        zone = ZoneInfo("UTC")  # OSWorld's fallback for a name it does not know
    return datetime.now(zone).date()


async def rule_relativeTime(config: dict[str, Any], client: VMClient, ctx: TaskContext) -> Any:  # noqa: N802
    rules = config["rules"]
    return relative_time_rules(rules, today_in(rules.get("timezone")))


GETTERS: dict[str, Getter] = {"rule_relativeTime": rule_relativeTime}
"""The relative-date rule getter, merged into `chrome.GETTERS`."""
