"""OSWorld's general-purpose metrics, written from the semantics in docs/osworld-compat.md §5.2.

Scores match OSWorld's reference (`desktop_env/evaluators/metrics/general.py`, desktop-env 1.0.2) for
every input tests/integration/test_metrics_parity.py feeds both. Two kinds of deliberate difference:

- A result the reference crashes on (not JSON, not a container, a missing or undecodable file) scores
  0.0 here: an unusable result is the policy's failure, not the evaluator's.
- A malformed task (rules without the keys a metric needs, an unknown `literal_match` type) raises,
  including where the reference swallows the error and scores 0.0 (`check_direct_json_object`,
  `file_contains`): a task that can never be passed must fail loudly, not train the policy on zeros.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from rapidfuzz import fuzz

# A getter writes this into `expected` when it could not compute the gold value; OSWorld scores it 0.
EVALUATION_FAILED = "__EVALUATION_FAILED__"


def read_result_lines(path: str) -> list[str] | None:
    """The lines (newlines kept) of the text file a getter fetched, or None when it cannot be read.

    Files are decoded as UTF-8; the reference uses the locale's encoding, UTF-8 on OSWorld's hosts.
    """
    try:
        with open(path, encoding="utf-8") as f:
            return list(f)
    except (OSError, UnicodeDecodeError):
        return None


def read_result_text(path: str) -> str | None:
    """The text of a file a getter fetched (universal newlines), or None when it cannot be read."""
    lines = read_result_lines(path)
    return None if lines is None else "".join(lines)


def exact_match(result: Any, rules: Mapping[str, Any]) -> float:
    """1.0 when the result equals `rules["expected"]` (Python equality, so None == None passes)."""
    return 1.0 if result == rules["expected"] else 0.0


def check_include_exclude(result: Any, rules: Mapping[str, Any]) -> float:
    """1.0 when every `include` entry is in the result and no `exclude` entry is."""
    if result is None:
        return 0.0
    try:
        included = all(s in result for s in rules.get("include", []))
        excluded = not any(s in result for s in rules.get("exclude", []))
    except TypeError:  # a result that is no container (the reference raises)
        return 0.0
    return float(included and excluded)


def _parse_json_result(text: str) -> Any:
    # OSWorld turns every ' into " before parsing, so Python-repr dicts parse (and apostrophes break).
    return json.loads(text.strip().replace("'", '"'))


def check_direct_json_object(result: Any, rules: Mapping[str, Any]) -> float:
    """Compare a dict (or a JSON string of one) with `rules["expected"]`, key by key.

    Default: `expected[k] == result[k]` for every key. With `rules["expect_in_result"]`: a list
    expected value passes when one of its entries is in a list result value or equals a str one; a
    str expected value must be a substring of the result value; any other type fails.
    """
    if isinstance(result, str):
        try:
            result = _parse_json_result(result)
        except json.JSONDecodeError:  # the reference raises; an unparsable answer is a failed one
            return 0.0
    if result is None:
        return 0.0
    expected = rules["expected"]
    if not isinstance(expected, Mapping):
        raise TypeError(f"check_direct_json_object: rules['expected'] must be a dict, not {expected!r}")
    if any(value == EVALUATION_FAILED for value in expected.values()):
        return 0.0
    if rules.get("expect_in_result", False):
        return _expect_in_result(result, expected)
    # OSWorld reads `ignore_list_order` from rules["expected"], where it is also iterated as a key and
    # `sorted(True)` raises inside a try: a truthy value there always scores 0. Placed in `rules` (the
    # only task using it, chrome f5d96daf) it is never read, so lists compare in order. Both kept.
    if expected.get("ignore_list_order", False):
        return 0.0
    for key, want in expected.items():
        if not isinstance(result, Mapping) or want != result.get(key):
            return 0.0
    return 1.0


def _expect_in_result(result: Any, expected: Mapping[str, Any]) -> float:
    for key, want in expected.items():
        if not isinstance(result, Mapping):
            return 0.0
        got = result.get(key)
        if isinstance(want, list):
            if isinstance(got, list):
                ok = any(w in got for w in want)
            elif isinstance(got, str):
                ok = any(w == got for w in want)
            else:
                ok = False
        elif isinstance(want, str):
            try:
                ok = want in got
            except TypeError:  # a missing (None) or non-container result value
                ok = False
        else:
            ok = False
        if not ok:
            return 0.0
    return 1.0


def check_list(result: str | None, rules: Mapping[str, Any]) -> float:
    """1.0 when every `expect` regex matches some line of the file and no `unexpect` regex matches any."""
    if result is None:
        return 0.0
    expect = [re.compile(p) for p in rules.get("expect", [])]
    unexpect = [re.compile(p) for p in rules.get("unexpect", [])]
    lines = read_result_lines(result)
    if lines is None:  # the reference raises on a missing or undecodable file
        return 0.0
    found = all(any(p.search(line) for line in lines) for p in expect)
    clean = not any(p.search(line) for p in unexpect for line in lines)
    return float(found and clean)


def file_contains(file_path: str | None, config: Mapping[str, Any]) -> float:
    """1.0 when every string in `config["expected"]` occurs in the file's text."""
    wanted = config["expected"]
    if not file_path:
        return 0.0
    text = read_result_text(file_path)
    if text is None:
        return 0.0
    # A str `expected` is iterated character by character, as in the reference.
    return float(all(s in text for s in wanted))


def fuzzy_match(result: Any, rules: Mapping[str, Any]) -> float:
    """The Indel similarity of result and `rules["expected"]` (rapidfuzz's ratio) scaled to [0, 1]."""
    expected = rules["expected"]
    try:
        return fuzz.ratio(result, expected) / 100.0
    except TypeError:  # a result with no length (a number); the reference raises
        return 0.0


def is_in_list(result: Any, rules: Mapping[str, Any]) -> float:
    """1.0 when `rules["expected"]` is in the result (a member of a list, a substring of a str).

    The name reads backwards: OSWorld tests `expected in result`.
    """
    expected = rules["expected"]
    try:
        return float(expected in result)
    except TypeError:  # None or another non-container result; the reference raises
        return 0.0


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    """Compare `str()` forms: the values themselves (`type="str"`) or two lists element by element."""
    kind = options.get("type", "str")
    fold = options.get("ignore_case", False)

    def literal(value: Any) -> str:
        return str(value).lower() if fold else str(value)

    if kind == "str":
        return float(literal(result) == literal(expected))
    if kind == "list":
        # exact types, as the reference checks them: a list subclass or a str is not a list here
        if type(result) not in (list, tuple) or type(expected) not in (list, tuple):
            return 0.0
        if len(result) != len(expected):
            return 0.0
        return float([literal(v) for v in result] == [literal(v) for v in expected])
    raise ValueError(f"literal_match: unknown type {kind!r} (expected 'str' or 'list')")
