"""Parity of guirl's metrics with OSWorld's reference implementations (desktop-env 1.0.2).

The reference modules are loaded by file path behind stub packages (docs/osworld-compat.md §5.3), so
the wheel's heavy `metrics/__init__` (easyocr, torch, playwright, ...) never runs. Each case states the
score it must get; both implementations must give it. Inputs where guirl differs on purpose are listed
separately, each asserting what the reference does and what guirl does instead.
"""

from __future__ import annotations

import locale
import re
import types
import zipfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import docx
import openpyxl
import pytest
from docx.opc.exceptions import PackageNotFoundError
from openpyxl.styles import Font, PatternFill

from guirl.vmpool.tasks.metrics import METRICS, UnsupportedMetric
from tests.osworld_reference import reference


def _load_reference() -> dict[str, types.ModuleType]:
    # docs.py imports easyocr (-> torch, and a model download) at the top; compare_docx_files does not use it
    modules = ("general", "vscode", "table", "docs")
    return {mod: reference(f"metrics.{mod}", absent=["easyocr"]) for mod in modules}


REF = _load_reference()
BASE_METRICS = (
    "exact_match",
    "check_include_exclude",
    "check_direct_json_object",
    "check_list",
    "file_contains",
    "fuzzy_match",
    "is_in_list",
    "literal_match",
    "compare_text_file",
    "compare_table",
    "compare_docx_files",
)
"""The metrics whose parity cases live in this file."""
REF_METRICS: dict[str, Callable[..., Any]] = {
    **{name: getattr(REF["general"], name) for name in BASE_METRICS if hasattr(REF["general"], name)},
    "compare_text_file": REF["vscode"].compare_text_file,
    "compare_table": REF["table"].compare_table,
    "compare_docx_files": REF["docs"].compare_docx_files,
}

# The reference opens text files in the locale's encoding; the cases assume UTF-8, as on OSWorld's hosts.
assert locale.getpreferredencoding(False).lower().replace("-", "") == "utf8", "run the parity tests in UTF-8"


class F(NamedTuple):
    """A file under the test's data directory, resolved to its path when the case runs."""

    name: str


class Case(NamedTuple):
    metric: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    want: float


# ---- input files ----

GOLD_ROWS = [["Name", "Score", "Ratio"], ["Ann", 1, 0.5], ["Bob", 2, 0.25]]


def _book(path: Path, sheets: dict[str, list[list[Any]]]) -> openpyxl.Workbook:
    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for title, rows in sheets.items():
        ws = wb.create_sheet(title)
        for row in rows:
            ws.append(row)
    wb.save(path)
    return wb


def _patch_cells(path: Path, cells: dict[str, str]) -> None:
    """Replace cells of sheet1's XML by hand-written ones, for the cell kinds LibreOffice writes."""
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    xml = parts["xl/worksheets/sheet1.xml"].decode()
    for ref, replacement in cells.items():
        xml, n = re.subn(rf'<c r="{ref}"[^>]*?(/>|>.*?</c>)', replacement, xml)
        assert n == 1, ref
    parts["xl/worksheets/sheet1.xml"] = xml.encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in parts.items():
            z.writestr(name, data)


