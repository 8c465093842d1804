"""guirl's OSWorld metrics on hand-made inputs (parity with OSWorld itself: test_metrics_parity.py)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

import docx
import openpyxl
import pytest
from openpyxl.styles import Font

from guirl.vmpool.tasks.metrics import METRICS, UnsupportedMetric, get_metric
from guirl.vmpool.tasks.metrics.docs import compare_docx_files
from guirl.vmpool.tasks.metrics.general import (
    check_direct_json_object,
    check_include_exclude,
    check_list,
    exact_match,
    file_contains,
    fuzzy_match,
    is_in_list,
    literal_match,
)
from guirl.vmpool.tasks.metrics.table import compare_table, read_raw_cells, validate_rules
from guirl.vmpool.tasks.metrics.text import compare_text_file

# ---- registry ----


def _reference_names(kind: str) -> set[str]:
    """The functions desktop-env's `evaluators/<kind>/` modules define (read, not imported)."""
    import ast
    import importlib.metadata

    names: set[str] = set()
    for f in importlib.metadata.files("desktop-env") or []:
        path = str(f).replace("\\", "/")
        if f"desktop_env/evaluators/{kind}/" in path and path.endswith(".py"):
            tree = ast.parse(Path(f.locate()).read_text())
            names |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert names, "desktop-env is not installed (make setup-test)"
    return names


def test_registry_names_are_osworlds_and_each_has_parity_tests() -> None:
    """Every metric guirl registers is one of OSWorld's (by name), and is exercised by a parity test
    against OSWorld's function (tests/integration/test_*parity*.py)."""
    assert set(METRICS) <= _reference_names("metrics"), set(METRICS) - _reference_names("metrics")
    parity = "".join(
        p.read_text() for p in (Path(__file__).parents[1] / "integration").glob("test_*parity*.py")
    )
    untested = sorted(m for m in METRICS if f'"{m}"' not in parity and f".{m}" not in parity)
    assert untested == [], f"metrics without parity tests: {untested}"
    assert get_metric("compare_table") is compare_table
    assert get_metric("exact_match")("x", {"expected": "x"}) == 1.0


def test_unknown_metric_is_unsupported() -> None:
    with pytest.raises(UnsupportedMetric, match=r"^metric 'no_such_metric' is not implemented$"):
        get_metric("no_such_metric")


# ---- general ----


def test_exact_match() -> None:
    assert exact_match([1, "a"], {"expected": [1, "a"]}) == 1.0
    assert exact_match(None, {"expected": None}) == 1.0
    assert exact_match("1", {"expected": 1}) == 0.0
    with pytest.raises(KeyError):
        exact_match("x", {})


def test_check_include_exclude() -> None:
    rules = {"include": ["foo", "bar"], "exclude": ["baz"]}
    assert check_include_exclude("foo bar", rules) == 1.0
    assert check_include_exclude("foo", rules) == 0.0
    assert check_include_exclude("foo bar baz", rules) == 0.0
    assert check_include_exclude(None, rules) == 0.0
    assert check_include_exclude(42, rules) == 0.0  # not a container: a failed result, not a crash
    assert check_include_exclude("anything", {}) == 1.0


def test_check_direct_json_object_default_mode() -> None:
    rules = {"expected": {"a": 1, "b": [1, 2]}}
    assert check_direct_json_object({"a": 1, "b": [1, 2], "c": 0}, rules) == 1.0
    assert check_direct_json_object({"a": 1, "b": [2, 1]}, rules) == 0.0
    assert check_direct_json_object("{'a': 1, 'b': [1, 2]}", rules) == 1.0  # single quotes are swapped
    assert check_direct_json_object("not json", rules) == 0.0
    assert check_direct_json_object(None, rules) == 0.0
    assert check_direct_json_object([1], rules) == 0.0
    assert check_direct_json_object({"a": 1}, {"expected": {"a": "__EVALUATION_FAILED__"}}) == 0.0


def test_check_direct_json_object_ignore_list_order_as_osworld_scores_it() -> None:
    # in `rules`: never read, so order still matters; in `expected`: always 0
    assert (
        check_direct_json_object({"a": [2, 1]}, {"expected": {"a": [1, 2]}, "ignore_list_order": True}) == 0.0
    )
    assert (
        check_direct_json_object({"a": [1, 2]}, {"expected": {"a": [1, 2]}, "ignore_list_order": True}) == 1.0
    )
    assert (
        check_direct_json_object({"a": [1, 2]}, {"expected": {"a": [1, 2], "ignore_list_order": True}}) == 0.0
    )


