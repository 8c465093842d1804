"""OSWorld's `compare_docx_files` (reference: `desktop_env/evaluators/metrics/docs.py`), written from the
semantics in docs/osworld-compat.md §5.2, for .docx files via python-docx.

Deliberate differences from the reference: it scores ints (0/1), guirl floats; a pair of .odt files
raises `UnsupportedMetric` (the reference reads them with odfpy; no OSWorld task compares .odt, and the
extension is fixed by the task, not by the policy); a gold document that cannot be opened raises (the
reference scores 0, so the task could never be passed).
"""

from __future__ import annotations

from typing import Any

from docx import Document
from rapidfuzz import fuzz

from guirl.vmpool.tasks.metrics import UnsupportedMetric


def _collapsed(paragraphs: list[str], fold: bool) -> str:
    # one string, every whitespace run (paragraph breaks included) one space, as `re.sub(r"\s+", " ")`
    text = " ".join("\n".join(paragraphs).split())
    return text.lower() if fold else text


def _similarity(a: str, b: str) -> float:
    return fuzz.ratio(a, b) / 100.0


def compare_docx_files(file1: str | None, file2: str | None, **options: Any) -> float:
    """Compare the paragraph texts of a result document (`file1`) with the gold one (`file2`).

    Options (OSWorld's defaults): `ignore_blanks=True` compares the whole text with whitespace
    collapsed; `ignore_blanks=False` compares paragraph by paragraph (counts must match);
    `content_only` scores the fuzzy similarity of the collapsed texts; `fuzzy_match` scores similarity
    (mean over paragraphs without ignore_blanks) instead of equality; `ignore_case`; `ignore_order`
    sorts the paragraphs; `delete_empty_lines` drops blank paragraphs (after sorting).
    """
    ignore_blanks = options.get("ignore_blanks", True)
    fold = options.get("ignore_case", False)
    fuzzy = options.get("fuzzy_match", False)
    if not file1 or not file2:
        return 0.0
    if file1.endswith(".odt") and file2.endswith(".odt"):
        raise UnsupportedMetric("compare_docx_files on .odt documents is not implemented")
    if not (file1.endswith(".docx") and file2.endswith(".docx")):
        return 0.0
    try:
        result = [p.text for p in Document(file1).paragraphs]
    except Exception:  # python-docx raises assorted errors for a file that is no document
        return 0.0
    gold = [p.text for p in Document(file2).paragraphs]
    if options.get("ignore_order", False):
        result, gold = sorted(result), sorted(gold)
    if options.get("delete_empty_lines", False):
        result, gold = [p for p in result if p.strip()], [p for p in gold if p.strip()]

    if options.get("content_only", False):
        return _similarity(_collapsed(result, fold), _collapsed(gold, fold))
    if ignore_blanks:
        a, b = _collapsed(result, fold), _collapsed(gold, fold)
        return _similarity(a, b) if fuzzy else float(a == b)
    if len(result) != len(gold):
        return 0.0
    if fold:
        result, gold = [p.lower() for p in result], [p.lower() for p in gold]
    if fuzzy:
        if not result:
            return 1.0
        return sum(_similarity(a, b) for a, b in zip(result, gold)) / len(result)
    return float(result == gold)