def _make_files(d: Path) -> None:
    (d / "lines.txt").write_text("alpha\nbeta two\ngamma\n")
    (d / "crlf.txt").write_bytes(b"alpha\r\nbeta\r\n")
    (d / "empty.txt").write_text("")
    (d / "binary.txt").write_bytes(b"\xff\xfe\x00bad utf-8 \xc3")
    (d / "a.txt").write_text("Hello  world\n\tagain\n")
    (d / "a_same.txt").write_text("Hello  world\n\tagain\n")
    (d / "a_crlf.txt").write_bytes(b"Hello  world\r\n\tagain\r\n")
    (d / "a_flat.txt").write_text("Hello world again")
    (d / "a_upper.txt").write_text("HELLO  WORLD\n\tAGAIN\n")
    (d / "a_nonl.txt").write_text("Hello  world\n\tagain")
    (d / "a_unicode_ws.txt").write_text("Hello\u00a0world\x1c\u2003again  \n")

    _book(d / "gold.xlsx", {"Sheet1": GOLD_ROWS, "Sheet2": [["x"], [1]]})
    _book(d / "same.xlsx", {"Sheet1": GOLD_ROWS, "Sheet2": [["x"], [1]]})
    _book(d / "diff.xlsx", {"Sheet1": [*GOLD_ROWS[:2], ["Bob", 3, 0.25]], "Sheet2": [["x"], [1]]})
    _book(d / "float.xlsx", {"Sheet1": [GOLD_ROWS[0], ["Ann", 1.00001, 0.5], ["Bob", 2.0, 0.25]]})
    _book(d / "near.xlsx", {"Sheet1": [GOLD_ROWS[0], ["Ann", 1, 0.500001], ["Bob", 2, 0.25]]})
    _book(d / "renamed.xlsx", {"Sheet1": GOLD_ROWS, "Other": [["x"], [1]]})
    _book(d / "copy.xlsx", {"Sheet1": GOLD_ROWS, "Sheet1 (2)": GOLD_ROWS})
    (d / "not_a_book.xlsx").write_text("Name,Score\nAnn,1\n")

    wb = _book(d / "styled.xlsx", {"Sheet1": [["Bold", "Fill", "Merged", "", datetime(2024, 1, 2), "=1+1"]]})
    ws = wb["Sheet1"]
    ws["A1"].font = Font(bold=True, color="FFFF0000")
    ws["B1"].fill = PatternFill("solid", fgColor="FFFFFF00")
    ws.merge_cells("C1:D1")
    ws["G1"], ws["H1"], ws["I1"], ws["J1"] = True, "a, b,c", 3.14159, "Hello World"
    ws["K1"], ws["L1"] = " padded ", "'x,y'"
    wb.save(d / "styled.xlsx")

    # LibreOffice-style cells: a formula's cached string, an error, padded values, a shared string
    _book(d / "raw.xlsx", {"Sheet1": [["s", "e", "pad", "blank", "num", "shared", "rich"]]})
    _patch_cells(
        d / "raw.xlsx",
        {
            "A1": '<c r="A1" t="str"><f>"Road"&amp;""</f><v>Main Road</v></c>',
            "B1": '<c r="B1" t="e"><f>1/0</f><v>#DIV/0!</v></c>',
            "C1": '<c r="C1" t="str"><v>  Apple Inc. </v></c>',
            "D1": '<c r="D1" t="str"><v>   </v></c>',
            "E1": '<c r="E1" s="0"><v> 1E-5 </v></c>',
            "F1": '<c r="F1" t="s"><v>0</v></c>',
            "G1": '<c r="G1" t="inlineStr"><is><r><t>ri</t></r><r><t>ch</t></r></is></c>',
        },
    )
    with zipfile.ZipFile(d / "raw.xlsx") as z:
        parts = {n: z.read(n) for n in z.namelist()}
    ns = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
    parts["xl/sharedStrings.xml"] = (
        f'<sst xmlns="{ns}" count="1" uniqueCount="1"><si><r><t xml:space="preserve"> Main </t></r>'
        "<r><t>Rd</t></r></si></sst>"
    ).encode()
    types_xml = (
        parts["[Content_Types].xml"]
        .decode()
        .replace(
            "</Types>",
            '<Override PartName="/xl/sharedStrings.xml" ContentType="application/'
            'vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>',
        )
    )
    parts["[Content_Types].xml"] = types_xml.encode()
    rels = (
        parts["xl/_rels/workbook.xml.rels"]
        .decode()
        .replace(
            "</Relationships>",
            '<Relationship Id="rIdSST" Target="sharedStrings.xml" Type="http://schemas.openxmlformats.org/'
            'officeDocument/2006/relationships/sharedStrings"/></Relationships>',
        )
    )
    parts["xl/_rels/workbook.xml.rels"] = rels.encode()
    with zipfile.ZipFile(d / "raw.xlsx", "w") as z:
        for name, data in parts.items():
            z.writestr(name, data)

    _book(d / "padded.xlsx", {"Sheet1": [[None, None, None, None, None, " Main Rd"]]})
    _book(
        d / "fz_result.xlsx",
        {"Sheet1": [["+ Main Rd.", "Apple Inc."], ["(555) 123", 42, " padded"], ["Colour", "x"]]},
    )
    _book(
        d / "fz_gold.xlsx",
        {"Sheet1": [["Main Road", "apple inc."], ["555123", 42.0, " padded"], ["Color", "x"]]},
    )

    # sheet_print reads the CSV that postconfig exported next to each book: <stem>-<sheet>.csv
    for stem, csv in [
        ("pr_result", b"Name,Score\r\n  Ann,1 \t\r\n\r\n\r\n"),
        ("pr_gold", b"Name,Score\nAnn,1\n"),
        ("pr_upper", b"NAME,SCORE\nANN,1\n"),
        ("pr_lead", b"\nName,Score\nAnn,1\n"),
        ("pr_latin1", "Caf\u00e9,1\n".encode("latin-1")),
        ("pr_utf8", "Caf\u00e9,1\n".encode()),
        ("pr_bom", "\ufeffName,Score\nAnn,1\n".encode()),
    ]:
        _book(d / f"{stem}.xlsx", {"Sheet1": [["Name", "Score"]]})
        (d / f"{stem}-Sheet1.csv").write_bytes(csv)
    _book(d / "pr_nocsv.xlsx", {"Sheet1": [["Name", "Score"]]})


def _docx(path: Path, *paragraphs: str) -> None:
    document = docx.Document()
    for text in paragraphs:
        paragraph = document.add_paragraph()
        for i, line in enumerate(text.split("\n")):
            run = paragraph.add_run(line)
            if i < text.count("\n"):
                run.add_break()  # python-docx reads a break back as "\n"
    document.save(path)