def test_check_direct_json_object_expect_in_result() -> None:
    rules = {"expected": {"name": ["Kili", "Kilimanjaro"], "q": "coffee"}, "expect_in_result": True}
    assert check_direct_json_object({"name": "Kili", "q": "drip coffee maker"}, rules) == 1.0
    assert check_direct_json_object({"name": ["x", "Kilimanjaro"], "q": "coffee"}, rules) == 1.0
    assert check_direct_json_object({"name": "Everest", "q": "coffee"}, rules) == 0.0
    assert check_direct_json_object({"name": "Kili", "q": None}, rules) == 0.0
    assert (
        check_direct_json_object({"flag": True}, {"expected": {"flag": True}, "expect_in_result": True})
        == 0.0
    )


def test_check_direct_json_object_malformed_rules_raise() -> None:
    with pytest.raises(KeyError):
        check_direct_json_object({"a": 1}, {})
    with pytest.raises(TypeError, match="must be a dict"):
        check_direct_json_object({"a": 1}, {"expected": ["a"]})


def test_check_list(tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"alpha\r\nbeta 2\r\n")
    assert check_list(str(listing), {"expect": ["^alpha$", r"beta \d"], "unexpect": ["gamma"]}) == 1.0
    assert check_list(str(listing), {"expect": ["gamma"]}) == 0.0
    assert check_list(str(listing), {"unexpect": ["^beta"]}) == 0.0
    assert check_list(str(tmp_path / "missing.txt"), {"expect": []}) == 0.0
    assert check_list(None, {}) == 0.0


def test_file_contains(tmp_path: Path) -> None:
    text = tmp_path / "out.txt"
    text.write_text("the answer is 42\n")
    assert file_contains(str(text), {"expected": ["answer", "42"]}) == 1.0
    assert file_contains(str(text), {"expected": ["answer", "43"]}) == 0.0
    assert file_contains(str(tmp_path / "missing.txt"), {"expected": ["x"]}) == 0.0
    assert file_contains("", {"expected": ["x"]}) == 0.0
    with pytest.raises(KeyError):
        file_contains(str(text), {})


def test_fuzzy_match_and_is_in_list() -> None:
    assert fuzzy_match("kitten", {"expected": "sitting"}) == pytest.approx(8 / 13)  # Indel: 2*4/13
    assert fuzzy_match("same", {"expected": "same"}) == 1.0
    assert fuzzy_match(None, {"expected": "abc"}) == 0.0
    assert fuzzy_match(12, {"expected": "12"}) == 0.0
    assert is_in_list("hello world", {"expected": "world"}) == 1.0
    assert is_in_list(["a", "b"], {"expected": "c"}) == 0.0
    assert is_in_list(None, {"expected": "a"}) == 0.0


def test_literal_match() -> None:
    assert literal_match(3, "3") == 1.0
    assert literal_match("Yes", "yes") == 0.0
    assert literal_match("Yes", "yes", ignore_case=True) == 1.0
    assert literal_match(["1", 2], (1, "2"), type="list") == 1.0
    assert literal_match(["1"], ["1", "2"], type="list") == 0.0
    assert literal_match("12", ["1", "2"], type="list") == 0.0
    with pytest.raises(ValueError, match="unknown type 'dict'"):
        literal_match({}, {}, type="dict")


# ---- compare_text_file ----


def test_compare_text_file(tmp_path: Path) -> None:
    gold = tmp_path / "gold.txt"
    gold.write_text("Line one\nline  two\n")
    same, spaced, upper = tmp_path / "same.txt", tmp_path / "spaced.txt", tmp_path / "upper.txt"
    same.write_bytes(b"Line one\r\nline  two\r\n")
    spaced.write_text("  Line one line\ttwo")
    upper.write_text("LINE ONE\nLINE  TWO\n")
    assert compare_text_file(str(same), str(gold)) == 1.0
    assert compare_text_file(str(spaced), str(gold)) == 0.0
    assert compare_text_file(str(spaced), str(gold), ignore_blanks=True) == 1.0
    assert compare_text_file(str(upper), str(gold)) == 0.0
    assert compare_text_file(str(upper), str(gold), ignore_case=True) == 1.0
    assert compare_text_file(None, str(gold)) == 0.0
    assert compare_text_file(str(tmp_path / "missing.txt"), str(gold)) == 0.0
    with pytest.raises(FileNotFoundError):
        compare_text_file(str(same), str(tmp_path / "no_gold.txt"))


