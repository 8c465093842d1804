"""OSWorld's `compare_table` for spreadsheets (reference: `desktop_env/evaluators/metrics/table.py`),
written from the semantics in docs/osworld-compat.md §5.2.

`compare_table(result, expected=None, rules=[...])` applies the rules in order and scores 1.0 only when
all pass. guirl implements the rule types `sheet_name`, `sheet_data`, `sheet_print`, `sheet_fuzzy` and
`check_cell`; every other type OSWorld knows (chart, style, pivot_table, ...) raises `UnsupportedMetric`.

Deliberate differences from the reference:
- Rules are validated before anything is scored, so an unsupported rule type, `sheet_fuzzy` type,
  `check_cell` property or method raises on every call (the reference raises only when the loop reaches
  the rule, or for check_cell quietly scores 0), and the task never silently depends on the policy.
- A sheet that cannot be loaded scores 0.0 wherever it appears (the reference crashes when it is the
  second sheet of `sheet_data`, or a missing CSV with `ignore_case` in `sheet_print`).
- A rule that needs the expected workbook when the task has none raises ValueError (the reference
  scores 0 or raises NotImplementedError, depending on the rule).
- Raw cell values (`sheet_fuzzy`, `check_cell` value) find a sheet's XML part through the workbook's
  relationships; the reference assumes `sheet<sheetId>.xml`, which is the same part in every book
  LibreOffice or openpyxl writes (the books OSWorld's tasks use). A formula without a cached value reads
  as an empty cell (the reference crashes in sheet_fuzzy); an inline string with edge spaces, as
  openpyxl writes it, reads as its text (the reference compares the repr of xmltodict's dict).
"""

from __future__ import annotations

import contextlib
import operator
import os
import posixpath
import re
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import openpyxl
import pandas as pd
from openpyxl.cell.cell import MergedCell
from openpyxl.utils import get_column_letter
from openpyxl.worksheet.cell_range import CellRange
from openpyxl.worksheet.worksheet import Worksheet
from rapidfuzz import fuzz

from guirl.vmpool.tasks.metrics import UnsupportedMetric

Rule = Mapping[str, Any]

_MAIN = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_DOC_REL = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_PKG_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"


# ---- raw cell values, read from the sheet's XML as the reference's `read_cell_value` reads them ----


def _xml_text(element: ET.Element | None) -> str | None:
    # The reference parses cells with xmltodict, which strips text and gives None for blank text.
    if element is None or element.text is None:
        return None
    return element.text.strip() or None


def _raw_value(cell: ET.Element, shared: list[str]) -> Any:
    """A number as float (whatever its format: dates are serials), a string as str, else None."""
    kind = cell.get("t", "n")
    text = _xml_text(cell.find(f"{_MAIN}v"))
    if kind in ("n", "s"):
        if text is None:  # e.g. a formula openpyxl wrote, with no cached value (the reference crashes)
            return None
        try:
            return float(text) if kind == "n" else shared[int(text)]
        except (ValueError, IndexError):
            return None
    if kind in ("str", "e"):  # a formula's cached string, an error code such as #DIV/0!
        return text
    if kind == "inlineStr":  # what openpyxl writes for a str; a rich-text one (<is><r>) reads as None
        inline = cell.find(f"{_MAIN}is")
        plain = None if inline is None else inline.find(f"{_MAIN}t")
        if plain is not None and plain.attrib:
            # openpyxl marks text with edge spaces xml:space="preserve"; xmltodict then yields a dict and the
            # reference compares its repr. guirl reads the text: this one input scores differently.
            return plain.text
        return _xml_text(plain)
    return None  # booleans ("b") and ISO dates ("d") read as None in the reference too


def _sheet_part(archive: zipfile.ZipFile, sheet: str) -> str | None:
    workbook = ET.fromstring(archive.read("xl/workbook.xml"))
    rel_id = next(
        (s.get(f"{_DOC_REL}id") for s in workbook.iter(f"{_MAIN}sheet") if s.get("name") == sheet), None
    )
    if rel_id is None:
        return None
    rels = ET.fromstring(archive.read("xl/_rels/workbook.xml.rels"))
    for rel in rels.iter(f"{_PKG_REL}Relationship"):
        if rel.get("Id") == rel_id:
            target = rel.get("Target", "")
            return target.lstrip("/") if target.startswith("/") else posixpath.normpath(f"xl/{target}")
    return None


