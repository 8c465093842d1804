"""Checks of files and trees the agent produced (OSWorld's metrics/general.py): JSON/YAML keys, CSV rows,
an SQLite query, text diffs, Python source, a .docx list, and GNOME's accessibility tree. Merged into
system.py's `METRICS`."""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rapidfuzz import fuzz

from guirl.vmpool.tasks.metrics.value_rules import match_record, match_value_to_rule

REQUIRES = ("lxml", "cssselect", "yaml")
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def check_csv(result: str | None, rules: Mapping[str, Any]) -> float:
    """1.0 when each record of `rules["expect"]` (a `{column: value}` dict) matches some row of the CSV
    file and no record of `rules["unexpect"]` matches any row."""
    if result is None:
        return 0.0
    text = _read_text(result)
    if text is None:
        return 0.0
    rows = list(csv.DictReader(io.StringIO(text)))
    found = all(any(match_record(r, row) for row in rows) for r in rules.get("expect", []))
    clean = not any(match_record(r, row) for r in rules.get("unexpect", []) for row in rows)
    return float(found and clean)


def _load_data(path: str, is_yaml: bool) -> tuple[bool, Any]:
    text = _read_text(path)
    if text is None:
        return False, None
    if is_yaml:
        import yaml  # the `osworld` extra

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            return False, None
        return data is not None, data  # an empty YAML file scores 0, as in the reference
    try:
        return True, json.loads(text)
    except json.JSONDecodeError:
        return False, None


def check_json(result: str | None, rules: Mapping[str, Any], is_yaml: bool = False) -> float:
    """1.0 when, in the JSON (or YAML, `is_yaml`) file, the value at each `expect` rule's `key` path matches
    its `{method, ref}` and the value at each `unexpect` rule's path (None when absent) does not.

    A missing key on an `expect` path, and any value a rule cannot be applied to, scores 0.0.
    """
    if result is None or not os.path.exists(result):
        return 0.0
    ok, data = _load_data(result, is_yaml)
    if not ok:
        return 0.0
    try:
        for r in rules.get("expect", []):
            value = data
            for key in r["key"]:
                value = value[key]
            if not match_value_to_rule(value, r):
                return 0.0
        for r in rules.get("unexpect", []):
            value = data
            for key in r["key"]:
                try:
                    value = value[key]
                except (KeyError, TypeError):  # the path is not there: nothing to forbid
                    value = None
                    break
            if match_value_to_rule(value, r):
                return 0.0
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        return 0.0  # a path that is not there, or a value of the wrong type for its rule (as the reference)
    return 1.0


def run_sqlite3(result: str | None, rules: Mapping[str, Any]) -> float:
    """The first column of the first row `rules["sql"]` returns on the SQLite file (None counts as 0)."""
    if not result or not os.path.isfile(result):
        return 0.0  # the reference would create an empty database there, then fail its query
    uri = Path(result).resolve().as_uri() + "?mode=ro"  # read-only: scoring never changes the file
    try:
        connection = sqlite3.connect(uri, uri=True)
    except sqlite3.Error:
        return 0.0
    try:
        row = connection.execute(rules["sql"]).fetchone()
        return float((row[0] if row else None) or 0)
    except (sqlite3.Error, TypeError, ValueError):
        return 0.0  # not a database, no such table, or a value that is no number (the reference raises)
    finally:
        connection.close()


def diff_text_file(result: str | None, expected: str) -> float:
    """The similarity (difflib's ratio over lines) of the result text file to the gold one."""
    if result is None:
        return 0.0
    got, want = _read_text(result), _read_text(expected)
    if got is None or want is None:
        return 0.0
    return difflib.SequenceMatcher(a=got.splitlines(), b=want.splitlines()).ratio()


_CLOCK_TIME = re.compile(r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)")


def check_line_number(result: str | None, rules: Mapping[str, Any]) -> float:
    """1.0 when the number of lines holding a clock time (HH:MM:SS) is `int(rules["expected"])`."""
    if result is None or not os.path.isfile(result):
        return 0.0
    text = _read_text(result)
    if text is None:
        return 0.0
    count = sum(1 for line in text.split("\n") if _CLOCK_TIME.search(line))
    try:
        return float(count == int(rules["expected"]))
    except (TypeError, ValueError):  # the reference swallows this too
        return 0.0