# ---- compare_table ----


def _xlsx(path: Path, **sheets: list[list[Any]]) -> str:
    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for title, rows in sheets.items():
        ws = wb.create_sheet(title)
        for row in rows:
            ws.append(row)
    wb.save(path)
    return str(path)


def _data(i0: Any = 0, i1: Any = "EI0", **extra: Any) -> dict[str, Any]:
    return {"type": "sheet_data", "sheet_idx0": i0, "sheet_idx1": i1, **extra}


def _cell(coordinate: str, sheet: Any = 0, **props: tuple[str, Any]) -> dict[str, Any]:
    specs = {prop: {"method": method, "ref": ref} for prop, (method, ref) in props.items()}
    return {"type": "check_cell", "sheet_idx": sheet, "coordinate": coordinate, "props": specs}


def test_compare_table_sheet_data(tmp_path: Path) -> None:
    gold = _xlsx(tmp_path / "gold.xlsx", Sheet1=[["n", "v"], ["a", 1.5]], Sheet2=[["x"]])
    good = _xlsx(tmp_path / "good.xlsx", Sheet1=[["n", "v"], ["a", 1.50001]], Sheet2=[["x"]])
    bad = _xlsx(tmp_path / "bad.xlsx", Sheet1=[["n", "v"], ["a", 2]], Sheet2=[["x"]])
    assert compare_table(good, gold, rules=[_data()]) == 1.0  # rounded to 4 digits
    assert compare_table(good, gold, rules=[_data(precision=5)]) == 0.0
    assert compare_table(bad, gold, rules=[_data()]) == 0.0
    assert compare_table(bad, gold, rules=[_data("RNSheet2", "ENSheet2"), {"type": "sheet_name"}]) == 1.0
    assert compare_table(bad, gold, rules=[_data("RNSheet2", "ENSheet2"), _data()]) == 0.0
    assert compare_table(good, gold, rules=[_data(0, "ENMissing")]) == 0.0
    assert compare_table(good, gold, rules=[]) == 1.0


def test_compare_table_unusable_result_scores_zero(tmp_path: Path) -> None:
    gold = _xlsx(tmp_path / "gold.xlsx", Sheet1=[["x"]])
    junk = tmp_path / "junk.xlsx"
    junk.write_text("not a workbook")
    for result in (None, str(tmp_path / "missing.xlsx"), str(junk)):
        assert compare_table(result, gold, rules=[_data()]) == 0.0