def _make_docs(d: Path) -> None:
    _docx(d / "doc.docx", "Hello  world", "", "Second\tline")
    _docx(d / "doc_same.docx", "Hello  world", "", "Second\tline")
    _docx(d / "doc_flat.docx", "Hello world", "Second line")
    _docx(d / "doc_upper.docx", "HELLO  WORLD", "", "SECOND\tLINE")
    _docx(d / "doc_swapped.docx", "Second\tline", "", "Hello  world")
    _docx(d / "doc_typo.docx", "Helo  world", "", "Second\tlines")
    _docx(d / "doc_break.docx", "Hello\nworld", "Second line")
    _docx(d / "doc_empty.docx")
    _docx(d / "doc_empty2.docx")
    (d / "doc_junk.docx").write_text("not a document")
    (d / "doc.txt").write_text("Hello world Second line")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("metrics")
    _make_files(d)
    _make_docs(d)
    return d


def _resolve(value: Any, d: Path) -> Any:
    if isinstance(value, F):
        return str(d / value.name)
    if isinstance(value, tuple):
        return tuple(_resolve(v, d) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, d) for k, v in value.items()}
    return value


# ---- cases: both implementations must give `want` ----


def _metric(name: str) -> Callable[..., Case]:
    return lambda *args, want, **kwargs: Case(name, args, kwargs, want)


EXACT, INCLUDE, JSON, LIST = map(
    _metric, ["exact_match", "check_include_exclude", "check_direct_json_object", "check_list"]
)
CONTAINS, FUZZY, IN_LIST = map(_metric, ["file_contains", "fuzzy_match", "is_in_list"])
LITERAL, TEXT, TABLE, DOCS = map(
    _metric, ["literal_match", "compare_text_file", "compare_table", "compare_docx_files"]
)


def JSON_IN(result: Any, expected: dict[str, Any], want: float) -> Case:  # noqa: N802  (a case builder)
    return JSON(result, {"expected": expected, "expect_in_result": True}, want=want)


def _table(result: str | None, expected: str | None, *rules: dict[str, Any], want: float) -> Case:
    args = (None if result is None else F(result),) + (() if expected is None else (F(expected),))
    return TABLE(*args, rules=list(rules), want=want)


def _data(i0: Any = 0, i1: Any = "EI0", **extra: Any) -> dict[str, Any]:
    return {"type": "sheet_data", "sheet_idx0": i0, "sheet_idx1": i1, **extra}


def _print(i0: Any = "RNSheet1", i1: Any = "ENSheet1", **extra: Any) -> dict[str, Any]:
    return {"type": "sheet_print", "sheet_idx0": i0, "sheet_idx1": i1, **extra}


def _fuzzy(*specs: dict[str, Any], i0: Any = "RNSheet1", i1: Any = "ENSheet1") -> dict[str, Any]:
    return {"type": "sheet_fuzzy", "sheet_idx0": i0, "sheet_idx1": i1, "rules": list(specs)}


def _spec(cells: str | list[str], kind: str = "exact_match", **options: Any) -> dict[str, Any]:
    return {"range": cells, "type": kind, **options}


def _fz(*specs: dict[str, Any], want: float, **sheets: Any) -> Case:
    return _table("fz_result.xlsx", "fz_gold.xlsx", _fuzzy(*specs, **sheets), want=want)


def _cell(coordinate: str, prop: str, method: str, ref: Any, sheet: Any = 0) -> dict[str, Any]:
    props = {prop: {"method": method, "ref": ref}}
    return {"type": "check_cell", "sheet_idx": sheet, "coordinate": coordinate, "props": props}


def _styled(coordinate: str, prop: str, method: str, ref: Any, want: float, sheet: Any = 0) -> Case:
    return _table("styled.xlsx", None, _cell(coordinate, prop, method, ref, sheet), want=want)


def _raw(coordinate: str, ref: Any) -> Case:
    return _table("raw.xlsx", None, _cell(coordinate, "value", "eq", ref), want=1.0)


def _docs(result: str | None, gold: str, *, want: float, **options: Any) -> Case:
    return DOCS(None if result is None else F(result), F(gold), want=want, **options)


SHEET_NAME = {"type": "sheet_name"}
KILI = ["Kili", "kili", "Kilimanjaro"]
BROWSER_FILTERS = {"Black": True, "$25 - $60": True, "On sale": True, "is_other_exist": False}
ROAD = {"normalization": [["Rd", "Road"]], "trim_leadings": "+ ", "trim_trailings": "."}