def _shared_strings(archive: zipfile.ZipFile) -> list[str]:
    try:
        table = ET.fromstring(archive.read("xl/sharedStrings.xml"))
    except KeyError:  # a book without strings has no sharedStrings part
        return []
    # every <t> under an <si>, phonetic runs included, as the reference's selector takes them
    return ["".join(t.text or "" for t in si.iter(f"{_MAIN}t")) for si in table.iter(f"{_MAIN}si")]


def read_raw_cells(path: str, sheet: str) -> dict[str, Any]:
    """Coordinate ("A1") -> raw value of every cell of `sheet`; empty when the book or sheet is unreadable."""
    try:
        with zipfile.ZipFile(path) as archive:
            shared = _shared_strings(archive)
            part = _sheet_part(archive, sheet)
            if part is None:
                return {}
            root = ET.fromstring(archive.read(part))
    except (OSError, KeyError, zipfile.BadZipFile, ET.ParseError):
        return {}
    cells: dict[str, Any] = {}
    for cell in root.iter(f"{_MAIN}c"):
        ref = cell.get("r")
        if ref is not None and ref not in cells:
            cells[ref] = _raw_value(cell, shared)
    return cells


@dataclass
class _Book:
    """One workbook, opened the two ways the rules need it."""

    path: str
    workbook: openpyxl.Workbook  # styles and merged cells, for check_cell
    frames: pd.ExcelFile  # typed sheet data, for sheet_data
    raw: dict[str, dict[str, Any]] = field(default_factory=dict)  # sheet -> coordinate -> raw value

    @property
    def sheet_names(self) -> list[str]:
        # pandas' list, as the reference uses: worksheets only (openpyxl's also has chartsheets)
        return list(self.frames.sheet_names)

    def raw_cells(self, sheet: str | None) -> dict[str, Any]:
        if sheet is None:
            return {}
        if sheet not in self.raw:
            self.raw[sheet] = read_raw_cells(self.path, sheet)
        return self.raw[sheet]


@contextlib.contextmanager
def _open_book(path: str) -> Iterator[_Book]:
    workbook = openpyxl.load_workbook(filename=path)
    with pd.ExcelFile(path) as frames:
        yield _Book(path, workbook, frames)


# ---- sheet references: an int (result book), "RI<n>", "RN<name>", "EI<n>", "EN<name>" ----


def _check_sheet_ref(ref: Any) -> None:
    if isinstance(ref, int) or (isinstance(ref, str) and ref[:2] in ("RI", "RN", "EI", "EN")):
        return
    raise ValueError(f"compare_table: unrecognised sheet index {ref!r}")


def _resolve(ref: int | str, result: _Book, expected: _Book | None) -> tuple[_Book, str | None]:
    """The book a sheet reference points into and the sheet's name (None when the index is out of range)."""
    if isinstance(ref, int):
        book, index = result, ref
    else:
        if ref[0] == "R":
            book = result
        elif expected is None:
            raise ValueError(f"compare_table: sheet {ref!r} needs the expected workbook, but there is none")
        else:
            book = expected
        if ref[1] == "N":
            return book, ref[2:]
        try:
            index = int(ref[2:])
        except ValueError:
            return book, None
    try:
        return book, book.sheet_names[index]
    except IndexError:
        return book, None


# ---- the rules ----


def _sheet_name(rule: Rule, result: _Book, expected: _Book | None) -> bool:
    if expected is None:
        raise ValueError("compare_table: rule sheet_name needs the expected workbook, but there is none")
    return result.sheet_names == expected.sheet_names


def _frame(book: _Book, sheet: str | None) -> pd.DataFrame | None:
    if sheet is None:
        return None
    try:
        return pd.read_excel(book.frames, sheet_name=sheet)
    except Exception:  # pandas raises assorted errors for a missing or malformed sheet: unusable data
        return None


def _sheet_data(rule: Rule, result: _Book, expected: _Book | None) -> bool:
    """Cell values as pandas reads them, rounded to `precision` digits; dtype-strict (1 != 1.00001)."""
    frames = [_frame(*_resolve(rule[key], result, expected)) for key in ("sheet_idx0", "sheet_idx1")]
    if frames[0] is None or frames[1] is None:
        return False
    precision = rule.get("precision", 4)
    return frames[0].round(precision).equals(frames[1].round(precision))


