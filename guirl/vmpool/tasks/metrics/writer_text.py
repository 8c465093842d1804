"""Writer metrics on document text (reference: `desktop_env/evaluators/metrics/docs.py`, and
`compare_conference_city_in_order` from `metrics/table.py`): reference sections, de-duplicated train
records, paragraphs without blank lines, yellow highlighting left in an .odt, and a spreadsheet's cities.

Registered through `writer.METRICS`. Differences from the reference are listed in
tests/integration/test_parity_writer.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import openpyxl
from docx import Document

from guirl.vmpool.tasks.metrics.docs import _collapsed, _similarity

REQUIRES = ("odf",)
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""


_YELLOW = "#ffff00"


def _docx_paragraphs(path: Any, gold: bool = False) -> list[str] | None:
    """The body paragraphs' texts of a .docx; None for a result python-docx cannot read (a gold
    document that cannot be read raises: the task could never be passed)."""
    if gold:
        return [p.text for p in Document(path).paragraphs]
    try:
        return [p.text for p in Document(path).paragraphs]
    except Exception:  # python-docx raises assorted errors for a non-document
        return None


def _both_docx(file1: Any, file2: Any) -> bool:
    return (
        isinstance(file1, str)
        and isinstance(file2, str)
        and file1.endswith(".docx")
        and file2.endswith(".docx")
    )


def compare_docx_files_and_ignore_new_lines(file1: str | None, file2: str | None, **options: Any) -> float:
    """compare_docx_files after dropping empty paragraphs: with `ignore_blanks` (default True) the
    whitespace-collapsed texts must be equal, else the paragraphs one by one."""
    if not file1 or not file2 or not _both_docx(file1, file2):
        return 0.0
    result = _docx_paragraphs(file1)
    if result is None:
        return 0.0
    gold = _docx_paragraphs(file2, gold=True)
    result, gold = [p for p in result if p != ""], [p for p in gold if p != ""]
    if options.get("ignore_blanks", True):
        return float(_collapsed(result, False) == _collapsed(gold, False))
    return float(result == gold)


def compare_references(file1: str | None, file2: str | None, **options: Any) -> float:
    """Fuzzy similarity of the reference lists: the non-blank paragraphs after the first paragraph that
    is exactly `reference_indicator` (default "References"). Both lists absent scores 1.0, one absent or
    lists of different lengths 0.0; otherwise the mean rapidfuzz ratio r is rescaled above
    `reference_base_result` b (default 0.5): (r - b) / (1 - b) when r >= b + 0.01, else 0.0. Other
    options (the suite passes `content_only`) are ignored, as in the reference."""
    indicator = options.get("reference_indicator", "References")
    base = options.get("reference_base_result", 0.5)
    if not file1 or not file2 or not _both_docx(file1, file2):
        return 0.0
    doc1 = _docx_paragraphs(file1)
    if doc1 is None:
        return 0.0
    doc2 = _docx_paragraphs(file2, gold=True)
    if indicator not in doc1 and indicator not in doc2:
        return 1.0
    if indicator not in doc1 or indicator not in doc2:
        return 0.0
    ref1 = [p for p in doc1[doc1.index(indicator) + 1 :] if p.strip()]
    ref2 = [p for p in doc2[doc2.index(indicator) + 1 :] if p.strip()]
    if len(ref1) != len(ref2):
        return 0.0
    if not ref1:  # two empty reference sections agree (the reference divides by zero)
        return 1.0
    total = 0.0
    for r1, r2 in zip(ref1, ref2):
        total += _similarity(r1, r2)  # summed in order, so the float matches the reference's
    mean = total / len(ref1)
    return (mean - base) / (1 - base) if mean >= base + 0.01 else 0.0


def _train_lines(path: Any, gold: bool = False) -> tuple[list[str], list[str]] | None:
    """(stripped non-blank lines, train ids) of a record document; a record is `time, id, station,
    platform`: exactly four comma-separated fields."""
    paragraphs = _docx_paragraphs(path, gold)
    if paragraphs is None:
        return None
    lines = [text.strip() for text in paragraphs if text.strip()]
    return lines, [line.split(",")[1].strip() for line in lines if len(line.split(",")) == 4]


def compare_unique_train_records(processed: str | None, expected: Any, **options: Any) -> float:
    """1.0 when the processed record file keeps only lines of the initial file (`expected[1]`), has no
    train id twice, has the gold's (`expected[0]`) set of train ids and as many lines as the gold."""
    if not processed or not isinstance(expected, list) or len(expected) < 2:
        return 0.0
    gold_path, initial_path = expected[0], expected[1]
    if not gold_path or not initial_path:
        return 0.0
    ours = _train_lines(processed)
    if ours is None:
        return 0.0
    gold, initial = _train_lines(gold_path, gold=True), _train_lines(initial_path, gold=True)
    assert gold is not None and initial is not None
    (lines, ids), (gold_lines, gold_ids) = ours, gold
    if not set(lines) <= set(initial[0]) or len(ids) != len(set(ids)):
        return 0.0
    return float(set(ids) == set(gold_ids) and len(lines) == len(gold_lines))


