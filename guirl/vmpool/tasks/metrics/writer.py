"""LibreOffice Writer documents beyond compare_docx_files: OSWorld's formatting metrics (reference:
`desktop_env/evaluators/metrics/docs.py`), read with python-docx as the reference reads them.

The text-content metrics (references, train records, highlighting in .odt, conference cities) are in
`writer_text.py`, the OCR metric in `writer_ocr.py`; all are exported here as `METRICS`.

Differences from the reference, on purpose: every metric returns a float; a result document that cannot
be read, or on which the reference crashes (an empty body, an uncoloured word, a ragged table, an image
Pillow cannot decode), scores 0.0 or is compared as well as it can be instead of raising; a gold document
that cannot be opened raises, as guirl's compare_docx_files does (the task could never be passed). The
parity test lists each difference (tests/integration/test_parity_writer.py).
"""

from __future__ import annotations

import io
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from docx import Document
from docx.enum.text import WD_PARAGRAPH_ALIGNMENT, WD_TAB_ALIGNMENT
from docx.oxml.ns import qn
from PIL import Image, UnidentifiedImageError

from guirl.vmpool.tasks.metrics import writer_ocr, writer_text
from guirl.vmpool.tasks.metrics.docs import compare_docx_files

REQUIRES = ("skimage",)
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""


_RED, _BLUE = (255, 0, 0), (0, 0, 255)
_XCU_NS = {"oor": "http://openoffice.org/2001/registry"}


def _result_docx(path: Any) -> Any:
    """The policy's document, or None when it is missing or no .docx python-docx can read."""
    if not path or not isinstance(path, (str, os.PathLike)):
        return None
    try:
        return Document(path)
    except Exception:  # python-docx raises assorted errors (zip, XML, KeyError) for a non-document
        return None


def _same_text(result: Any, gold: Any) -> bool:
    """The reference's gate before a formatting check: compare_docx_files with its default options."""
    return bool(compare_docx_files(result, gold))


def compare_line_spacing(result: str | None, gold: str | None) -> float:
    """1.0 when the texts match and every paragraph has the gold's line spacing (python-docx's value:
    a multiple such as 2.0, a fixed Length, or None when the paragraph sets none)."""
    if not result or not gold or not _same_text(result, gold):
        return 0.0
    ours, theirs = _result_docx(result), Document(gold)
    if ours is None or len(ours.paragraphs) != len(theirs.paragraphs):
        return 0.0
    return float(
        all(
            a.paragraph_format.line_spacing == b.paragraph_format.line_spacing
            for a, b in zip(ours.paragraphs, theirs.paragraphs)
        )
    )


def compare_docx_tables(result: str | None, gold: str | None) -> float:
    """1.0 when the documents have as many top-level tables, each of the gold's shape, with the same
    stripped cell texts."""
    if not result or not gold:
        return 0.0
    ours = _result_docx(result)
    if ours is None:
        return 0.0
    tables1, tables2 = ours.tables, Document(gold).tables
    if len(tables1) != len(tables2):
        return 0.0
    for t1, t2 in zip(tables1, tables2):
        rows, cols = len(t1.rows), len(t1.columns)
        if rows != len(t2.rows) or cols != len(t2.columns):
            return 0.0
        try:
            for i in range(rows):
                for j in range(cols):
                    if t1.cell(i, j).text.strip() != t2.cell(i, j).text.strip():
                        return 0.0
        except IndexError:  # a row with fewer cells than the grid: python-docx cannot address it
            return 0.0
    return 1.0


def _pixels(blob: bytes) -> bytes:
    """An image's decoded pixels, or its bytes when Pillow cannot decode it (EMF, SVG)."""
    try:
        with Image.open(io.BytesIO(blob)) as image:
            return image.tobytes()
    except (UnidentifiedImageError, OSError):
        return blob


def _images(doc: Any) -> list[bytes]:
    """The main part's image relationships, in the order python-docx lists them."""
    out = []
    for rel in doc.part.rels.values():
        if "image" in rel.reltype:
            out.append(rel.target_ref.encode() if rel.is_external else _pixels(rel.target_part.blob))
    return out


def compare_docx_images(result: str | None, gold: str | None) -> float:
    """1.0 when the documents embed as many images, pairwise with identical decoded pixels."""
    if not result or not gold:
        return 0.0
    ours = _result_docx(result)
    if ours is None:
        return 0.0
    return float(_images(ours) == _images(Document(gold)))


