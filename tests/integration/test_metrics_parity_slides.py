"""Parity of guirl's `compare_pptx_files` with OSWorld's (desktop-env 1.0.2 `metrics/slides.py`).

The reference module imports only the stdlib and python-pptx, so it is loaded by file path under a
private name (docs/osworld-compat.md §5.3) without running the wheel's heavy `metrics/__init__`. Decks
are built with python-pptx in tmp_path; each case must score the same under both implementations.

Deliberate difference: a missing file (None or a path that does not exist) scores 0.0 in guirl, while
the reference passes None to `Presentation`, which opens python-pptx's blank template, so (None, None)
scores 1 there, and it raises on a path that does not exist.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pptx import Presentation
from pptx.dml.color import RGBColor
from pptx.enum.text import PP_ALIGN
from pptx.exc import PackageNotFoundError
from pptx.util import Inches, Pt

from guirl.vmpool.tasks.metrics import METRICS

REFERENCE_VERSION = "1.0.2"


def _load_reference() -> Callable[..., Any]:
    try:
        version = importlib.metadata.version("desktop-env")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"install desktop-env=={REFERENCE_VERSION} (`make setup-test`)", pytrace=False)
    if version != REFERENCE_VERSION:
        pytest.fail(f"parity is pinned to desktop-env=={REFERENCE_VERSION}, found {version}", pytrace=False)
    # the installed files, found without importing the package (another test may have put stub packages
    # named desktop_env in sys.modules)
    files = importlib.metadata.files("desktop-env") or []
    found = [
        f for f in files if str(f).replace("\\", "/").endswith("desktop_env/evaluators/metrics/slides.py")
    ]
    assert found, "desktop-env is installed without its metrics"
    path = Path(found[0].locate())
    mspec = importlib.util.spec_from_file_location("_osworld_reference_slides", path)
    assert mspec is not None and mspec.loader is not None
    module = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(module)
    return module.compare_pptx_files


REFERENCE = _load_reference()
OURS = METRICS["compare_pptx_files"]


def _deck(path: Path, **change: Any) -> str:
    """A three-slide deck: title slide with notes, bulleted body, a table; `change` perturbs one thing."""
    prs = Presentation()
    s1 = prs.slides.add_slide(prs.slide_layouts[0])
    s1.shapes.title.text = change.get("title", "Quarterly report")
    s1.placeholders[1].text = "Prepared by the team"
    s1.notes_slide.notes_text_frame.text = change.get("notes", "Open with the summary")
    if "background" in change:
        fill = s1.background.fill
        fill.solid()
        fill.fore_color.rgb = RGBColor.from_string(change["background"])

    s2 = prs.slides.add_slide(prs.slide_layouts[1])
    s2.shapes.title.text = "Highlights"
    body = s2.placeholders[1].text_frame
    body.text = "Revenue grew"
    para = body.add_paragraph()
    para.level = change.get("level", 1)
    run = para.add_run()
    run.text = change.get("bullet", "Costs fell")
    font = run.font
    font.size = Pt(change.get("size", 18))
    font.bold = change.get("bold", True)
    font.italic = change.get("italic")
    font.underline = change.get("underline")
    font.name = change.get("font", "Arial")
    font.color.rgb = RGBColor.from_string(change.get("color", "1F4E79"))
    if "align" in change:
        para.alignment = change["align"]
    box = s2.shapes.add_textbox(Inches(1), Inches(5), Inches(change.get("box_width", 4)), Inches(1))
    box.text_frame.text = "Footnote"
    if change.get("extra_shape"):
        s2.shapes.add_textbox(Inches(6), Inches(5), Inches(2), Inches(1)).text_frame.text = "Extra"

    s3 = prs.slides.add_slide(prs.slide_layouts[5])
    s3.shapes.title.text = "Numbers"
    table = s3.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(6), Inches(2)).table
    for r in range(2):
        for c in range(2):
            table.cell(r, c).text = f"r{r}c{c}"
    table.cell(1, 1).text = change.get("cell", "r1c1")
    if change.get("cell_bold"):
        table.cell(1, 1).text_frame.paragraphs[0].runs[0].font.bold = True

    if change.get("extra_slide"):
        prs.slides.add_slide(prs.slide_layouts[6])
    prs.save(path)
    return str(path)


# (id, changes to the produced deck, options); the gold deck is _deck() unchanged.
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("identical", {}, {}),
    ("title_text", {"title": "Annual report"}, {}),
    # examine_text=False alone does not hide a text change: the bullet check compares each slide's text
    ("title_text_caught_by_bullets", {"title": "Annual report"}, {"examine_text": False}),
    ("title_text_ignored", {"title": "Annual report"}, {"examine_text": False, "examine_bullets": False}),
    ("bullet_text_caught_by_bullets", {"bullet": "Costs rose"}, {"examine_text": False}),
    ("font_size", {"size": 20}, {}),
    ("font_size_ignored", {"size": 20}, {"examine_font_size": False}),
    ("bold_off", {"bold": False}, {}),
    ("bold_unset_vs_true", {"bold": None}, {}),
    ("italic_false_vs_none", {"italic": False}, {}),
    ("underline", {"underline": True}, {}),
    ("font_name", {"font": "Calibri"}, {}),
    ("color", {"color": "FF0000"}, {}),
    ("color_ignored", {"color": "FF0000"}, {"examine_color_rgb": False}),
    ("alignment_center", {"align": PP_ALIGN.CENTER}, {}),
    ("alignment_left_is_default", {"align": PP_ALIGN.LEFT}, {}),
    ("level", {"level": 0}, {}),
    ("level_ignored_still_bullets", {"level": 0}, {"examine_indent": False}),
    ("extra_slide", {"extra_slide": True}, {}),
    ("extra_slide_ignored", {"extra_slide": True}, {"examine_number_of_slides": False}),
    ("extra_shape", {"extra_shape": True}, {}),
    ("shape_width", {"box_width": 5}, {}),
    ("shape_width_ignored", {"box_width": 5}, {"examine_shape": False}),
    ("shift_size_rule", {"box_width": 5}, {"examine_shape": False, "examine_shape_for_shift_size": True}),
    ("modify_height_rule", {"box_width": 5}, {"examine_shape": False, "examine_modify_height": True}),
    ("image_size_rule", {}, {"examine_image_size": True}),
    ("table_cell_text", {"cell": "changed"}, {}),
    # the table check compares layout and run formatting, not cell text; only the bullet check reads it
    ("table_cell_text_bullets_off", {"cell": "changed"}, {"examine_bullets": False}),
    ("table_cell_bold", {"cell_bold": True}, {}),
    ("notes", {"notes": "Open with the outlook"}, {}),
    ("notes_ignored", {"notes": "Open with the outlook"}, {"examine_note": False}),
    ("background", {"background": "FFEEDD"}, {}),
    ("background_ignored", {"background": "FFEEDD"}, {"examine_background_color": False}),
]


@pytest.fixture(scope="module")
def gold(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _deck(tmp_path_factory.mktemp("gold") / "gold.pptx")


@pytest.fixture(autouse=True)
def _quiet_reference_debug_log() -> None:
    # The reference attaches a DEBUG StreamHandler to its own logger on every call (enable_debug).
    logging.getLogger("desktopenv.metric.slides.debug").setLevel(logging.WARNING)


@pytest.mark.parametrize(("change", "options"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_compare_pptx_files_parity(
    change: dict[str, Any], options: dict[str, Any], gold: str, tmp_path: Path
) -> None:
    result = _deck(tmp_path / "result.pptx", **change)
    options = {"enable_debug": False, **options}
    reference = float(REFERENCE(result, gold, **options))
    assert OURS(result, gold, **options) == reference
    assert OURS(gold, result, **options) == float(REFERENCE(gold, result, **options))


def test_cases_cover_passes_and_fails(tmp_path: Path, gold: str) -> None:
    scores = {
        float(REFERENCE(_deck(tmp_path / f"{i}.pptx", **c), gold, enable_debug=False, **o))
        for i, (_, c, o) in enumerate(CASES)
    }
    assert scores == {0.0, 1.0}


def test_missing_file_differs_on_purpose(tmp_path: Path, gold: str) -> None:
    assert REFERENCE(None, None, enable_debug=False) == 1  # both open python-pptx's blank template
    assert OURS(None, None) == 0.0
    assert OURS(None, gold) == 0.0
    assert OURS(str(tmp_path / "absent.pptx"), gold) == 0.0
    (tmp_path / "corrupt.pptx").write_bytes(b"not a zip")
    assert OURS(str(tmp_path / "corrupt.pptx"), gold) == 0.0
    with pytest.raises(PackageNotFoundError):
        REFERENCE(str(tmp_path / "absent.pptx"), gold, enable_debug=False)