# One table for all metrics; one row per case, grouped by metric.
CASES: list[Case] = [
    EXACT("abc", {"expected": "abc"}, want=1.0),
    EXACT("abc", {"expected": "abd"}, want=0.0),
    EXACT(None, {"expected": None}, want=1.0),
    EXACT(None, {"expected": "None"}, want=0.0),
    EXACT(1, {"expected": 1.0}, want=1.0),
    EXACT("1", {"expected": 1}, want=0.0),
    EXACT([1, {"a": 2}], {"expected": [1, {"a": 2}]}, want=1.0),
    EXACT("abc\n", {"expected": "abc"}, want=0.0),
    INCLUDE("hello world", {"include": ["hello"], "exclude": ["bye"]}, want=1.0),
    INCLUDE("hello world", {"include": ["hello", "xyz"]}, want=0.0),
    INCLUDE("hello bye", {"include": ["hello"], "exclude": ["bye"]}, want=0.0),
    INCLUDE(None, {"include": ["a"]}, want=0.0),
    INCLUDE("", {}, want=1.0),
    INCLUDE(["a", "b"], {"include": ["a"], "exclude": ["ab"]}, want=1.0),
    INCLUDE("Hello", {"include": ["hello"]}, want=0.0),
    JSON({"a": 1, "b": "x"}, {"expected": {"a": 1}}, want=1.0),
    JSON({"a": 1}, {"expected": {"a": 2}}, want=0.0),
    JSON({"a": 1}, {"expected": {"a": 1, "b": None}}, want=1.0),
    JSON("{'a': 1}", {"expected": {"a": 1}}, want=1.0),
    JSON('  {"a": [1, 2]}\n', {"expected": {"a": [1, 2]}}, want=1.0),
    JSON({"a": True}, {"expected": {"a": 1}}, want=1.0),
    JSON({"a": [2, 1]}, {"expected": {"a": [1, 2]}, "ignore_list_order": True}, want=0.0),
    JSON({"a": [1, 2]}, {"expected": {"a": [1, 2]}, "ignore_list_order": True}, want=1.0),
    JSON({"a": [2, 1]}, {"expected": {"a": [1, 2], "ignore_list_order": True}}, want=0.0),
    JSON(
        {"a": [1, 2], "ignore_list_order": True},
        {"expected": {"a": [1, 2], "ignore_list_order": True}},
        want=0.0,
    ),
    JSON({"a": 1}, {"expected": {"a": "__EVALUATION_FAILED__"}}, want=0.0),
    JSON(None, {"expected": {"a": 1}}, want=0.0),
    JSON("null", {"expected": {"a": 1}}, want=0.0),
    JSON("[1, 2]", {"expected": {"a": 1}}, want=0.0),
    JSON([1, 2], {"expected": {}}, want=1.0),
    JSON(BROWSER_FILTERS, {"expected": BROWSER_FILTERS}, want=1.0),
    JSON({**BROWSER_FILTERS, "Black": False}, {"expected": BROWSER_FILTERS}, want=0.0),
    JSON_IN({"q": "drip coffee maker"}, {"q": "drip"}, want=1.0),
    JSON_IN({"q": "tea"}, {"q": "coffee"}, want=0.0),
    JSON_IN({"q": None}, {"q": "x"}, want=0.0),
    JSON_IN({"q": ["a", "x"]}, {"q": "x"}, want=1.0),
    JSON_IN({"k": ["x", "Kili"]}, {"k": KILI}, want=1.0),
    JSON_IN({"k": "kili"}, {"k": KILI}, want=1.0),
    JSON_IN({"k": "Everest"}, {"k": KILI}, want=0.0),
    JSON_IN({"k": 5}, {"k": [5]}, want=0.0),
    JSON_IN({"a": True}, {"a": True}, want=0.0),
    JSON_IN("{'k': 'kili'}", {"k": ["kili"]}, want=1.0),
    LIST(F("lines.txt"), {"expect": ["^beta", "gam"], "unexpect": ["delta"]}, want=1.0),
    LIST(F("lines.txt"), {"expect": ["zeta"]}, want=0.0),
    LIST(F("lines.txt"), {"unexpect": ["^alp"]}, want=0.0),
    LIST(F("lines.txt"), {"expect": ["two$"]}, want=1.0),
    LIST(F("lines.txt"), {"expect": ["alpha.beta"]}, want=0.0),
    LIST(F("lines.txt"), {}, want=1.0),
    LIST(F("empty.txt"), {"expect": []}, want=1.0),
    LIST(F("empty.txt"), {"expect": ["x"]}, want=0.0),
    LIST(F("crlf.txt"), {"expect": ["^beta$"], "unexpect": ["\r"]}, want=1.0),
    LIST(None, {"expect": ["x"]}, want=0.0),
    CONTAINS(F("lines.txt"), {"expected": ["alpha", "beta two"]}, want=1.0),
    CONTAINS(F("lines.txt"), {"expected": ["alpha", "delta"]}, want=0.0),
    CONTAINS(F("lines.txt"), {"expected": []}, want=1.0),
    CONTAINS(F("lines.txt"), {"expected": "ab"}, want=1.0),
    CONTAINS(F("lines.txt"), {"expected": "az"}, want=0.0),
    CONTAINS(F("crlf.txt"), {"expected": ["alpha\nbeta"]}, want=1.0),
    CONTAINS(None, {"expected": ["x"]}, want=0.0),
    CONTAINS("", {"expected": ["x"]}, want=0.0),
    CONTAINS(F("missing.txt"), {"expected": ["x"]}, want=0.0),
    CONTAINS(F("binary.txt"), {"expected": ["x"]}, want=0.0),
    FUZZY("kitten", {"expected": "sitting"}, want=8 / 13),
    FUZZY("abc", {"expected": "abc"}, want=1.0),
    FUZZY("", {"expected": ""}, want=1.0),
    FUZZY(None, {"expected": "abc"}, want=0.0),
    FUZZY("abc", {"expected": None}, want=0.0),
    FUZZY("Hello", {"expected": "hello"}, want=0.8),
    FUZZY(["a", "b"], {"expected": ["a", "c"]}, want=0.5),
    IN_LIST("hello world", {"expected": "world"}, want=1.0),
    IN_LIST("hello", {"expected": "xyz"}, want=0.0),
    IN_LIST(["a", "b"], {"expected": "a"}, want=1.0),
    IN_LIST(["ab"], {"expected": "a"}, want=0.0),
    IN_LIST({"a": 1}, {"expected": "a"}, want=1.0),
    LITERAL("abc", "abc", want=1.0),
    LITERAL("ABC", "abc", want=0.0),
    LITERAL("ABC", "abc", ignore_case=True, want=1.0),
    LITERAL(1, "1", want=1.0),
    LITERAL(None, "None", want=1.0),
    LITERAL(["1", 2], [1, "2"], type="list", want=1.0),
    LITERAL(("a", "B"), ["a", "b"], type="list", ignore_case=True, want=1.0),
    LITERAL(("a", "B"), ["a", "b"], type="list", want=0.0),
    LITERAL(["a"], ["a", "b"], type="list", want=0.0),
    LITERAL("ab", ["a", "b"], type="list", want=0.0),
    TEXT(F("a.txt"), F("a_same.txt"), want=1.0),
    TEXT(F("a.txt"), F("a_crlf.txt"), want=1.0),
    TEXT(F("a.txt"), F("a_flat.txt"), want=0.0),
    TEXT(F("a.txt"), F("a_flat.txt"), ignore_blanks=True, want=1.0),
    TEXT(F("a.txt"), F("a_nonl.txt"), want=0.0),
    TEXT(F("a.txt"), F("a_nonl.txt"), ignore_blanks=True, want=1.0),
    TEXT(F("a.txt"), F("a_upper.txt"), want=0.0),
    TEXT(F("a.txt"), F("a_upper.txt"), ignore_case=True, want=1.0),
    TEXT(F("a_upper.txt"), F("a_flat.txt"), ignore_case=True, ignore_blanks=True, want=1.0),
    TEXT(F("a_unicode_ws.txt"), F("a_flat.txt"), ignore_blanks=True, want=1.0),
    TEXT(F("a_unicode_ws.txt"), F("a_flat.txt"), want=0.0),
    TEXT(None, F("a.txt"), want=0.0),
    TEXT("", F("a.txt"), want=0.0),
    # compare_table: whole workbooks
    _table("same.xlsx", "gold.xlsx", want=1.0),
    _table(None, "gold.xlsx", _data(), want=0.0),
    _table("missing.xlsx", "gold.xlsx", _data(), want=0.0),
    _table("not_a_book.xlsx", "gold.xlsx", _data(), want=0.0),
    _table("same.xlsx", "gold.xlsx", SHEET_NAME, want=1.0),
    _table("renamed.xlsx", "gold.xlsx", SHEET_NAME, want=0.0),
    # sheet_data
    _table("same.xlsx", "gold.xlsx", _data(), want=1.0),
    _table("diff.xlsx", "gold.xlsx", _data(), want=0.0),
    _table("diff.xlsx", "gold.xlsx", _data("RNSheet2", "ENSheet2"), want=1.0),
    _table("same.xlsx", "gold.xlsx", _data("RI1", "EI1"), _data(1, "ENSheet2"), want=1.0),
    _table("float.xlsx", "gold.xlsx", _data(), want=0.0),
    _table("near.xlsx", "gold.xlsx", _data(), want=1.0),
    _table("near.xlsx", "gold.xlsx", _data(precision=6), want=0.0),
    _table("copy.xlsx", "gold.xlsx", _data(0, 1), _data(1, "EI0"), want=1.0),
    _table("same.xlsx", "gold.xlsx", SHEET_NAME, _data(), _data("RI1", "EI0"), want=0.0),
    _table("same.xlsx", "gold.xlsx", _data("RNNope", "ENSheet1"), want=0.0),
    _table("same.xlsx", "gold.xlsx", _data(5, "EI0"), want=0.0),
    _table("same.xlsx", "gold.xlsx", _data(-1, "EI1"), want=1.0),
    _table("same.xlsx", "gold.xlsx", _data("RIx", "EI0"), want=0.0),
    # sheet_print
    _table("pr_result.xlsx", "pr_gold.xlsx", _print(), want=1.0),
    _table("pr_result.xlsx", "pr_gold.xlsx", _print(0, "EI0"), want=1.0),
    _table("pr_upper.xlsx", "pr_gold.xlsx", _print(), want=0.0),
    _table("pr_upper.xlsx", "pr_gold.xlsx", _print(ignore_case=True), want=1.0),
    _table("pr_lead.xlsx", "pr_gold.xlsx", _print(), want=0.0),
    _table("pr_latin1.xlsx", "pr_utf8.xlsx", _print(), want=1.0),
    _table("pr_bom.xlsx", "pr_gold.xlsx", _print(), want=0.0),
    _table("pr_nocsv.xlsx", "pr_gold.xlsx", _print(), want=0.0),
    _table("pr_gold.xlsx", "pr_nocsv.xlsx", _print(), want=0.0),
    # sheet_fuzzy
    _fz(_spec(["A1"]), want=0.0),
    _fz(_spec(["A1"], **ROAD), want=1.0),
    _fz(_spec(["B1"]), want=0.0),
    _fz(_spec(["B1"], ignore_case=True), want=1.0),
    _fz(_spec(["A2"], ignore_chars=" ()"), want=1.0),
    _fz(_spec("B2 B3 C1:C3"), want=1.0),
    _fz(_spec(["A3"], "fuzzy_match"), want=1.0),
    _fz(_spec(["A3"], "fuzzy_match", threshold=95), want=0.0),
    _fz(_spec(["A3"], "includes"), want=0.0),
    _fz(_spec(["B1"], "includes", ignore_case=True), want=1.0),
    _fz(_spec(["A3"], "included_by"), want=0.0),
    _fz(_spec(["B3"], "included_by"), want=1.0),
    _fz(_spec(["B3"]), _spec(["A3"]), want=0.0),
    _fz(_spec(["A1"]), i0="RNNope", want=0.0),
    _table("raw.xlsx", "fz_gold.xlsx", _fuzzy(_spec(["A1"])), want=1.0),
    _table("raw.xlsx", "fz_gold.xlsx", _fuzzy(_spec(["C1"], ignore_case=True)), want=0.0),
    _table("raw.xlsx", "raw.xlsx", _fuzzy(_spec(["A1:G1"])), want=1.0),
    # check_cell: raw values (numbers read as float, dates as serials) and styles
    _styled("J1", "value", "eq", "Hello World", want=1.0),
    _styled("J1", "value", "eq", "Hello world", want=0.0),
    _styled("J1", "value", "re", "^Hello", want=1.0),
    _styled("J1", "value", "re", "^hello", want=0.0),
    _styled("J1", "value", "re.I", "^hello", want=1.0),
    _styled("J1", "value", "re.I.M", "world$", want=1.0),
    _styled("I1", "value", "approx:0.001", 3.1416, want=1.0),
    _styled("I1", "value", "approx:0.00001", 3.1416, want=0.0),
    _styled("I1", "value", "gt", 3, want=1.0),
    _styled("I1", "value", "lt", 3, want=0.0),
    _styled("I1", "value", "ge", 3.14159, want=1.0),
    _styled("I1", "value", "le", 3.14, want=0.0),
    _styled("I1", "value", "ne", 3, want=1.0),
    _styled("J1", "value", "lt", 3, want=0.0),
    _styled("J1", "value", "approx:0.1", 3, want=0.0),
    _styled("I1", "value", "re", "3", want=0.0),
    _styled("H1", "value", "str_list_eq", ["a", " b", "c"], want=1.0),
    _styled("H1", "value", "str_list_eq", ["a", "b", "c"], want=0.0),
    _styled("H1", "value", "str_set_eq", ["c", "a", " b"], want=1.0),
    _styled("L1", "value", "str_list_eq", ["x", "y"], want=1.0),
    _styled("E1", "value", "eq", 45293, want=1.0),
    _styled("F1", "value", "eq", None, want=1.0),
    _styled("G1", "value", "eq", None, want=1.0),
    _styled("Z9", "value", "eq", None, want=1.0),
    _styled("A1", "font_bold", "eq", True, want=1.0),
    _styled("J1", "font_bold", "eq", True, want=0.0),
    _styled("A1", "font_color", "eq", "FFFF0000", want=1.0),
    _styled("Z9", "font_bold", "eq", None, want=1.0),
    _styled("B1", "bgcolor", "eq", "FFFFFF00", want=1.0),
    _styled("B1", "fill_type", "eq", "patternFill", want=1.0),
    _styled("D1", "merge", "eq", True, want=1.0),
    _styled("C1", "merge", "eq", True, want=0.0),
    _styled("J1", "font_name", "eq", "Calibri", want=1.0),
    _styled("J1", "font_size", "approx:0.1", 11, want=1.0),
    _styled("I1", "number_format", "eq", "General", want=1.0),
    _styled("J1", "value", "eq", "Hello World", sheet="RNNope", want=0.0),
    _styled("J1", "value", "eq", "Hello World", sheet=1, want=0.0),
    _table(
        "styled.xlsx",
        None,
        _cell("J1", "value", "eq", "x"),
        _cell("J1", "value", "eq", "Hello World"),
        want=0.0,
    ),
    _table("same.xlsx", "gold.xlsx", _cell("B2", "value", "eq", 1.0, sheet="EI0"), want=1.0),
    _raw("A1", "Main Road"),
    _raw("B1", "#DIV/0!"),
    _raw("C1", "Apple Inc."),
    _raw("D1", None),
    _raw("E1", 1e-5),
    _raw("F1", " Main Rd"),
    _raw("G1", None),
    # compare_docx_files (python-docx reads a line break as "\n" and a tab as "\t")
    _docs("doc.docx", "doc_same.docx", want=1.0),
    _docs("doc.docx", "doc_flat.docx", want=1.0),
    _docs("doc.docx", "doc_flat.docx", ignore_blanks=False, want=0.0),
    _docs("doc.docx", "doc_same.docx", ignore_blanks=False, want=1.0),
    _docs("doc.docx", "doc_flat.docx", ignore_blanks=False, delete_empty_lines=True, want=0.0),
    _docs("doc_break.docx", "doc_flat.docx", want=1.0),
    _docs("doc_upper.docx", "doc.docx", want=0.0),
    _docs("doc_upper.docx", "doc.docx", ignore_case=True, want=1.0),
    _docs("doc_upper.docx", "doc.docx", ignore_case=True, ignore_blanks=False, want=1.0),
    _docs("doc_swapped.docx", "doc.docx", want=0.0),
    _docs("doc_swapped.docx", "doc.docx", ignore_order=True, want=1.0),
    _docs("doc_swapped.docx", "doc.docx", ignore_order=True, ignore_blanks=False, want=1.0),
    _docs("doc_typo.docx", "doc.docx", want=0.0),
    _docs("doc_typo.docx", "doc.docx", fuzzy_match=True, want=22 / 23),
    _docs(
        "doc_typo.docx", "doc.docx", fuzzy_match=True, ignore_blanks=False, want=(22 / 23 + 1 + 22 / 23) / 3
    ),
    _docs("doc_typo.docx", "doc_upper.docx", content_only=True, ignore_case=True, want=22 / 23),
    _docs("doc_upper.docx", "doc_flat.docx", content_only=True, want=10 / 46),
    _docs("doc.docx", "doc_flat.docx", ignore_blanks=False, fuzzy_match=True, want=0.0),
    _docs("doc_empty.docx", "doc_empty2.docx", ignore_blanks=False, fuzzy_match=True, want=1.0),
    _docs("doc_empty.docx", "doc.docx", want=0.0),
    _docs("doc_swapped.docx", "doc_flat.docx", ignore_order=True, delete_empty_lines=True, want=1.0),
    _docs(
        "doc_swapped.docx",
        "doc_same.docx",
        ignore_order=True,
        delete_empty_lines=True,
        ignore_blanks=False,
        want=1.0,
    ),
    _docs(
        "doc_swapped.docx",
        "doc_flat.docx",
        ignore_order=True,
        delete_empty_lines=True,
        ignore_blanks=False,
        want=0.0,
    ),
    _docs(None, "doc.docx", want=0.0),
    _docs("missing.docx", "doc.docx", want=0.0),
    _docs("doc_junk.docx", "doc.docx", want=0.0),
    _docs("doc.txt", "doc.docx", want=0.0),
    _docs("doc.docx", "doc.odt", want=0.0),
]