def _counted_tabs(paragraph: Any) -> list[Any]:
    # a cleared tab stop, and the default left stop at 0, are not the paragraph's own layout
    return [
        t
        for t in paragraph.paragraph_format.tab_stops
        if not (
            t.alignment == WD_TAB_ALIGNMENT.CLEAR
            or (t.alignment == WD_TAB_ALIGNMENT.LEFT and t.position == 0)
        )
    ]


def check_tabstops(result: str | None, gold: str | None, **options: Any) -> float:
    """Tab stops of the non-blank paragraphs against the gold: 0.0 when a paragraph has a different
    number of stops or a different alignment; else 1 minus the mean, over paragraphs, of the summed
    position differences as a fraction of the gold's text width.

    `word_number_split_by_tabstop=n` (with `index`, default 0) first requires that the `index`-th
    tab-separated part of every result paragraph has exactly n words.
    """
    if not result or not gold:
        return 0.0
    ours = _result_docx(result)
    if ours is None:
        return 0.0
    theirs = Document(gold)
    para1 = [p for p in ours.paragraphs if p.text.strip()]
    para2 = [p for p in theirs.paragraphs if p.text.strip()]
    if len(para1) != len(para2):
        return 0.0
    if not para1:  # nothing to lay out on either side (the reference divides by zero)
        return 1.0
    words = options.get("word_number_split_by_tabstop")
    if words is not None:
        index = options.get("index", 0)
        for p in para1:
            parts = p.text.split("\t")
            if not -len(parts) <= index < len(parts):
                return 0.0
            if len([w for w in re.split(r"\s", parts[index]) if w.strip()]) != words:
                return 0.0
    section = theirs.sections[0]
    width = section.page_width - section.left_margin - section.right_margin
    minus = 0.0
    for p1, p2 in zip(para1, para2):
        tabs1, tabs2 = _counted_tabs(p1), _counted_tabs(p2)
        if len(tabs1) != len(tabs2):
            return 0.0
        difference = 0.0
        for t1, t2 in zip(tabs1, tabs2):
            if t1.alignment != t2.alignment:
                return 0.0
            difference += abs(t1.position - t2.position)
        minus += difference / width
    # far-off stops can push the reference's score below 0; a score stays in [0, 1]
    return max(0.0, 1 - minus / len(para1))


def compare_subscript_contains(result: str | None, gold: str | None) -> float:
    """1.0 when some run is subscript in both documents at the same paragraph and run position."""
    if not result or not gold:
        return 0.0
    ours = _result_docx(result)
    if ours is None:
        return 0.0
    for p1, p2 in zip(ours.paragraphs, Document(gold).paragraphs):
        for r1, r2 in zip(p1.runs, p2.runs):
            if r1.font.subscript and r2.font.subscript:
                return 1.0
    return 0.0


def has_page_numbers_in_footers(result: str | None) -> float:
    """1.0 when the first footer paragraph of every section contains a digit (a page-number field's
    cached value counts, as in the reference)."""
    doc = _result_docx(result)
    if doc is None:
        return 0.0
    for section in doc.sections:
        paragraphs = section.footer.paragraphs
        text = paragraphs[0].text if paragraphs else ""
        if not any(ch.isdigit() for ch in text):
            return 0.0
    return 1.0


def compare_font_names(result: str | None, rules: dict[str, Any]) -> float:
    """1.0 when every run of the body's paragraphs names `rules["font_name"]` as its (ASCII) font."""
    expected = rules["font_name"]
    doc = _result_docx(result)
    if doc is None:
        return 0.0
    return float(all(run.font.name == expected for p in doc.paragraphs for run in p.runs))


def is_first_line_centered(result: str | None) -> float:
    """1.0 when the document's first paragraph is directly centre-aligned."""
    doc = _result_docx(result)
    if doc is None or not doc.paragraphs:  # an empty body has no first line (the reference raises)
        return 0.0
    return float(doc.paragraphs[0].paragraph_format.alignment == WD_PARAGRAPH_ALIGNMENT.CENTER)


def evaluate_strike_through_last_paragraph(result: str | None, gold: str | None) -> float:
    """1.0 when the texts match and every run of the last paragraph is struck through."""
    if not result or not gold or not _same_text(result, gold):
        return 0.0
    doc = _result_docx(result)
    if doc is None or not doc.paragraphs:
        return 0.0
    return float(all(run.font.strike for run in doc.paragraphs[-1].runs))