def test_compare_table_sheet_print_reads_the_exported_csv(tmp_path: Path) -> None:
    result = _xlsx(tmp_path / "out.xlsx", Sheet1=[["x"]])
    gold = _xlsx(tmp_path / "gold.xlsx", Sheet1=[["x"]])
    (tmp_path / "out-Sheet1.csv").write_bytes(b"A,B\r\n 1,2 \r\n\r\n")
    (tmp_path / "gold-Sheet1.csv").write_text("a,b\n1,2\n")
    rule = {"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}
    assert compare_table(result, gold, rules=[rule]) == 0.0
    assert compare_table(result, gold, rules=[{**rule, "ignore_case": True}]) == 1.0
    assert compare_table(result, gold, rules=[{**rule, "sheet_idx1": "ENOther", "ignore_case": True}]) == 0.0


def test_compare_table_sheet_fuzzy(tmp_path: Path) -> None:
    result = _xlsx(tmp_path / "out.xlsx", Sheet1=[["+ Main Rd.", 7], ["Colour", "A (b)"]])
    gold = _xlsx(tmp_path / "gold.xlsx", Sheet1=[["main road", 7.0], ["Color", "ab"]])

    def fuzzy(**spec: Any) -> float:
        rule = {"type": "sheet_fuzzy", "sheet_idx0": 0, "sheet_idx1": "EI0", "rules": [spec]}
        return compare_table(result, gold, rules=[rule])

    assert fuzzy(range=["A1"], type="exact_match") == 0.0
    normalised = {"normalization": [["Rd", "Road"]], "trim_leadings": "+ ", "trim_trailings": "."}
    assert fuzzy(range=["A1"], type="exact_match", ignore_case=True, **normalised) == 1.0
    assert fuzzy(range=["B1", "C1:C9"], type="exact_match") == 1.0  # 7 and 7.0 both read "7.0"
    assert fuzzy(range=["A2"], type="fuzzy_match") == 1.0
    assert fuzzy(range=["A2"], type="fuzzy_match", threshold=95) == 0.0
    assert fuzzy(range=["B2"], type="exact_match", ignore_chars=" ()", ignore_case=True) == 1.0
    assert fuzzy(range=["A2"], type="includes") == 0.0
    assert fuzzy(range=["A2"], type="included_by") == 0.0


def test_compare_table_check_cell(tmp_path: Path) -> None:
    path = tmp_path / "out.xlsx"
    wb = openpyxl.Workbook()
    ws = wb.active
    ws["A1"], ws["B1"], ws["C1"] = -186.93, "Total: 12", "x,y"
    ws["A1"].font = Font(bold=True)
    ws.merge_cells("D1:E1")
    wb.save(path)
    result = str(path)
    assert compare_table(result, rules=[_cell("A1", value=("approx:0.1", -186.9))]) == 1.0
    assert compare_table(result, rules=[_cell("A1", value=("approx:0.01", -186.9))]) == 0.0
    assert compare_table(result, rules=[_cell("A1", value=("lt", 0), font_bold=("eq", True))]) == 1.0
    assert compare_table(result, rules=[_cell("B1", value=("re.I", r"^total: \d+$"))]) == 1.0
    assert compare_table(result, rules=[_cell("B1", value=("gt", 3))]) == 0.0  # str vs int: a failed check
    assert compare_table(result, rules=[_cell("C1", value=("str_set_eq", ["y", "x"]))]) == 1.0
    assert (
        compare_table(result, rules=[_cell("E1", merge=("eq", True)), _cell("D1", merge=("eq", False))])
        == 1.0
    )
    assert compare_table(result, rules=[_cell("A1", "RNNope", value=("eq", -186.93))]) == 0.0


def test_compare_table_rejects_what_it_cannot_score(tmp_path: Path) -> None:
    result = _xlsx(tmp_path / "out.xlsx", Sheet1=[["x"]])
    with pytest.raises(UnsupportedMetric, match="rule type 'pivot_table'"):
        compare_table(None, rules=[{"type": "pivot_table"}])  # even before looking at the result
    with pytest.raises(UnsupportedMetric, match="sheet_fuzzy type 'soundex'"):
        validate_rules(
            [{"type": "sheet_fuzzy", "sheet_idx0": 0, "sheet_idx1": 0, "rules": [{"type": "soundex"}]}]
        )
    with pytest.raises(UnsupportedMetric, match="method 'spreadsheet_range'"):
        validate_rules([_cell("A1", value=("spreadsheet_range", ["A1", "B2"]))])
    with pytest.raises(UnsupportedMetric, match="property 'font_shadow'"):
        validate_rules([_cell("A1", font_shadow=("eq", True))])
    with pytest.raises(ValueError, match="unrecognised sheet index 'XX0'"):
        validate_rules([_data("XX0")])
    with pytest.raises(ValueError, match="unknown regex flag"):
        validate_rules([_cell("A1", value=("re.NOPE", "x"))])
    with pytest.raises(re.error):
        validate_rules([_cell("A1", value=("re", "(unclosed"))])
    with pytest.raises(ValueError, match="needs the expected workbook"):
        compare_table(result, rules=[_data()])


def test_raw_cells_follow_the_workbook_relationships(tmp_path: Path) -> None:
    # Renumber the sheetIds (as Excel leaves them after a sheet is deleted): the part is found through
    # workbook.xml.rels, not by guessing sheet<sheetId>.xml.
    path = tmp_path / "book.xlsx"
    _xlsx(path, First=[["first", 1]], Second=[["second", 2.5]])
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    parts["xl/workbook.xml"] = parts["xl/workbook.xml"].replace(b'sheetId="1"', b'sheetId="7"')
    with zipfile.ZipFile(path, "w") as z:
        for name, data in parts.items():
            z.writestr(name, data)
    assert read_raw_cells(str(path), "First") == {"A1": "first", "B1": 1.0}
    assert read_raw_cells(str(path), "Second") == {"A1": "second", "B1": 2.5}
    assert read_raw_cells(str(path), "Third") == {}
    assert read_raw_cells(str(tmp_path / "missing.xlsx"), "First") == {}


# ---- compare_docx_files ----


def _document(path: Path, *paragraphs: str) -> str:
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    document.save(path)
    return str(path)


def test_compare_docx_files(tmp_path: Path) -> None:
    gold = _document(tmp_path / "gold.docx", "Title", "", "Body  text")
    flat = _document(tmp_path / "flat.docx", "Title Body text")
    swapped = _document(tmp_path / "swapped.docx", "body  text", "", "title")
    assert compare_docx_files(flat, gold) == 1.0  # ignore_blanks by default: one collapsed text
    assert compare_docx_files(flat, gold, ignore_blanks=False) == 0.0  # paragraph counts differ
    assert compare_docx_files(swapped, gold, ignore_blanks=False, ignore_order=True) == 0.0
    assert compare_docx_files(swapped, gold, ignore_blanks=False, ignore_order=True, ignore_case=True) == 1.0
    # "title" vs "Title", "" vs "", "body  text" vs "Body  text": (0.8 + 1 + 0.9) / 3
    score = compare_docx_files(swapped, gold, ignore_blanks=False, ignore_order=True, fuzzy_match=True)
    assert score == pytest.approx((0.8 + 1.0 + 0.9) / 3)
    assert 0.0 < compare_docx_files(swapped, gold, content_only=True) < 1.0
    assert compare_docx_files(None, gold) == 0.0
    assert compare_docx_files(str(tmp_path / "missing.docx"), gold) == 0.0
    assert compare_docx_files(gold.replace(".docx", ".txt"), gold) == 0.0
    with pytest.raises(UnsupportedMetric, match=r"\.odt"):
        compare_docx_files("a.odt", "b.odt")


def test_a_metric_whose_library_is_missing_is_reported_with_the_extra(monkeypatch) -> None:
    """A suite check names what to install when a metric's module needs a library that is absent."""
    import sys
    import types

    from guirl.vmpool.tasks.check import EXTRA, lacking_modules

    family = types.ModuleType("guirl_test_family")
    family.REQUIRES = ("json", "no_such_module_anywhere")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, family.__name__, family)

    def metric(result: object) -> float:
        return 1.0

    metric.__module__ = family.__name__
    assert lacking_modules(metric) == ["no_such_module_anywhere"]
    assert "guirl[osworld]" in EXTRA
    # in the test environment (`make setup-test` installs the extra) every registered one is importable
    for name, fn in METRICS.items():
        assert lacking_modules(fn) == [], name


