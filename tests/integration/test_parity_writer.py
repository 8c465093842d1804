"""Parity of guirl's Writer metrics (`metrics/writer.py`, `writer_text.py`, `writer_ocr.py`) with OSWorld's
(desktop-env 1.0.2 `metrics/docs.py`, and `compare_conference_city_in_order` from `metrics/table.py`).

Documents whose property LibreOffice writes (line spacing, tab stops, footer page numbers, page breaks,
strike-through, highlighting, colours, fonts, tables, images, and the default font in the user registry)
are written by LibreOffice itself: flat-ODF sources converted in one `soffice` call to .docx and, in
parallel, one to .odt. Documents where only the text matters are written with python-docx, workbooks with
openpyxl. Each case states the score both implementations must give.

compare_image_text: the reference OCRs with easyocr (torch plus a model download: not available here);
guirl OCRs with Tesseract. Its parity cases replace easyocr's reader in the reference by one that returns
Tesseract's words, so they check the reference's other logic (file checks, X11 dump handling, matching).
"""

from __future__ import annotations

import base64
import hashlib
import io
import shutil
import subprocess
import types
import zipfile
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from docx import Document
from docx.oxml.ns import qn
from PIL import Image, ImageDraw, ImageFont
from rapidfuzz import fuzz

from guirl.vmpool.tasks.metrics import METRICS, UnsupportedMetric
from guirl.vmpool.tasks.metrics.writer_ocr import ocr_text
from tests.osworld_reference import reference

REF = reference("metrics.docs", absent=["easyocr"])
REF_TABLE = reference("metrics.table")


def _ref(name: str) -> Any:
    return getattr(REF_TABLE if name == "compare_conference_city_in_order" else REF, name)


# ---------------------------------------------------------------------------------------------- inputs

_NS = " ".join(
    f'xmlns:{prefix}="{uri}"'
    for prefix, uri in {
        "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
        "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
        "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
        "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
        "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
        "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0",
        "svg": "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0",
    }.items()
)


def _para_style(name: str, properties: str, inner: str = "") -> str:
    return (
        f'<style:style style:name="{name}" style:family="paragraph">'
        f"<style:paragraph-properties {properties}>{inner}</style:paragraph-properties></style:style>"
    )


def _tab_style(name: str, position: str, kind: str) -> str:
    stop = f'<style:tab-stop style:position="{position}" style:type="{kind}"/>'
    return _para_style(name, "", f"<style:tab-stops>{stop}</style:tab-stops>")


_TEXT_STYLES = {
    "Tstrike": 'style:text-line-through-style="solid" style:text-line-through-type="single"',
    "Tyellow": 'fo:background-color="#ffff00"',
    "Tgreen": 'fo:background-color="#00ff00"',
    "Tred": 'fo:color="#ff0000"',
    "Tred240": 'fo:color="#f00000"',  # CIEDE2000 3.19 from pure red: within the default 3.5
    "Tred230": 'fo:color="#e60000"',  # 5.38: outside it
    "Tblue": 'fo:color="#0000ff"',
    "Tsub": 'style:text-position="sub 58%"',
    "Titalic14": 'fo:font-style="italic" fo:font-size="14pt"',
    "Titalic12": 'fo:font-style="italic" fo:font-size="12pt"',
    "Ttimes": 'style:font-name="Times New Roman"',
    "Tsans": 'style:font-name="Liberation Sans"',
}
# A4 with 2 cm margins: a 17 cm text width, 9638 twips in the exported .docx
_AUTOMATIC_STYLES = (
    '<style:page-layout style:name="pm1"><style:page-layout-properties fo:page-width="21cm" '
    'fo:page-height="29.7cm" fo:margin-left="2cm" fo:margin-right="2cm" fo:margin-top="2cm" '
    'fo:margin-bottom="2cm"/></style:page-layout>'
    + _para_style("Pcenter", 'fo:text-align="center"')
    + _para_style("Pdouble", 'fo:line-height="200%"')
    + _para_style("Ponehalf", 'fo:line-height="150%"')
    + _para_style("Pbreak", 'fo:break-before="page"')
    + _tab_style("Tab17", "17cm", "right")
    + _tab_style("Tab16", "16cm", "right")
    + _tab_style("TabLeft17", "17cm", "left")
    + "".join(
        f'<style:style style:name="{name}" style:family="text"><style:text-properties {props}/></style:style>'
        for name, props in _TEXT_STYLES.items()
    )
)


def _fodt(body: str, footer: str | None = None) -> str:
    master = '<style:master-page style:name="Standard" style:page-layout-name="pm1">'
    if footer is not None:
        master += f"<style:footer><text:p>{footer}</text:p></style:footer>"
    fonts = "".join(
        f'<style:font-face style:name="{f}" svg:font-family="&apos;{f}&apos;"/>'
        for f in ("Times New Roman", "Liberation Sans")
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><office:document {_NS} office:version="1.3" '
        'office:mimetype="application/vnd.oasis.opendocument.text">'
        f"<office:font-face-decls>{fonts}</office:font-face-decls>"
        f"<office:automatic-styles>{_AUTOMATIC_STYLES}</office:automatic-styles>"
        f"<office:master-styles>{master}</style:master-page></office:master-styles>"
        f"<office:body><office:text>{body}</office:text></office:body></office:document>"
    )