@pytest.mark.parametrize("c", CASES, ids=[f"{i}-{c.metric}" for i, c in enumerate(CASES)])
def test_same_score_as_reference(c: Case, data_dir: Path) -> None:
    args, kwargs = _resolve(c.args, data_dir), _resolve(c.kwargs, data_dir)
    reference = float(REF_METRICS[c.metric](*args, **kwargs))
    ours = METRICS[c.metric](*args, **kwargs)
    assert isinstance(ours, float)
    assert reference == pytest.approx(c.want), "the case's stated score is wrong"
    assert ours == pytest.approx(reference)


# ---- deliberate differences: what the reference does, what guirl does instead, and why ----

Outcome = float | type[BaseException]


class Diff(NamedTuple):
    why: str
    case: Case  # `want` unused: the two outcomes below say what each side does
    reference: Outcome
    guirl: Outcome


SPOILED = "an unusable result is the policy's failure: 0.0, not a crash"
BAD_TASK = "a malformed task raises instead of scoring every episode 0"
UNSUPPORTED = "a rule guirl lacks raises UnsupportedMetric on every call, whatever the policy did"
UNCACHED = "an uncached formula (openpyxl writes <v></v>) reads as empty; the reference's float(None) escapes"
PADDED = "openpyxl's xml:space=preserve inline string reads as its text; the reference compares a dict's repr"