# guirl's own dependencies (setup.cfg install_requires), by import name: everything else a metric, getter or
# setup step imports belongs to the `osworld` extra and must be declared, or a run would find it missing
# only when a task is scored
CORE_IMPORTS = {
    "zmq", "msgspec", "msgpack", "uvloop", "aiohttp", "mss", "pyautogui", "Xlib", "openpyxl", "pandas",
    "rapidfuzz", "docx", "pptx", "torch", "transformers", "safetensors", "PIL", "numpy", "pyarrow", "guirl",
}  # fmt: skip


def test_every_import_beyond_guirls_dependencies_is_declared() -> None:
    """Read every module of the tasks package (not imported): each third-party module it imports, at the top
    or inside a function, is a core dependency or in its `REQUIRES` (so `guirl eval` names what to install
    before a run instead of a task failing when it is scored)."""
    import ast
    import sys

    import guirl.vmpool.tasks as tasks_package

    root = Path(tasks_package.__file__).parent
    undeclared = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        declared: set[str] = set()
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "REQUIRES" for t in node.targets):
                declared = set(ast.literal_eval(node.value))
            elif isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
        third_party = imported - CORE_IMPORTS - set(sys.stdlib_module_names) - {"__future__"}
        if third_party - declared:
            undeclared[str(path.relative_to(root))] = sorted(third_party - declared)
    assert undeclared == {}
