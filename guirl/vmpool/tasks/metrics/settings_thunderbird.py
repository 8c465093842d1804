"""Thunderbird's settings and folders (OSWorld's metrics/thunderbird.py): prefs.js, msgFilterRules.dat and
mbox folder files. Merged into settings.py's `METRICS`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from guirl.vmpool.tasks.metrics.value_rules import match_record, match_value_to_rule

# One pref per line, as Thunderbird writes prefs.js: `user_pref("key", value);` with a JSON-like value.
_PREF = re.compile(r'^user_pref\("(?P<key>(?:[^"]|\\")+)", (?P<val>.+)\);$')

# The conditions of a filter's `condition="..."` line: `AND (subject,contains,discount)`,
# `OR (from,is,"a, b")`, or `ALL` (the reference's pattern, kept so conditions split the same way).
_CONDITION = re.compile(r'\b(?:AND|OR) \((?:[\w ]+),(?:[\w \']+),(?:"(?:(?:[^"]|\")+)"|(?:[^)]+))\)|\bALL\b')


def _read_lines(path: str) -> list[str] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return list(f)
    except (OSError, UnicodeDecodeError):
        return None


def _pref_matches(value: Any, rule: Mapping[str, Any]) -> bool:
    try:
        return match_value_to_rule(value, rule)
    except TypeError:  # a regex against a bool or number pref (the reference raises): no match
        return False


def check_thunderbird_prefs(result: str | None, rule: Mapping[str, Any]) -> float:
    """1.0 when every pref in `rule["expect"]` is set (in prefs.js) to a value matching its
    `{method, ref}` rule, and no pref in `rule["unexpect"]` is set to a value matching its rule.

    A pref that is not in the file (Thunderbird leaves defaults out) fails its `expect` rule.
    """
    if result is None:
        return 0.0
    lines = _read_lines(result)
    if lines is None:
        return 0.0
    expect: Mapping[str, Any] = rule.get("expect", {})
    unexpect: Mapping[str, Any] = rule.get("unexpect", {})
    found = dict.fromkeys(expect, False)
    clean = True
    for line in lines:
        m = _PREF.match(line.strip())
        if m is None:
            continue
        key = m.group("key")
        if key not in expect and key not in unexpect:
            continue
        try:
            value = json.loads(m.group("val"))
        except json.JSONDecodeError:  # not a JSON literal (the reference raises): it matches no rule
            continue
        if key in expect:
            found[key] = _pref_matches(value, expect[key])  # the last setting of a key counts
        else:
            clean = clean and not _pref_matches(value, unexpect[key])
    return float(all(found.values()) and clean)


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\\\", "\\")


def _filters(lines: Iterable[str]) -> list[dict[str, Any]]:
    """msgFilterRules.dat's filters, each as `{name, enabled, type, actions: [(action, value)], condition}`.

    A filter is a run of `key="value"` lines from `name=` to `condition=`; its actions come in order, each
    `action=` optionally followed by its `actionValue=`.
    """
    filters: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        key, sep, quoted = line.partition("=")
        if not sep or len(quoted) < 2 or not (quoted.startswith('"') and quoted.endswith('"')):
            continue
        value = _unescape(quoted[1:-1])
        if key == "name":
            current = {"name": value, "actions": []}
        elif current is None:
            continue  # the file's header (version=, logging=)
        elif key in ("enabled", "type"):
            current[key] = value
        elif key == "action":
            current["actions"].append([value, None])
        elif key == "actionValue" and current["actions"]:
            current["actions"][-1][1] = value
        elif key == "condition":
            current["condition"] = _CONDITION.findall(value)
            filters.append(current)
    return filters


def _views(flt: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The filter as records a rule is matched against: one per action (a filter with several actions
    matches a rule naming any one of them), or one without action keys when it has none."""
    base = {k: v for k, v in flt.items() if k != "actions"}
    if not flt["actions"]:
        return [base]
    views = []
    for action, value in flt["actions"]:
        view = dict(base, action=action)
        if value is not None:
            view["actionValue"] = value
        views.append(view)
    return views


def check_thunderbird_filter(result: str | None, rules: Mapping[str, Any]) -> float:
    """1.0 when each record in `rules["expect"]` (e.g. `{enabled, action, actionValue, condition}`) matches
    some message filter of msgFilterRules.dat and no record in `rules["unexpect"]` matches any."""
    if result is None:
        return 0.0
    lines = _read_lines(result)
    if lines is None:
        return 0.0
    views = [view for flt in _filters(lines) for view in _views(flt)]
    expect = rules.get("expect", [])
    unexpect = rules.get("unexpect", [])
    found = all(any(match_record(r, v) for v in views) for r in expect)
    clean = not any(match_record(r, v) for r in unexpect for v in views)
    return float(found and clean)


# An mbox message starts at a `From ` line; Thunderbird writes `From - <date of storing>`.
_FROM_LINE = re.compile(r"^From .*\n?", re.MULTILINE)


def _folder_messages(path: str, options: Mapping[str, Any]) -> list[str] | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:  # mail may be 8-bit, any charset
            text = f.read()
    except OSError:
        return None
    messages = []
    # The From line's date is when Thunderbird stored the message (a move stores it anew), so a message is
    # compared from its headers on.
    for message in _FROM_LINE.split(text):
        if not message.strip():
            continue
        if options.get("remove_deleted", True) and re.search(r"X-Mozilla-Status: 000[89]", message):
            continue  # moved or deleted, kept in the file until Thunderbird compacts the folder
        if options.get("ignore_status", False):
            message = re.sub(r"X-Mozilla-Status\d?:[\s\d]+", "", message)
        if options.get("ignore_keys", False):
            message = re.sub(r"(X-Mozilla-Keys:[^\n]*?)\n(MIME-Version)", r"\2", message)
        messages.append(message.strip())
    if options.get("remove_duplicate", True):
        messages = list(set(messages))
    return sorted(messages)


def check_thunderbird_folder(
    result: str | list[str | None] | None, reference: str | list[str], **options: Any
) -> float:
    """1.0 when each result mbox folder file holds the same messages as its gold file (order aside).

    Options: `remove_deleted` (default True) leaves out messages marked deleted (X-Mozilla-Status 0008 or
    0009), `remove_duplicate` (default True) compares sets, `ignore_status` drops X-Mozilla-Status headers,
    `ignore_keys` drops X-Mozilla-Keys headers. Each message is compared without its `From -` line.
    """
    results = result if isinstance(reference, list) else [result]
    golds = reference if isinstance(reference, list) else [reference]
    if not isinstance(results, list) or len(results) != len(golds):
        return 0.0
    for got, want in zip(results, golds, strict=True):
        if got is None:
            return 0.0
        mine, gold = _folder_messages(got, options), _folder_messages(want, options)
        if mine is None or gold is None or mine != gold:
            return 0.0
    return 1.0


METRICS: dict[str, Callable[..., float]] = {
    "check_thunderbird_prefs": check_thunderbird_prefs,
    "check_thunderbird_filter": check_thunderbird_filter,
    "check_thunderbird_folder": check_thunderbird_folder,
}
"""Thunderbird's metrics, by OSWorld's names."""
