"""Matching a value against a task's `{"method", "ref"}` rule, and a record against a pattern.

OSWorld's `metrics/utils.py` (`_match_value_to_rule`, `_match_record`) has these semantics; its metrics for
Thunderbird's prefs, JSON/YAML files and CSV rows share them. `method` is one of:

- `re` or `re.FLAG.FLAG...`: `re.search(ref, value, flags)` finds a match;
- `eq`, `ne`, `lt`, `le`, `gt`, `ge`: `operator.<method>(value, ref)`;
- `approx:T`: `abs(float(value) - ref) <= T` (a value that is no number does not match);
- `range.XY` (X, Y in `e`/`t`): `ref[0] <X value <Y ref[1]`, e.g. `range.te` is `ref[0] < value <= ref[1]`;
- `str_list_eq` / `str_set_eq`: the comma-separated value, outer quotes stripped, as a list / set equals ref.

A value of the wrong type for its method (a regex against a number, `lt` between a str and an int) raises
TypeError, as in the reference; each metric decides what that scores.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping
from functools import reduce
from typing import Any

from guirl.vmpool.tasks.metrics import UnsupportedMetric

_ORDER = {"eq", "ne", "lt", "le", "gt", "ge"}


def match_value_to_rule(value: Any, rule: Mapping[str, Any]) -> bool:
    """Whether `value` satisfies `rule` (`{"method": ..., "ref": ...}`); see the module docstring."""
    method = rule["method"]
    ref = rule.get("ref")
    if method.startswith("re"):
        flags = reduce(operator.or_, (getattr(re, f) for f in method.split(".")[1:]), re.RegexFlag(0))
        if not isinstance(value, str):
            raise TypeError(f"a {method} rule needs a str value, not {type(value).__name__}")
        return re.search(ref, value, flags) is not None
    if method in _ORDER:
        return bool(getattr(operator, method)(value, ref))
    if method.startswith("approx"):
        threshold = float(method.split(":")[1])
        try:
            number = float(value)
        except (TypeError, ValueError):
            return False
        return abs(number - ref) <= threshold
    if method.startswith("range."):
        low, high = method[6], method[7]
        return bool(
            getattr(operator, "l" + low)(ref[0], value) and getattr(operator, "l" + high)(value, ref[1])
        )
    if method in ("str_list_eq", "str_set_eq"):
        container = list if method == "str_list_eq" else set
        return container(value.strip("\"'").split(",")) == container(ref)
    raise UnsupportedMetric(f"rule method {method!r} is not implemented")


def match_record(pattern: Mapping[str, Any], record: Mapping[str, Any]) -> bool:
    """Whether every key of `pattern` is in `record` with an equal value."""
    return all(key in record and record[key] == want for key, want in pattern.items())