def _delta_e(rgb: Any, target: tuple[int, int, int]) -> float:
    """CIEDE2000 distance between two sRGB colours, as the reference computes it (scikit-image)."""
    from skimage.color import deltaE_ciede2000, rgb2lab

    lab1 = rgb2lab([c / 255.0 for c in rgb])
    lab2 = rgb2lab([c / 255.0 for c in target])
    return float(deltaE_ciede2000(lab1, lab2))


def evaluate_colored_words_in_tables(result: str | None, gold: str | None, **options: Any) -> float:
    """1.0 when the texts match and, in every table cell, each run starting with a vowel is red and each
    other run blue, within CIEDE2000 distance `threshold` (default 3.5)."""
    if not result or not gold or not _same_text(result, gold):
        return 0.0
    doc = _result_docx(result)
    if doc is None:
        return 0.0
    threshold = options.get("threshold", 3.5)
    for table in doc.tables:
        for row in table.rows:
            for cell in row.cells:
                for paragraph in cell.paragraphs:
                    for run in paragraph.runs:
                        if not run.text:
                            continue
                        rgb = run.font.color.rgb
                        if rgb is None:  # no colour (or "automatic"): not coloured (the reference raises)
                            return 0.0
                        target = _RED if run.text[0].lower() in "aeiou" else _BLUE
                        if _delta_e(rgb, target) > threshold:
                            return 0.0
    return 1.0


def check_italic_font_size_14(result: str | None, gold: str | None) -> float:
    """1.0 when the texts match and every directly italic run of the body is set in 14 pt."""
    if not result or not gold or not _same_text(result, gold):
        return 0.0
    doc = _result_docx(result)
    if doc is None:
        return 0.0
    for paragraph in doc.paragraphs:
        for run in paragraph.runs:
            if run.italic and (run.font.size is None or run.font.size.pt != 14):
                return 0.0
    return 1.0


def contains_page_break(result: str | None, rules: Any) -> float:
    """1.0 when the body's paragraphs hold at least one page break (`<w:br w:type="page"/>` in a run),
    and exactly `rules["page_break_count"]` of them when the rules give a count."""
    doc = _result_docx(result)
    if doc is None:
        return 0.0
    expected = rules.get("page_break_count") if isinstance(rules, dict) else None
    count = sum(
        1
        for paragraph in doc.paragraphs
        for run in paragraph.runs
        for br in run.element.iter(qn("w:br"))
        if br.get(qn("w:type")) == "page"
    )
    if expected is not None and count != expected:
        return 0.0
    return float(count > 0)


def find_default_font(config_file: str | None, rules: dict[str, Any]) -> float:
    """1.0 when LibreOffice's user registry (registrymodifications.xcu) sets Writer's default
    (Standard) font to `rules["font_name"]`; the last such entry wins, as LibreOffice reads it."""
    expected = rules["font_name"]
    if not config_file:
        return 0.0
    font = None
    try:
        root = ET.parse(config_file).getroot()
    except (ET.ParseError, OSError):
        root = None
    if root is not None:
        for item in root.findall('.//item[@oor:path="/org.openoffice.Office.Writer/DefaultFont"]', _XCU_NS):
            for prop in item.findall('.//prop[@oor:name="Standard"]', _XCU_NS):
                for value in prop.findall("value"):
                    font = value.text
    return float(font == expected)


METRICS: dict[str, Callable[..., float]] = {
    "compare_line_spacing": compare_line_spacing,
    "compare_docx_tables": compare_docx_tables,
    "compare_docx_images": compare_docx_images,
    "check_tabstops": check_tabstops,
    "compare_subscript_contains": compare_subscript_contains,
    "has_page_numbers_in_footers": has_page_numbers_in_footers,
    "compare_font_names": compare_font_names,
    "is_first_line_centered": is_first_line_centered,
    "evaluate_strike_through_last_paragraph": evaluate_strike_through_last_paragraph,
    "evaluate_colored_words_in_tables": evaluate_colored_words_in_tables,
    "check_italic_font_size_14": check_italic_font_size_14,
    "contains_page_break": contains_page_break,
    "find_default_font": find_default_font,
    **writer_text.METRICS,
    **writer_ocr.METRICS,
}
"""This family's metrics, by OSWorld's names."""