def _p(text: str, style: str | None = None) -> str:
    return f'<text:p text:style-name="{style}">{text}</text:p>' if style else f"<text:p>{text}</text:p>"


def _span(text: str, style: str) -> str:
    return f'<text:span text:style-name="{style}">{text}</text:span>'


def _table(rows: list[list[str]]) -> str:
    cells = "".join(
        "<table:table-row>"
        + "".join(f'<table:table-cell office:value-type="string">{_p(c)}</table:table-cell>' for c in row)
        + "</table:table-row>"
        for row in rows
    )
    columns = f'<table:table-column table:number-columns-repeated="{len(rows[0])}"/>'
    return f"<table:table>{columns}{cells}</table:table>"


def _image(color: str) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 12), color).save(buffer, "PNG")
    data = base64.b64encode(buffer.getvalue()).decode()
    return (
        '<text:p><draw:frame text:anchor-type="as-char" svg:width="1cm" svg:height="0.75cm">'
        f"<draw:image><office:binary-data>{data}</office:binary-data></draw:image></draw:frame></text:p>"
    )


_INTRO, _BODY, _END = "Introduction in one line.", "The body of the essay.", "A short conclusion."
_TAB_LINES = ["Ebook purchase info\tavailable from the library", "Print copies are\tsold at the shop"]


def _tabbed(style: str, lines: list[str] = _TAB_LINES) -> str:
    return "".join(_p(line.replace("\t", "<text:tab/>"), style) for line in lines)


def _course(last: str) -> str:
    return _p("Course outline") + _p("Assessment is by essay.") + _p(last)


def _words(apple: str, egg: str = "Tred", ball: str = "Tblue", cat: str = "Tblue") -> str:
    cell = {"apple": apple, "egg": egg, "ball": ball, "cat": cat}
    rows = [["apple", "ball"], ["egg", "cat"]]
    return _p("Sight words") + _table([[_span(w, cell[w]) if cell[w] else w for w in row] for row in rows])


def _italic(size: str, text: str = "Read the ") -> str:
    return _p(text + _span("assigned chapters", size) + " before class.")


WRITER_DOCS = {
    "spacing_gold": _p(_INTRO) + _p(_BODY, "Pdouble") + _p(_END, "Ponehalf"),
    "spacing_same": _p(_INTRO) + _p(_BODY, "Pdouble") + _p(_END, "Ponehalf"),
    "spacing_single": _p(_INTRO) + _p(_BODY) + _p(_END, "Ponehalf"),
    "spacing_text": _p(_INTRO) + _p("Another body.", "Pdouble") + _p(_END, "Ponehalf"),
    "tabs_gold": _tabbed("Tab17"),
    "tabs_same": _tabbed("Tab17"),
    "tabs_16": _tabbed("Tab16"),
    "tabs_left": _tabbed("TabLeft17"),
    "tabs_none": _tabbed("Pcenter"),
    "tabs_4words": _tabbed(
        "Tab17", ["Ebook purchase info now\tavailable", "Print copies are\tsold at the shop"]
    ),
    "footer_page": _p("Open source word processing") + _p("Second page", "Pbreak"),
    "footer_text": _p("Open source word processing"),
    "plain": _p("Open source word processing"),
    "strike_gold": _course("This paragraph is redundant."),
    "strike_all": _course(_span("This paragraph", "Tstrike") + _span(" is redundant.", "Tstrike")),
    "strike_partial": _course(_span("This paragraph", "Tstrike") + " is redundant."),
    "strike_text": _course(_span("This is redundant.", "Tstrike")),
    "colors_gold": _words(""),
    "colors_ok": _words("Tred"),
    "colors_near": _words("Tred240"),
    "colors_off": _words("Tred230"),
    "colors_swapped": _words("Tblue"),
    "colors_unset": _words("", egg=""),
    "italic_gold": _italic("Titalic14"),
    "italic_12": _italic("Titalic12"),
    "italic_plain": _p("Read the assigned chapters before class."),
    "italic_text": _italic("Titalic14", "Skim the "),
    "sub": _p("H" + _span("2", "Tsub") + "O is water."),
    "sub_none": _p("H2O is water."),
    "fonts_all": _p(_span("Dublin Zoo", "Ttimes")) + _p(_span("opened in 1831.", "Ttimes")),
    "fonts_mixed": _p(_span("Dublin Zoo", "Ttimes"))
    + _p(_span("opened", "Ttimes") + _span(" in 1831.", "Tsans")),
    "centered": _p("Constitution", "Pcenter") + _p("Article one"),
    "breaks_2": _p("Declaration") + _p("Second", "Pbreak") + _p("Third", "Pbreak"),
    "table_gold": _p("Effort") + _table([["Task", "Hours", "Owner"], ["Draft", "3", "Ann"]]),
    "table_same": _p("Effort") + _table([["Task", "Hours", "Owner"], ["Draft", "3", "Ann"]]),
    "table_cell": _p("Effort") + _table([["Task", "Hours", "Owner"], ["Draft", "4", "Ann"]]),
    "table_wide": _p("Effort") + _table([["Task", "Hours", "Owner", ""], ["Draft", "3", "Ann", ""]]),
    "table_two": _p("Effort") + _table([["Task", "Hours", "Owner"], ["Draft", "3", "Ann"]]) + _table([["x"]]),
    "image_gold": _p("Schedule") + _image("red"),
    "image_same": _p("Schedule") + _image("red"),
    "image_other": _p("Schedule") + _image("blue"),
}
_FOOTERS = {
    "footer_page": 'Page <text:page-number text:select-page="current">1</text:page-number>',
    "footer_text": "Confidential",
}