def _printed_lines(book: _Book, sheet: str | None) -> list[str] | None:
    """The CSV export `<book stem>-<sheet>.csv` that the task's postconfig wrote next to the book."""
    if sheet is None:
        return None
    try:
        with open(f"{os.path.splitext(book.path)[0]}-{sheet}.csv", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # the reference's fallbacks end at latin-1, which decodes any bytes
        text = data.decode("latin-1")
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _sheet_print(rule: Rule, result: _Book, expected: _Book | None) -> bool:
    """The sheets as printed (CSV lines, stripped, trailing blank lines dropped) are equal."""
    printed = [_printed_lines(*_resolve(rule[key], result, expected)) for key in ("sheet_idx0", "sheet_idx1")]
    if printed[0] is None or printed[1] is None:
        return False
    if rule.get("ignore_case", False):
        printed = [[line.lower() for line in lines] for lines in printed]
    return printed[0] == printed[1]


_FUZZY: dict[str, Callable[[str, str, Rule], bool]] = {
    "includes": lambda a, b, _: b in a,
    "included_by": lambda a, b, _: a in b,
    "fuzzy_match": lambda a, b, spec: fuzz.ratio(a, b) >= spec.get("threshold", 85.0),
    "exact_match": lambda a, b, _: a == b,
}


def _coordinates(ranges: str | list[str]) -> Iterator[str]:
    """Each cell, as "A1", of a space-separated range string or a list of ranges ("A1:B6")."""
    for text in ranges.split() if isinstance(ranges, str) else ranges:
        for row, col in CellRange(text).cells:
            yield f"{get_column_letter(col)}{row}"


def _fuzzy_text(value: Any, spec: Rule) -> str:
    text = str(value)  # a missing cell is the string "None", as in the reference
    for old, new in spec.get("normalization", []):
        text = text.replace(old, new)
    if "trim_leadings" in spec:
        text = text.lstrip(spec["trim_leadings"])
    if "trim_trailings" in spec:
        text = text.rstrip(spec["trim_trailings"])
    if "ignore_chars" in spec:
        text = "".join(ch for ch in text if ch not in set(spec["ignore_chars"]))
    if spec.get("ignore_case", False):
        text = text.lower()
    return text


def _sheet_fuzzy(rule: Rule, result: _Book, expected: _Book | None) -> bool:
    """Range by range, each cell's raw value as text compared by the spec's `type`."""
    left = _resolve(rule["sheet_idx0"], result, expected)
    right = _resolve(rule["sheet_idx1"], result, expected)
    left_cells, right_cells = left[0].raw_cells(left[1]), right[0].raw_cells(right[1])
    for spec in rule["rules"]:
        compare = _FUZZY[spec["type"]]
        for coordinate in _coordinates(spec["range"]):
            a = _fuzzy_text(left_cells.get(coordinate), spec)
            b = _fuzzy_text(right_cells.get(coordinate), spec)
            if not compare(a, b, spec):
                return False
    return True


def _if_valued(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    # font properties of an empty cell read as None, as in the reference
    return lambda cell: read(cell) if cell.value is not None else None


_CELL_STYLES: dict[str, Callable[[Any], Any]] = {
    "merge": lambda cell: isinstance(cell, MergedCell),
    "bgcolor": lambda cell: cell.fill.fgColor.rgb,  # OSWorld reads the fill's fgColor for both names
    "fgcolor": lambda cell: cell.fill.fgColor.rgb,
    "fill_type": lambda cell: cell.fill.tagname,
    "font_name": _if_valued(lambda cell: cell.font.name),
    "font_family": _if_valued(lambda cell: cell.font.family),
    "font_color": _if_valued(lambda cell: cell.font.color.rgb),
    "font_bold": _if_valued(lambda cell: cell.font.bold),
    "font_italic": _if_valued(lambda cell: cell.font.italic),
    "font_underline": _if_valued(lambda cell: cell.font.underline),
    "font_size": _if_valued(lambda cell: cell.font.size),
    "number_format": _if_valued(lambda cell: cell.number_format if cell.data_type == "n" else None),
}
_ORDER_METHODS = {"eq", "ne", "lt", "le", "gt", "ge"}


def _check_method(method: Any) -> None:
    if not isinstance(method, str):
        raise ValueError(f"compare_table: check_cell method must be a str, not {method!r}")
    if method.startswith("re"):  # the reference takes any method starting with "re" as a regex
        for flag in method.split(".")[1:]:
            if not isinstance(getattr(re, flag, None), re.RegexFlag):
                raise ValueError(f"compare_table: check_cell method {method!r} has an unknown regex flag")
    elif method.startswith("approx:"):
        float(method.split(":")[1])  # a malformed threshold raises ValueError here, not at scoring
    elif method not in _ORDER_METHODS | {"str_list_eq", "str_set_eq"}:
        raise UnsupportedMetric(f"compare_table check_cell method {method!r} is not implemented")


def _matches(value: Any, method: str, ref: Any) -> bool:
    """A cell property against a rule's `ref`; any type mismatch is a failed check, as in the reference."""
    try:
        if method.startswith("re"):
            flags = reduce(operator.or_, (getattr(re, f) for f in method.split(".")[1:]), re.RegexFlag(0))
            return re.search(ref, value, flags) is not None
        if method in _ORDER_METHODS:
            return bool(getattr(operator, method)(value, ref))
        if method.startswith("approx:"):
            return abs(float(value) - ref) <= float(method.split(":")[1])
        if method in ("str_list_eq", "str_set_eq"):
            container = list if method == "str_list_eq" else set
            return container(value.strip("\"'").split(",")) == container(ref)
    except (TypeError, ValueError, AttributeError):
        return False
    raise AssertionError(f"unvalidated method {method!r}")


def _check_cell(rule: Rule, result: _Book, expected: _Book | None) -> bool:
    """Properties of one cell: `value` (raw, numbers as float) or a style, each matched by a method."""
    book, sheet = _resolve(rule["sheet_idx"], result, expected)
    if sheet is None or sheet not in book.workbook.sheetnames:
        return False
    worksheet = book.workbook[sheet]
    if not isinstance(worksheet, Worksheet):  # a chartsheet has no cells
        return False
    coordinate = rule["coordinate"]
    cell = worksheet[coordinate]
    for prop, spec in rule["props"].items():
        if prop == "value":
            value = book.raw_cells(sheet).get(coordinate)
        else:
            try:
                value = _CELL_STYLES[prop](cell)
            except AttributeError:  # no fill, no colour object: the reference reads None
                value = None
        if not _matches(value, spec["method"], spec["ref"]):
            return False
    return True


_RULES: dict[str, Callable[[Rule, _Book, _Book | None], bool]] = {
    "sheet_name": _sheet_name,
    "sheet_data": _sheet_data,
    "sheet_print": _sheet_print,
    "sheet_fuzzy": _sheet_fuzzy,
    "check_cell": _check_cell,
}


def validate_rules(rules: list[Rule]) -> None:
    """Raise UnsupportedMetric for a rule guirl cannot score, ValueError for a malformed one."""
    for rule in rules:
        kind = rule["type"]
        if kind not in _RULES:
            raise UnsupportedMetric(f"compare_table rule type {kind!r} is not implemented")
        for key in ("sheet_idx", "sheet_idx0", "sheet_idx1"):
            if key in rule:
                _check_sheet_ref(rule[key])
        if kind == "sheet_fuzzy":
            for spec in rule["rules"]:
                if (fuzzy := spec["type"]) not in _FUZZY:
                    raise UnsupportedMetric(f"compare_table sheet_fuzzy type {fuzzy!r} is not implemented")
        if kind == "check_cell":
            for prop, spec in rule["props"].items():
                if prop != "value" and prop not in _CELL_STYLES:
                    raise UnsupportedMetric(f"compare_table check_cell property {prop!r} is not implemented")
                _check_method(spec["method"])
                if spec["method"].startswith("re"):
                    re.compile(spec["ref"])  # a bad pattern is the task's error (the reference scores 0)


def compare_table(result: str | None, expected: str | None = None, **options: Any) -> float:
    """1.0 when every rule in `options["rules"]` passes for the result workbook (an .xlsx path)."""
    rules = options["rules"]
    validate_rules(rules)
    if result is None or not os.path.exists(result):
        return 0.0
    with contextlib.ExitStack() as stack:
        try:
            result_book = stack.enter_context(_open_book(result))
        except Exception:  # openpyxl and pandas raise many types for a file that is no workbook
            return 0.0
        # a gold workbook that cannot be opened is the task's fault: let it raise
        expected_book = stack.enter_context(_open_book(expected)) if expected is not None else None
        for rule in rules:
            if not _RULES[rule["type"]](rule, result_book, expected_book):
                return 0.0
    return 1.0