DIFFS: list[Diff] = [
    Diff(SPOILED, INCLUDE(5, {"include": ["a"]}, want=0), TypeError, 0.0),
    Diff(SPOILED, JSON("not json", {"expected": {"a": 1}}, want=0), ValueError, 0.0),
    Diff(SPOILED, JSON("", {"expected": {"a": 1}}, want=0), ValueError, 0.0),
    # the reference's ' -> " swap breaks any apostrophe inside a JSON string
    Diff(SPOILED, JSON('{"a": "it\'s"}', {"expected": {"a": "it's"}}, want=0), ValueError, 0.0),
    Diff(BAD_TASK, JSON({"a": 1}, {}, want=0), 0.0, KeyError),
    Diff(BAD_TASK, JSON({"a": 1}, {"expected": [1]}, want=0), 0.0, TypeError),
    Diff(SPOILED, LIST(F("missing.txt"), {"expect": ["x"]}, want=0), FileNotFoundError, 0.0),
    Diff(SPOILED, LIST(F("binary.txt"), {"expect": ["x"]}, want=0), UnicodeDecodeError, 0.0),
    Diff(BAD_TASK, CONTAINS(F("lines.txt"), {}, want=0), 0.0, KeyError),
    Diff(SPOILED, FUZZY(5, {"expected": "5"}, want=0), TypeError, 0.0),
    Diff(SPOILED, IN_LIST(None, {"expected": "a"}, want=0), TypeError, 0.0),
    Diff(SPOILED, IN_LIST(5, {"expected": "a"}, want=0), TypeError, 0.0),
    Diff(SPOILED, TEXT(F("missing.txt"), F("a.txt"), want=0), FileNotFoundError, 0.0),
    Diff(SPOILED, TEXT(F("binary.txt"), F("a.txt"), want=0), UnicodeDecodeError, 0.0),
    # the reference crashes on a missing second sheet (None.round), or lower-casing a missing second CSV
    Diff(SPOILED, _table("same.xlsx", "gold.xlsx", _data(0, "ENNope"), want=0), AttributeError, 0.0),
    Diff(SPOILED, _table("pr_gold.xlsx", "pr_nocsv.xlsx", _print(ignore_case=True), want=0), TypeError, 0.0),
    Diff(
        UNCACHED,
        _table("styled.xlsx", "gold.xlsx", _fuzzy(_spec(["F1"]), i1="ENSheet2"), want=0),
        TypeError,
        1.0,
    ),
    Diff(PADDED, _styled("K1", "value", "eq", " padded ", want=0), 0.0, 1.0),
    # ... which fails a correct answer a policy wrote with openpyxl against LibreOffice's shared string
    Diff(PADDED, _table("padded.xlsx", "raw.xlsx", _fuzzy(_spec(["F1"])), want=0), 0.0, 1.0),
    Diff(
        UNSUPPORTED,
        _table("renamed.xlsx", "gold.xlsx", SHEET_NAME, {"type": "chart"}, want=0),
        0.0,
        UnsupportedMetric,
    ),
    Diff(UNSUPPORTED, _table(None, "gold.xlsx", {"type": "freeze"}, want=0), 0.0, UnsupportedMetric),
    Diff(UNSUPPORTED, _styled("I1", "value", "range.te", [3, 4], want=0), 1.0, UnsupportedMetric),
    Diff(UNSUPPORTED, _styled("I1", "value", "between", 3, want=0), 0.0, UnsupportedMetric),
    Diff(UNSUPPORTED, _styled("J1", "font_shadow", "eq", None, want=0), 1.0, UnsupportedMetric),
    Diff(UNSUPPORTED, _fz(_spec(["A1"], "soundex"), want=0), UnboundLocalError, UnsupportedMetric),
    Diff(BAD_TASK, _table("same.xlsx", None, SHEET_NAME, want=0), 0.0, ValueError),
    Diff(
        BAD_TASK,
        _table("same.xlsx", None, _cell("B2", "value", "eq", 1.0, sheet="EI0"), want=0),
        0.0,
        ValueError,
    ),
    Diff(
        "no OSWorld task compares .odt; guirl reads only .docx",
        _docs("a.odt", "b.odt", want=0),
        0.0,
        UnsupportedMetric,
    ),
    Diff(BAD_TASK, _docs("doc.docx", "missing.docx", want=0), 0.0, PackageNotFoundError),
    # both raise, with different types: the task is broken either way
    Diff(
        UNSUPPORTED,
        _table("same.xlsx", "gold.xlsx", SHEET_NAME, {"type": "nope"}, want=0),
        NotImplementedError,
        UnsupportedMetric,
    ),
    Diff(BAD_TASK, LITERAL("a", "a", type="dict", want=0), NotImplementedError, ValueError),
    Diff(BAD_TASK, EXACT("a", {}, want=0), KeyError, KeyError),
    Diff(BAD_TASK, TEXT(F("a.txt"), F("missing.txt"), want=0), FileNotFoundError, FileNotFoundError),
    Diff(BAD_TASK, _table("same.xlsx", "missing.xlsx", want=0), FileNotFoundError, FileNotFoundError),
    Diff(BAD_TASK, _table("same.xlsx", None, _data(), want=0), NotImplementedError, ValueError),
    Diff(BAD_TASK, _table("same.xlsx", "gold.xlsx", _data("XX0", "EI0"), want=0), ValueError, ValueError),
]


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], want: Outcome) -> None:
    if isinstance(want, type):
        with pytest.raises(want):
            fn(*args, **kwargs)
    else:
        assert float(fn(*args, **kwargs)) == want


@pytest.mark.parametrize("d", DIFFS, ids=[f"{i}-{d.case.metric}" for i, d in enumerate(DIFFS)])
def test_deliberate_difference(d: Diff, data_dir: Path) -> None:
    args, kwargs = _resolve(d.case.args, data_dir), _resolve(d.case.kwargs, data_dir)
    _outcome(REF_METRICS[d.case.metric], args, kwargs, d.reference)
    _outcome(METRICS[d.case.metric], args, kwargs, d.guirl)


def test_every_metric_has_parity_cases() -> None:
    # the metrics whose cases are here (the families' are in test_parity_<family>.py)
    here = set(BASE_METRICS)
    assert {c.metric for c in CASES} == here, "every metric of this file needs parity cases"
    for metric in here:
        assert {0.0, 1.0} <= {c.want for c in CASES if c.metric == metric}, f"{metric}: need passes and fails"
