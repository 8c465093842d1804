"""OSWorld's `compare_text_file` (reference: `desktop_env/evaluators/metrics/vscode.py`), written from
the semantics in docs/osworld-compat.md §5.2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guirl.vmpool.tasks.metrics.general import read_result_text


def _collapse_blanks(text: str) -> str:
    # The reference maps tabs and newlines to spaces, strips, then collapses `\s+`; str.split() uses the
    # same whitespace class as `\s`, so this is the same string.
    return " ".join(text.split())


def compare_text_file(actual: str | None, expected: str, **options: Any) -> float:
    """1.0 when the result file's text equals the gold file's (universal newlines, so CRLF == LF).

    Options: `ignore_blanks` (collapse every run of whitespace to one space and trim the ends),
    `ignore_case`. A missing or undecodable result file scores 0.0 (the reference raises); a missing gold
    file is the task's fault and raises.
    """
    if not actual:
        return 0.0
    actual_text = read_result_text(actual)
    if actual_text is None:
        return 0.0
    expected_text = Path(expected).read_text(encoding="utf-8")
    if options.get("ignore_blanks", False):
        actual_text, expected_text = _collapse_blanks(actual_text), _collapse_blanks(expected_text)
    if options.get("ignore_case", False):
        actual_text, expected_text = actual_text.lower(), expected_text.lower()
    return float(actual_text == expected_text)