def fuzzy_place_math(result: str | None, rules: Mapping[str, Any]) -> float:
    """For a .docx holding exactly three words (whitespace-separated, over all paragraphs): the mean, over
    the words, of each word's best fuzzy ratio against the answers in `rules["expected"]`; else 0.0."""
    if result is None:
        return 0.0
    from docx import Document
    from docx.opc.exceptions import PackageNotFoundError

    try:
        words = [w for para in Document(result).paragraphs for w in para.text.split()]
    except (PackageNotFoundError, OSError, ValueError, KeyError):
        return 0.0  # not a .docx (the reference raises)
    if len(words) != 3:
        return 0.0
    answers = rules["expected"]
    return sum(max([fuzz.ratio(w, a) / 100 for a in answers], default=0) for w in words) / 3


def _normalize_python(text: str) -> str:
    lines = text.splitlines()
    i = 0
    # a shebang or coding line among the first three lines is file metadata, not code
    while i < min(len(lines), 3) and lines[i].strip().startswith(
        ("#!", "# -*- coding:", "# coding:", "# coding=")
    ):
        i += 1
    return "\n".join(line.expandtabs(4).rstrip() for line in lines[i:] if line.strip())


def compare_python_pure_text(result: str | None, expected: str | None) -> float:
    """1.0 when the Python file equals the gold one up to blank lines, trailing spaces, tabs (as 4 columns)
    and a leading shebang or coding line."""
    if not result or not expected:
        return 0.0
    got, want = _read_text(result), _read_text(expected)
    if got is None or want is None:
        return 0.0
    return float(_normalize_python(got) == _normalize_python(want))


_A11Y_PREFIXES = {
    "ubuntu": ("st", "attr", "cp", "doc", "docattr", "txt", "val", "act"),
    "windows": ("st", "attr", "cp", "doc", "docattr", "txt", "val", "act", "class"),
    "macos": ("st", "attr", "cp", "doc", "txt", "val", "act", "role"),
}
_A11Y_PATHS = {"st": "state", "attr": "attributes", "cp": "component", "docattr": "document/attributes"}
_A11Y_PATHS |= {
    "doc": "document",
    "txt": "text",
    "val": "value",
    "act": "action",
    "class": "class",
    "role": "role",
}
_A11Y_NAMESPACES = {
    osname: {p: f"https://accessibility.{osname}.example.org/ns/{_A11Y_PATHS[p]}" for p in prefixes}
    for osname, prefixes in _A11Y_PREFIXES.items()
}
"""The namespaces of OSWorld's accessibility-tree XML (its server writes them), by prefix, per OS."""


def check_accessibility_tree(
    result: str | None, rules: Sequence[Mapping[str, Any]], osname: str = "ubuntu"
) -> float:
    """The product over `rules` of each rule's score on the accessibility tree's XML: 0 when its `xpath`
    (or, without one, its CSS `selectors` joined by ", ") selects nothing; else 1, or with `text` the
    best match of a selected element's text (`exact`, default True: equality; else a fuzzy ratio)."""
    import lxml.etree  # the `osworld` extra (with cssselect)
    from lxml.cssselect import CSSSelector

    if not result:
        return 0.0  # no tree (the reference raises)
    namespaces = _A11Y_NAMESPACES[osname]
    try:
        tree = lxml.etree.fromstring(result.encode() if isinstance(result, str) else result)
    except (lxml.etree.XMLSyntaxError, ValueError):
        return 0.0
    total = 1.0
    for r in rules:
        if "xpath" in r:
            elements = tree.xpath(r["xpath"], namespaces=namespaces)
        elif "selectors" in r:
            elements = CSSSelector(", ".join(r["selectors"]), namespaces=namespaces)(tree)
        else:
            raise ValueError("check_accessibility_tree: a rule needs `xpath` or `selectors`")
        if not elements:
            return 0.0
        if "text" in r:
            want = r["text"]
            if r.get("exact", True):
                score = float(any((e.text or None) == want for e in elements))
            else:
                score = max(fuzz.ratio(want, e.text or None) / 100.0 for e in elements)
            total *= score
    return float(total)


METRICS: dict[str, Callable[..., float]] = {
    "check_csv": check_csv,
    "check_json": check_json,
    "run_sqlite3": run_sqlite3,
    "diff_text_file": diff_text_file,
    "check_line_number": check_line_number,
    "fuzzy_place_math": fuzzy_place_math,
    "compare_python_pure_text": compare_python_pure_text,
    "check_accessibility_tree": check_accessibility_tree,
}
"""File and tree checks, by OSWorld's names."""
