"""The desktop and general checks: GNOME settings, time zones, files moved, clipboard, JSON/CSV/SQLite/text
checks (OSWorld's metrics/basic_os.py, general.py).

This module holds the desktop's checks (basic_os.py) and the simple value checks; the checks of files the
agent wrote (JSON/YAML, CSV, SQLite, text, Python, .docx, the accessibility tree) are in system_files.py,
merged into `METRICS` here. Scores match desktop-env 1.0.2's on every input
tests/integration/test_parity_system.py feeds both; where the reference crashes on a spoiled result (a
missing file, a command that printed nothing) guirl scores 0.0.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import Any

from guirl.vmpool.tasks.metrics import system_files


def _gsettings_list(text: str) -> list[Any] | None:
    """A GVariant string array as `gsettings get` prints it: `['a.desktop', 'b.desktop']`, or `@as []`."""
    text = text.strip()
    if text.startswith("@as "):  # an empty array is printed with its type
        text = text[4:]
    try:
        value = ast.literal_eval(text)  # never eval: the text comes from the VM
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, list | tuple) else None


def check_gnome_favorite_apps(result: str | None, rule: Mapping[str, Any]) -> float:
    """1.0 when GNOME's favorite apps (`gsettings get org.gnome.shell favorite-apps`) are exactly
    `rule["expected"]`, in any order."""
    apps = _gsettings_list(result) if isinstance(result, str) else None
    if apps is None:  # no output, or not a list (the reference evals it and raises)
        return 0.0
    expected = rule["expected"]
    try:
        return float(len(apps) == len(expected) and set(apps) == set(expected))
    except TypeError:  # unhashable entries
        return 0.0


def is_utc_0(result: str | None) -> float:
    """1.0 when `timedatectl status` shows a time zone at UTC+0 (its `Time zone:` line ends `+0000)`)."""
    if not isinstance(result, str):
        return 0.0
    # The reference reads the fourth line, which is `Time zone:` in timedatectl's output; finding the line
    # by its label gives the same answer and does not misread output with an extra line above it.
    for line in result.split("\n"):
        if line.strip().startswith("Time zone:"):
            return float(line.endswith("+0000)"))
    return 0.0


def check_moved_jpgs(result: Mapping[str, Any] | None, rule: Mapping[str, Any]) -> float:
    """1.0 when the directory listing's entries are exactly the names in `rule["expected"]`, in any order."""
    if not isinstance(result, Mapping) or not isinstance(result.get("children"), list):
        return 0.0  # no such directory (the reference raises)
    names = [node.get("name") for node in result["children"] if isinstance(node, Mapping)]
    expected = rule["expected"]
    return float(len(names) == len(expected) and set(names) == set(expected))


def is_in_vm_clickboard(config: Mapping[str, Any], result: str | None) -> float:
    """1.0 when the clipboard's text (here the expected side: `xsel --clipboard --output`) contains
    `config["expected"]`, or every entry of it when it is a list."""
    if not isinstance(result, str):  # the command did not run (the reference raises)
        return 0.0
    expected = config["expected"]
    if not isinstance(expected, list):
        return float(expected in result)
    return float(all(entry in result for entry in expected))


def match_in_list(result: Any, rules: Mapping[str, Any]) -> float:
    """1.0 when the result is one of `rules["expected"]` (a list; a str means a substring)."""
    try:
        return float(result in rules["expected"])
    except TypeError:  # a None or non-str result against a str (the reference raises)
        return 0.0


METRICS: dict[str, Callable[..., float]] = {
    "check_gnome_favorite_apps": check_gnome_favorite_apps,
    "is_utc_0": is_utc_0,
    "check_moved_jpgs": check_moved_jpgs,
    "is_in_vm_clickboard": is_in_vm_clickboard,
    "match_in_list": match_in_list,
}
"""This family's metrics, by OSWorld's names."""
_clash = METRICS.keys() & system_files.METRICS.keys()
assert not _clash, f"metrics defined twice: {sorted(_clash)}"
METRICS.update(system_files.METRICS)