HIGHLIGHT_DOCS = {
    "hl_gold": _p("Thank you for calling.") + _p("We are recruiting volunteers."),
    "hl_removed": _p("Thank you for " + _span("calling", "Tred") + ".") + _p("We are recruiting volunteers."),
    "hl_left": _p("Thank you for " + _span("calling", "Tyellow") + ".") + _p("We are recruiting volunteers."),
    "hl_green": _p("Thank you for " + _span("calling", "Tgreen") + ".") + _p("We are recruiting volunteers."),
    "hl_text": _p("Thank you for " + _span("phoning", "Tred") + ".") + _p("We are recruiting volunteers."),
}

# LibreOffice rewrites its user registry on exit, keeping a seeded Writer default font in its own format
_REGISTRY_SEED = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
    'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
    '<item oor:path="/org.openoffice.Office.Writer/DefaultFont"><prop oor:name="Standard" oor:op="fuse">'
    "<value>Times New Roman</value></prop></item>\n</oor:items>\n"
)


def _soffice(profile: Path, target: str, sources: list[Path], outdir: Path) -> subprocess.Popen[bytes]:
    command = [
        "soffice",
        f"-env:UserInstallation={profile.as_uri()}",
        "--headless",
        "--convert-to",
        target,
        "--outdir",
        str(outdir),
        *map(str, sources),
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _python_docx(path: Path, paragraphs: list[str]) -> None:
    doc = Document()
    for text in paragraphs:
        doc.add_paragraph(text)
    doc.save(path)


_REFS = ["Smith, J. (2020). Learning by doing. Journal of Teaching, 4(2).", "Doe, A. (2019). Case methods."]
_TRAINS = [
    "06:00:01, T101, S1, P1",
    "06:03:10, T102, S2, P2",
    "06:05:00, T101, S3, P1",
    "06:09:30, T103, S1, P3",
]


def _text_docs(out: Path) -> None:
    """Documents whose text alone is scored, written with python-docx."""
    body = ["Case study", "Teaching with cases works."]
    _python_docx(out / "refs_gold.docx", [*body, "References", _REFS[0], "", _REFS[1]])
    _python_docx(out / "refs_same.docx", [*body, "References", _REFS[0], _REFS[1], ""])
    _python_docx(out / "refs_typo.docx", [*body, "References", _REFS[0].replace("doing", "doin"), _REFS[1]])
    _python_docx(out / "refs_far.docx", [*body, "References", "Unrelated entry one.", "Unrelated two."])
    _python_docx(out / "refs_short.docx", [*body, "References", _REFS[0]])
    _python_docx(out / "refs_none.docx", body)
    _python_docx(out / "refs_empty.docx", [*body, "References"])
    gemini = ["Gemini: the answer is 4.", "Gemini: Paris."]
    _python_docx(out / "lines_gold.docx", gemini)
    _python_docx(out / "lines_blank.docx", ["", gemini[0], "", "", gemini[1], ""])
    _python_docx(out / "lines_merged.docx", [" ".join(gemini)])
    _python_docx(out / "lines_other.docx", [gemini[0], "Gemini: Lyon."])
    _python_docx(out / "trains_initial.docx", [_TRAINS[0], _TRAINS[1], _TRAINS[0], _TRAINS[2], _TRAINS[3]])
    unique = [_TRAINS[0], _TRAINS[1], _TRAINS[3]]
    _python_docx(out / "trains_gold.docx", unique)
    _python_docx(out / "trains_ok.docx", ["", *unique, ""])
    _python_docx(out / "trains_dup.docx", [*unique, _TRAINS[2]])
    _python_docx(out / "trains_foreign.docx", [*unique[:2], "06:09:30, T104, S1, P3"])
    _python_docx(out / "trains_missing.docx", unique[:2])
    _python_docx(out / "blank_a.docx", ["", " "])
    _python_docx(out / "blank_b.docx", [""])


CITIES: list[Any] = [
    "Scottsdale",
    "Atlanta",
    ["Lake Tahoe", "Stateline"],
    ["Banff", "Alberta's Rockies", "Alberta\u2019s Rockies"],
    "Beijing",
    ["Montreal", "Montr\u00e9al"],
    "San Diego",
    "Lille",
    ["Montreal", "Montr\u00e9al"],
    "San Juan",
    ["New York", "New York City", "NYC"],
    "Barcelona",
    "Toulon",
    "Sydney",
    ["Los Angeles", "Long Beach", "LA"],
    "Vancouver",
    "Stockholm",
    ["Montreal", "Montr\u00e9al"],
    "New Orleans",
    ["Los Angeles", "Long Beach", "LA"],
    "Vancouver",
]
"""The expected cities of task 6f4073b8 (multi_apps), in its rules' shape."""


def _workbook(path: Path, column_c: list[Any]) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["Conference", "Year", "City"])
    for i, city in enumerate(column_c):
        sheet.append([f"Conf {i}", 2013 + i // 3, city])
    book.save(path)


def _cities_docs(out: Path) -> None:
    answer = [c if isinstance(c, str) else c[-1] for c in CITIES]
    _workbook(out / "cities_ok.xlsx", [f"{c}, somewhere" for c in answer])
    _workbook(out / "cities_wrong.xlsx", answer[:5] + ["Toronto"] + answer[6:])
    _workbook(out / "cities_empty.xlsx", answer[:20])
    _workbook(out / "cities_number.xlsx", answer[:3] + [2016] + answer[4:])


def _terminal(path: Path, fmt: str = "PNG") -> Image.Image:
    """A terminal after `ls`, drawn with a real monospace font (light text on the dark Ubuntu ground)."""
    font = ImageFont.truetype(_MONO_FONT, 14)
    image = Image.new("RGB", (560, 48), (48, 10, 36))
    draw = ImageDraw.Draw(image)
    draw.text((6, 6), "user@vm:~$ ls", font=font, fill=(220, 220, 220))
    draw.text((6, 26), "Desktop  Documents  Downloads  Music  Pictures", font=font, fill=(114, 159, 207))
    image.save(path, fmt)
    return image


_MONO_FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"


def _images(out: Path) -> None:
    _terminal(out / "ls.png")
    Image.new("RGB", (560, 48), (48, 10, 36)).save(out / "blank.png")
    # an X11 window dump named .png (what `xwd -root -out ls.png` leaves), written by netpbm's pnmtoxwd
    _terminal(out / "ls_source.ppm", "PPM")
    with open(out / "ls_xwd.png", "wb") as f:
        subprocess.run(
            ["pnmtoxwd", str(out / "ls_source.ppm")], stdout=f, stderr=subprocess.DEVNULL, check=True
        )


def _derived(out: Path) -> None:
    """python-docx edits of LibreOffice's documents, for inputs the reference crashes on."""
    doc = Document(out / "tabs_gold.docx")
    for paragraph in doc.paragraphs:
        for stop in paragraph._p.pPr.tabs.iterchildren(qn("w:tab")):
            if stop.get(qn("w:val")) == "right":  # 40 inches further right: far past the page
                stop.set(qn("w:pos"), str(int(stop.get(qn("w:pos"))) + 40 * 1440))
    doc.save(out / "tabs_far.docx")
    doc = Document(out / "table_gold.docx")
    row = doc.tables[0].rows[1]._tr
    row.remove(row.tc_lst[-1])  # a ragged row: fewer cells than the table's grid
    doc.save(out / "table_ragged.docx")
    doc = Document(out / "centered.docx")
    for paragraph in doc.paragraphs:
        paragraph._p.getparent().remove(paragraph._p)
    doc.add_table(rows=1, cols=1)  # a body with a table and no paragraph at all
    doc.save(out / "no_paragraph.docx")
    for name in ("image_gold", "image_same"):  # an embedded image Pillow cannot decode (e.g. EMF)
        with (
            zipfile.ZipFile(out / f"{name}.docx") as src,
            zipfile.ZipFile(out / f"{name}_emf.docx", "w") as dst,
        ):
            for item in src.infolist():
                data = src.read(item)
                dst.writestr(
                    item,
                    b"\x01\x00\x00\x00 not a raster" if item.filename.startswith("word/media/") else data,
                )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """name -> path of every input; LibreOffice's two conversions run in parallel, one profile each."""
    if (
        shutil.which("soffice") is None
        or shutil.which("tesseract") is None
        or shutil.which("pnmtoxwd") is None
    ):
        pytest.fail("needs LibreOffice Writer, tesseract-ocr and netpbm (Debian packages)", pytrace=False)
    root = tmp_path_factory.mktemp("writer")
    src, out = root / "src", root / "out"
    src.mkdir()
    out.mkdir()
    writer_sources = []
    for name, body in WRITER_DOCS.items():
        (src / f"{name}.fodt").write_text(_fodt(body, _FOOTERS.get(name)))
        writer_sources.append(src / f"{name}.fodt")
    (root / "odt").mkdir()
    odt_sources = []
    for name, body in HIGHLIGHT_DOCS.items():
        (root / "odt" / f"{name}.fodt").write_text(_fodt(body))
        odt_sources.append(root / "odt" / f"{name}.fodt")
    seeded = root / "profile_seeded"
    (seeded / "user").mkdir(parents=True)
    (seeded / "user" / "registrymodifications.xcu").write_text(_REGISTRY_SEED)
    fresh = root / "profile_fresh"
    jobs = [_soffice(seeded, "docx", writer_sources, out), _soffice(fresh, "odt", odt_sources, out)]
    _text_docs(out)
    _cities_docs(out)
    _images(out)
    for job in jobs:
        _, err = job.communicate(timeout=120)
        assert job.returncode == 0, err.decode()
    shutil.copy(seeded / "user" / "registrymodifications.xcu", out / "registry_times.xcu")
    shutil.copy(fresh / "user" / "registrymodifications.xcu", out / "registry_fresh.xcu")
    _derived(out)
    for suffix in ("docx", "odt", "xlsx", "png"):
        (out / f"garbage_{suffix}.{suffix}").write_bytes(b"this is no document")
    (out / "garbage_xcu.xcu").write_bytes(b"<oor:items")
    paths = {p.stem: str(p) for p in out.iterdir()}
    paths["missing"] = str(out / "missing.docx")
    return paths


_OCR_CACHE: dict[str, str] = {}


@pytest.fixture
def tesseract_for_easyocr(monkeypatch: pytest.MonkeyPatch) -> None:
    """easyocr's Reader in the reference, answering with Tesseract's words (as guirl reads them)."""

    class Reader:
        def __init__(self, languages: list[str]) -> None:
            assert languages == ["en"]

        def readtext(self, path: str) -> list[tuple[None, str, float]]:
            with Image.open(path) as image:  # raises, as easyocr does, on a file it cannot decode
                pixels = image.convert("RGB")
            key = hashlib.sha256(pixels.tobytes()).hexdigest()
            if key not in _OCR_CACHE:  # the same image is read for several rules
                _OCR_CACHE[key] = ocr_text(pixels)
            return [(None, word, 1.0) for word in _OCR_CACHE[key].split()]

    monkeypatch.setattr(REF, "easyocr", types.SimpleNamespace(Reader=Reader))


# ----------------------------------------------------------------------------------------------- cases


def _resolve(arg: Any, files: dict[str, str]) -> Any:
    """The path of input `name` for "@name", lists item by item, anything else as it is."""
    if isinstance(arg, str) and arg.startswith("@"):
        return files[arg[1:]]
    if isinstance(arg, list):
        return [_resolve(a, files) for a in arg]
    return arg


_TABS = {"word_number_split_by_tabstop": 3, "index": 0}  # task 0a0faba3's options
_REFS_OPTIONS = {"content_only": True, "reference_base_result": 0.93}  # task 2c1ebcd7's options
_TNR = {"font_name": "Times New Roman"}
_TRAIN_EXPECTED = ["@trains_gold", "@trains_initial"]


def _refs_score(pairs: list[tuple[str, str]], base: float) -> float:
    mean = sum(fuzz.ratio(a, b) / 100.0 for a, b in pairs) / len(pairs)
    return (mean - base) / (1 - base) if mean >= base + 0.01 else 0.0


_TYPO_SCORE = _refs_score([(_REFS[0].replace("doing", "doin"), _REFS[0]), (_REFS[1], _REFS[1])], 0.93)
_TYPO_SCORE_DEFAULT = _refs_score([(_REFS[0].replace("doing", "doin"), _REFS[0]), (_REFS[1], _REFS[1])], 0.5)
# 1 - (1 cm of 17 cm text width) per paragraph, in LibreOffice's twips: 567 of 9638
_TABS_16_SCORE = 1 - 567 / 9638

# (id, metric, positional args, options, score both must give)
CASES: list[tuple[str, str, tuple[Any, ...], dict[str, Any], float]] = [
    ("spacing_same", "compare_line_spacing", ("@spacing_same", "@spacing_gold"), {}, 1.0),
    ("spacing_single", "compare_line_spacing", ("@spacing_single", "@spacing_gold"), {}, 0.0),
    ("spacing_text", "compare_line_spacing", ("@spacing_text", "@spacing_gold"), {}, 0.0),
    ("tables_same", "compare_docx_tables", ("@table_same", "@table_gold"), {}, 1.0),
    ("tables_cell", "compare_docx_tables", ("@table_cell", "@table_gold"), {}, 0.0),
    ("tables_wide", "compare_docx_tables", ("@table_wide", "@table_gold"), {}, 0.0),
    ("tables_two", "compare_docx_tables", ("@table_two", "@table_gold"), {}, 0.0),
    ("tables_none", "compare_docx_tables", ("@plain", "@table_gold"), {}, 0.0),
    ("tables_neither", "compare_docx_tables", ("@plain", "@centered"), {}, 1.0),
    ("images_same", "compare_docx_images", ("@image_same", "@image_gold"), {}, 1.0),
    ("images_other", "compare_docx_images", ("@image_other", "@image_gold"), {}, 0.0),
    ("images_none", "compare_docx_images", ("@plain", "@image_gold"), {}, 0.0),
    ("tabs_same", "check_tabstops", ("@tabs_same", "@tabs_gold"), _TABS, 1.0),
    ("tabs_16cm", "check_tabstops", ("@tabs_16", "@tabs_gold"), _TABS, _TABS_16_SCORE),
    ("tabs_left", "check_tabstops", ("@tabs_left", "@tabs_gold"), _TABS, 0.0),
    ("tabs_none", "check_tabstops", ("@tabs_none", "@tabs_gold"), _TABS, 0.0),
    ("tabs_4words", "check_tabstops", ("@tabs_4words", "@tabs_gold"), _TABS, 0.0),
    ("tabs_4words_no_option", "check_tabstops", ("@tabs_4words", "@tabs_gold"), {}, 1.0),
    ("tabs_paragraph_count", "check_tabstops", ("@plain", "@tabs_gold"), _TABS, 0.0),
    ("subscript", "compare_subscript_contains", ("@sub", "@sub"), {}, 1.0),
    ("subscript_none", "compare_subscript_contains", ("@sub_none", "@sub"), {}, 0.0),
    ("page_number", "has_page_numbers_in_footers", ("@footer_page",), {}, 1.0),
    ("footer_no_digit", "has_page_numbers_in_footers", ("@footer_text",), {}, 0.0),
    ("no_footer", "has_page_numbers_in_footers", ("@plain",), {}, 0.0),
    ("fonts_all", "compare_font_names", ("@fonts_all", _TNR), {}, 1.0),
    ("fonts_mixed", "compare_font_names", ("@fonts_mixed", _TNR), {}, 0.0),
    ("fonts_unset", "compare_font_names", ("@plain", _TNR), {}, 0.0),
    ("centered", "is_first_line_centered", ("@centered",), {}, 1.0),
    ("not_centered", "is_first_line_centered", ("@plain",), {}, 0.0),
    ("highlight_removed", "check_highlighted_words", ("@hl_removed", "@hl_gold"), {}, 1.0),
    ("highlight_left", "check_highlighted_words", ("@hl_left", "@hl_gold"), {}, 0.0),
    ("highlight_green", "check_highlighted_words", ("@hl_green", "@hl_gold"), {}, 1.0),
    ("highlight_text", "check_highlighted_words", ("@hl_text", "@hl_gold"), {}, 0.0),
    ("highlight_docx", "check_highlighted_words", ("@hl_removed", "@plain"), {}, 0.0),
    ("trains_ok", "compare_unique_train_records", ("@trains_ok", _TRAIN_EXPECTED), {}, 1.0),
    ("trains_dup", "compare_unique_train_records", ("@trains_dup", _TRAIN_EXPECTED), {}, 0.0),
    ("trains_foreign", "compare_unique_train_records", ("@trains_foreign", _TRAIN_EXPECTED), {}, 0.0),
    ("trains_missing", "compare_unique_train_records", ("@trains_missing", _TRAIN_EXPECTED), {}, 0.0),
    ("trains_one_expected", "compare_unique_train_records", ("@trains_ok", ["@trains_gold"]), {}, 0.0),
    ("trains_expected_str", "compare_unique_train_records", ("@trains_ok", "@trains_gold"), {}, 0.0),
    ("strike_all", "evaluate_strike_through_last_paragraph", ("@strike_all", "@strike_gold"), {}, 1.0),
    (
        "strike_partial",
        "evaluate_strike_through_last_paragraph",
        ("@strike_partial", "@strike_gold"),
        {},
        0.0,
    ),
    ("strike_none", "evaluate_strike_through_last_paragraph", ("@strike_gold", "@strike_gold"), {}, 0.0),
    ("strike_text", "evaluate_strike_through_last_paragraph", ("@strike_text", "@strike_gold"), {}, 0.0),
    ("colors_ok", "evaluate_colored_words_in_tables", ("@colors_ok", "@colors_gold"), {}, 1.0),
    ("colors_near", "evaluate_colored_words_in_tables", ("@colors_near", "@colors_gold"), {}, 1.0),
    ("colors_off", "evaluate_colored_words_in_tables", ("@colors_off", "@colors_gold"), {}, 0.0),
    (
        "colors_threshold",
        "evaluate_colored_words_in_tables",
        ("@colors_off", "@colors_gold"),
        {"threshold": 6},
        1.0,
    ),
    ("colors_swapped", "evaluate_colored_words_in_tables", ("@colors_swapped", "@colors_gold"), {}, 0.0),
    ("colors_text", "evaluate_colored_words_in_tables", ("@colors_ok", "@table_gold"), {}, 0.0),
    ("italic_14", "check_italic_font_size_14", ("@italic_gold", "@italic_gold"), {}, 1.0),
    ("italic_12", "check_italic_font_size_14", ("@italic_12", "@italic_gold"), {}, 0.0),
    ("italic_none", "check_italic_font_size_14", ("@italic_plain", "@italic_gold"), {}, 1.0),
    ("italic_text", "check_italic_font_size_14", ("@italic_text", "@italic_gold"), {}, 0.0),
    ("breaks_count", "contains_page_break", ("@breaks_2", {"page_break_count": 2}), {}, 1.0),
    ("breaks_count_off", "contains_page_break", ("@breaks_2", {"page_break_count": 5}), {}, 0.0),
    ("breaks_any", "contains_page_break", ("@breaks_2", {}), {}, 1.0),
    ("breaks_rules_none", "contains_page_break", ("@breaks_2", None), {}, 1.0),
    ("breaks_none", "contains_page_break", ("@plain", {}), {}, 0.0),
    ("default_font", "find_default_font", ("@registry_times", _TNR), {}, 1.0),
    (
        "default_font_other",
        "find_default_font",
        ("@registry_times", {"font_name": "Liberation Serif"}),
        {},
        0.0,
    ),
    ("default_font_unset", "find_default_font", ("@registry_fresh", _TNR), {}, 0.0),
    ("refs_same", "compare_references", ("@refs_same", "@refs_gold"), _REFS_OPTIONS, 1.0),
    ("refs_typo", "compare_references", ("@refs_typo", "@refs_gold"), _REFS_OPTIONS, _TYPO_SCORE),
    ("refs_typo_default", "compare_references", ("@refs_typo", "@refs_gold"), {}, _TYPO_SCORE_DEFAULT),
    ("refs_far", "compare_references", ("@refs_far", "@refs_gold"), _REFS_OPTIONS, 0.0),
    ("refs_short", "compare_references", ("@refs_short", "@refs_gold"), _REFS_OPTIONS, 0.0),
    ("refs_missing", "compare_references", ("@refs_none", "@refs_gold"), _REFS_OPTIONS, 0.0),
    ("refs_neither", "compare_references", ("@refs_none", "@lines_gold"), _REFS_OPTIONS, 1.0),
    (
        "refs_indicator",
        "compare_references",
        ("@refs_same", "@refs_gold"),
        {"reference_indicator": "Sources"},
        1.0,
    ),
    (
        "lines_blank",
        "compare_docx_files_and_ignore_new_lines",
        ("@lines_blank", "@lines_gold"),
        {"ignore_blanks": False},
        1.0,
    ),
    (
        "lines_merged",
        "compare_docx_files_and_ignore_new_lines",
        ("@lines_merged", "@lines_gold"),
        {"ignore_blanks": False},
        0.0,
    ),
    (
        "lines_merged_blanks",
        "compare_docx_files_and_ignore_new_lines",
        ("@lines_merged", "@lines_gold"),
        {},
        1.0,
    ),
    (
        "lines_other",
        "compare_docx_files_and_ignore_new_lines",
        ("@lines_other", "@lines_gold"),
        {"ignore_blanks": False},
        0.0,
    ),
    ("lines_odt", "compare_docx_files_and_ignore_new_lines", ("@hl_gold", "@hl_gold"), {}, 0.0),
    ("cities_ok", "compare_conference_city_in_order", ("@cities_ok", {"expected": CITIES}), {}, 1.0),
    ("cities_wrong", "compare_conference_city_in_order", ("@cities_wrong", {"expected": CITIES}), {}, 0.0),
    ("cities_empty", "compare_conference_city_in_order", ("@cities_empty", {"expected": CITIES}), {}, 0.0),
    ("cities_number", "compare_conference_city_in_order", ("@cities_number", {"expected": CITIES}), {}, 0.0),
    (
        "cities_short_rules",
        "compare_conference_city_in_order",
        ("@cities_ok", {"expected": CITIES[:20]}),
        {},
        0.0,
    ),
]


@pytest.mark.parametrize(
    ("metric", "args", "options", "score"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_parity(
    files: dict[str, str], metric: str, args: tuple[Any, ...], options: dict[str, Any], score: float
):
    resolved = [_resolve(a, files) for a in args]
    assert _ref(metric)(*resolved, **options) == pytest.approx(score, abs=1e-9), "reference"
    assert METRICS[metric](*resolved, **options) == pytest.approx(score, abs=1e-9), "guirl"


# (metric, args with "RESULT" in the result's place): every metric scores a spoiled result 0
SPOILABLE: list[tuple[str, tuple[Any, ...]]] = [
    ("compare_line_spacing", ("RESULT", "@spacing_gold")),
    ("compare_docx_tables", ("RESULT", "@table_gold")),
    ("compare_docx_images", ("RESULT", "@image_gold")),
    ("check_tabstops", ("RESULT", "@tabs_gold")),
    ("compare_subscript_contains", ("RESULT", "@sub")),
    ("has_page_numbers_in_footers", ("RESULT",)),
    ("compare_font_names", ("RESULT", _TNR)),
    ("is_first_line_centered", ("RESULT",)),
    ("check_highlighted_words", ("RESULT", "@hl_gold")),
    ("compare_unique_train_records", ("RESULT", _TRAIN_EXPECTED)),
    ("evaluate_strike_through_last_paragraph", ("RESULT", "@strike_gold")),
    ("evaluate_colored_words_in_tables", ("RESULT", "@colors_gold")),
    ("check_italic_font_size_14", ("RESULT", "@italic_gold")),
    ("contains_page_break", ("RESULT", {"page_break_count": 5})),
    ("find_default_font", ("RESULT", _TNR)),
    ("compare_references", ("RESULT", "@refs_gold")),
    ("compare_docx_files_and_ignore_new_lines", ("RESULT", "@lines_gold")),
]
_SUFFIX = {"check_highlighted_words": "odt", "find_default_font": "xcu"}


@pytest.mark.parametrize(("metric", "args"), SPOILABLE, ids=[s[0] for s in SPOILABLE])
@pytest.mark.parametrize("spoiled", ["none", "missing", "garbage"])
def test_spoiled_result(files: dict[str, str], metric: str, args: tuple[Any, ...], spoiled: str):
    result = {
        "none": None,
        "missing": files["missing"],
        "garbage": files[f"garbage_{_SUFFIX.get(metric, 'docx')}"],
    }[spoiled]
    resolved = [result if a == "RESULT" else _resolve(a, files) for a in args]
    assert _ref(metric)(*resolved) == 0, "reference"
    assert METRICS[metric](*resolved) == 0.0, "guirl"


@pytest.mark.usefixtures("tesseract_for_easyocr")
@pytest.mark.parametrize(
    ("image", "text", "score"),
    [
        ("@ls", "ls", 1.0),  # task 02ce9a50's first rule
        ("@ls", "Downloads", 1.0),
        ("@ls", "1s", 0.0),  # its other rules: easyocr may read "ls" as "1s"; Tesseract reads it right
        ("@blank", "ls", 0.0),
        ("@garbage_png", "ls", 0.0),
        ("@missing", "ls", 0.0),
        (None, "ls", 0.0),
    ],
)
def test_image_text(files: dict[str, str], image: str | None, text: str, score: float):
    path = _resolve(image, files)
    rule = {"type": "text", "text": text}
    assert REF.compare_image_text(path, rule) == score, "reference, easyocr replaced by Tesseract"
    assert METRICS["compare_image_text"](path, rule) == score, "guirl"


# ------------------------------------------------------------------------------ deliberate differences


@pytest.mark.usefixtures("tesseract_for_easyocr")
def test_deliberate_differences(files: dict[str, str]):
    """One block per difference: what the reference does, then what guirl does instead."""
    m = METRICS
    # compare_docx_tables — a ragged row (fewer cells than the grid): the reference raises IndexError;
    # guirl scores 0 (the table cannot be compared cell by cell).
    with pytest.raises(IndexError):
        REF.compare_docx_tables(files["table_ragged"], files["table_gold"])
    assert m["compare_docx_tables"](files["table_ragged"], files["table_gold"]) == 0.0
    # compare_docx_images — an embedded image Pillow cannot decode (EMF, SVG): the reference raises;
    # guirl compares the image bytes.
    with pytest.raises(Exception, match="cannot identify image file"):
        REF.compare_docx_images(files["image_same_emf"], files["image_gold_emf"])
    assert m["compare_docx_images"](files["image_same_emf"], files["image_gold_emf"]) == 1.0
    # check_tabstops — stops far from the gold's: the reference's score goes below 0; guirl's stops at 0.
    assert REF.check_tabstops(files["tabs_far"], files["tabs_gold"], **_TABS) < 0
    assert m["check_tabstops"](files["tabs_far"], files["tabs_gold"], **_TABS) == 0.0
    # check_tabstops — no non-blank paragraph on either side: the reference divides by zero; guirl 1.0.
    with pytest.raises(ZeroDivisionError):
        REF.check_tabstops(files["blank_a"], files["blank_b"])
    assert m["check_tabstops"](files["blank_a"], files["blank_b"]) == 1.0
    # check_tabstops — `index` past the tab-separated parts: the reference raises IndexError; guirl 0.0.
    with pytest.raises(IndexError):
        REF.check_tabstops(files["tabs_same"], files["tabs_gold"], word_number_split_by_tabstop=3, index=5)
    assert (
        m["check_tabstops"](files["tabs_same"], files["tabs_gold"], word_number_split_by_tabstop=3, index=5)
        == 0
    )
    # is_first_line_centered — a body without paragraphs: the reference raises IndexError; guirl 0.0.
    with pytest.raises(IndexError):
        REF.is_first_line_centered(files["no_paragraph"])
    assert m["is_first_line_centered"](files["no_paragraph"]) == 0.0
    # evaluate_colored_words_in_tables — a word with no colour: the reference raises TypeError on its
    # missing RGB; guirl scores 0 (the word is not coloured as asked).
    with pytest.raises(TypeError):
        REF.evaluate_colored_words_in_tables(files["colors_unset"], files["colors_gold"])
    assert m["evaluate_colored_words_in_tables"](files["colors_unset"], files["colors_gold"]) == 0.0
    # check_highlighted_words — two .docx with equal text: the reference opens the result as .odt and
    # raises; guirl 0.0 (the task compares .odt files).
    with pytest.raises(KeyError):
        REF.check_highlighted_words(files["plain"], files["plain"])
    assert m["check_highlighted_words"](files["plain"], files["plain"]) == 0.0
    # compare_references — both reference sections empty: the reference divides by zero; guirl 1.0.
    with pytest.raises(ZeroDivisionError):
        REF.compare_references(files["refs_empty"], files["refs_empty"])
    assert m["compare_references"](files["refs_empty"], files["refs_empty"]) == 1.0
    # compare_conference_city_in_order — a missing or unreadable workbook: the reference raises from
    # openpyxl; guirl 0.0.
    for spoiled in (None, files["missing"], files["garbage_xlsx"]):
        with pytest.raises(Exception):  # noqa: B017 - openpyxl raises TypeError, FileNotFoundError, ...
            REF_TABLE.compare_conference_city_in_order(spoiled, {"expected": CITIES})
        assert m["compare_conference_city_in_order"](spoiled, {"expected": CITIES}) == 0.0
    # gold documents — one that cannot be opened: the reference scores 0, so the task can never pass;
    # guirl raises (an environment fault), as its compare_docx_files does.
    assert REF.compare_docx_tables(files["table_same"], files["garbage_docx"]) == 0
    with pytest.raises(Exception):  # noqa: B017 - python-docx raises its PackageNotFoundError
        m["compare_docx_tables"](files["table_same"], files["garbage_docx"])
    # compare_image_text — an X11 window dump saved as .png (`xwd -root -out ls.png`, 24-bit depth in
    # 32-bit pixels after a colormap): the reference's own reader takes 3 bytes a pixel from the
    # header's end, so it OCRs noise; guirl decodes the dump.
    rule = {"type": "text", "text": "ls"}
    assert REF.compare_image_text(files["ls_xwd"], rule) == 0
    assert m["compare_image_text"](files["ls_xwd"], rule) == 1.0
    # compare_image_text — a rule type other than "text": the reference scores 0; guirl raises
    # UnsupportedMetric (the task could never be passed). OCR engine: easyocr there, Tesseract here.
    assert REF.compare_image_text(files["ls"], {"type": "regex", "text": "l+s"}) == 0
    with pytest.raises(UnsupportedMetric):
        m["compare_image_text"](files["ls"], {"type": "regex", "text": "l+s"})