def _odt_paragraphs(doc: Any) -> list[str]:
    """Every text:p of the document (footers included), as the reference reads them: text directly in
    the paragraph or directly in a span; fields, tabs and text:s spaces are left out."""
    from odf.namespaces import TEXTNS
    from odf.text import P

    out = []
    for paragraph in doc.getElementsByType(P):
        parts = []
        for node in paragraph.childNodes:
            if node.nodeType == node.TEXT_NODE:
                parts.append(node.data)
            elif node.nodeType == node.ELEMENT_NODE and node.qname == (TEXTNS, "span"):
                parts.extend(child.data for child in node.childNodes if child.nodeType == child.TEXT_NODE)
        out.append("".join(parts))
    return out


def check_highlighted_words(result: str | None, gold: str | None) -> float:
    """For two .odt documents: 1.0 when their texts match (compare_docx_files' default comparison)
    and no span of the result uses an automatic style with a yellow (#ffff00) background."""
    if not result or not gold:
        return 0.0
    if not (isinstance(result, str) and isinstance(gold, str)):
        return 0.0
    if not (result.endswith(".odt") and gold.endswith(".odt")):
        # the reference's text gate also accepts two .docx, but then fails to open them as .odt
        return 0.0
    from odf.namespaces import FONS, STYLENS, TEXTNS
    from odf.opendocument import load as load_odf
    from odf.text import Span

    try:
        doc = load_odf(result)
    except Exception:  # odfpy raises zip, XML and KeyError alike for a non-document
        return 0.0
    if _collapsed(_odt_paragraphs(doc), False) != _collapsed(_odt_paragraphs(load_odf(gold)), False):
        return 0.0
    yellow = {
        style.getAttrNS(STYLENS, "name")
        for style in doc.automaticstyles.childNodes
        if style.nodeType == style.ELEMENT_NODE
        and any(
            prop.nodeType == prop.ELEMENT_NODE and prop.getAttrNS(FONS, "background-color") == _YELLOW
            for prop in style.childNodes
        )
    }
    return float(
        not any(span.getAttrNS(TEXTNS, "style-name") in yellow for span in doc.getElementsByType(Span))
    )


def compare_conference_city_in_order(result: str | None, rules: dict[str, Any]) -> float:
    """1.0 when each of cells C2:C22 of the workbook's active sheet contains its expected city (a str,
    or a list of accepted names), in order; an empty or numeric cell scores 0.0."""
    expected = rules["expected"]
    if not result or not isinstance(result, (str, os.PathLike)):
        return 0.0
    try:
        sheet = openpyxl.load_workbook(result).active
    except Exception:  # openpyxl raises zip, XML and KeyError alike for a non-workbook
        return 0.0
    actual = [cell.value for row in sheet["C2:C22"] for cell in row]
    if len(expected) < len(actual):
        return 0.0
    for value, accepted in zip(actual, expected):
        if not isinstance(value, str):
            return 0.0
        if not isinstance(accepted, (str, list)):
            return 0.0
        names = [accepted] if isinstance(accepted, str) else accepted
        if not any(name in value for name in names):
            return 0.0
    return 1.0


METRICS: dict[str, Callable[..., float]] = {
    "compare_docx_files_and_ignore_new_lines": compare_docx_files_and_ignore_new_lines,
    "compare_references": compare_references,
    "compare_unique_train_records": compare_unique_train_records,
    "check_highlighted_words": check_highlighted_words,
    "compare_conference_city_in_order": compare_conference_city_in_order,
}
"""Registered through `writer.METRICS`."""
