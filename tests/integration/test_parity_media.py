"""Parity of guirl's media metrics (PDFs, archives, HTML, audio, video, MP3 tags, e-books, CSV) and the
content_from_vm_file / vm_wallpaper getters with OSWorld's (desktop-env 1.0.2 `metrics/pdf.py`,
`chrome.py`, `others.py`, `vlc.py`, `table.py`; `getters/file.py`, `info.py`).

PDFs are written by LibreOffice (one `soffice --convert-to pdf` call for the module: text documents from
Writer, pictures from Draw, as the suite's PDFs are made); audio is generated with numpy and written by
libsndfile (WAV, and MP3 through LAME), videos by OpenCV, MP3 tags by mutagen, archives by zipfile and
tarfile, e-books and HTML as the text formats they are. Each case states the score both implementations
must give (for a fuzzy or continuous score, the range it must fall in, and guirl must equal the reference);
deliberate differences are in `test_differences_on_purpose`.
"""

from __future__ import annotations

import csv
import importlib
import subprocess
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import openpyxl
import pytest
import soundfile
from mutagen.easyid3 import EasyID3
from mutagen.id3 import ID3NoHeaderError
from PIL import Image, ImageDraw

from guirl.vmpool.client import VMClient
from guirl.vmpool.tasks.getters import GETTERS
from guirl.vmpool.tasks.metrics import METRICS, UnsupportedMetric
from guirl.vmpool.tasks.setup import TaskContext
from tests.helpers import run
from tests.integration.vm_file_server import vm_file_server
from tests.osworld_reference import reference

# chrome.py imports borb (PDF writing) and vlc.py acoustid (fingerprint lookups) at the top; neither is
# used by the functions tested here
_ABSENT = ["borb", "borb.pdf", "acoustid"]
PDF = reference("metrics.pdf", absent=_ABSENT)
CHROME = reference("metrics.chrome", absent=_ABSENT)
OTHERS = reference("metrics.others", absent=_ABSENT)
VLC = reference("metrics.vlc", absent=_ABSENT)
TABLE = reference("metrics.table", absent=_ABSENT)
REF_FILE = reference("getters.file", absent=_ABSENT)
REF_INFO = reference("getters.info", absent=_ABSENT)
REF_CONTROLLER = importlib.import_module("desktop_env.controllers.python").PythonController
REF = {
    "compare_pdfs": CHROME.compare_pdfs,
    "check_pdf_pages": PDF.check_pdf_pages,
    "compare_pdf_images": CHROME.compare_pdf_images,
    "compare_archive": CHROME.compare_archive,
    "compare_htmls": CHROME.compare_htmls,
    "compare_audios": VLC.compare_audios,
    "compare_videos": VLC.compare_videos,
    "check_mp3_meta": OTHERS.check_mp3_meta,
    "compare_epub": OTHERS.compare_epub,
    "compare_csv": TABLE.compare_csv,
}

_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar".split()
)


def _report(edit: bool = False) -> str:
    # 70 lines: two pages in Writer's default page style
    lines = [" ".join(_WORDS[(i + k) % len(_WORDS)] for k in range(9)) + f" {i}." for i in range(70)]
    if edit:
        lines[3] = "This sentence was rewritten by the agent."
        lines[40] = lines[40].upper()
    return "\n".join(lines) + "\n"


def _picture(path: Path, variant: int) -> None:
    image = Image.new("RGB", (400, 300), "white")
    draw = ImageDraw.Draw(image)
    if variant == 0:  # a receipt: ruled lines and a total box
        for y in range(30, 250, 20):
            draw.line((30, y, 370, y), fill="black", width=2)
        draw.rectangle((250, 255, 370, 290), fill="black")
    else:  # another picture altogether
        draw.ellipse((50, 30, 350, 280), fill="darkgreen")
        draw.rectangle((0, 0, 120, 90), fill="purple")
    image.save(path)


@pytest.fixture(scope="module")
def pdfs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pdfs")
    src, out = root / "src", root / "pdf"
    src.mkdir()
    (src / "report.txt").write_text(_report(), "utf-8")
    (src / "report_copy.txt").write_text(_report(), "utf-8")
    (src / "report_edit.txt").write_text(_report(edit=True), "utf-8")
    (src / "memo.txt").write_text("Memo\nThe meeting moves to Thursday at ten.\n", "utf-8")
    _picture(src / "receipt.png", 0)
    _picture(src / "receipt_copy.png", 0)
    _picture(src / "other.png", 1)
    done = subprocess.run(
        [
            "soffice",
            "--headless",
            f"-env:UserInstallation={(root / 'profile').as_uri()}",
            "--convert-to",
            "pdf",
        ]
        + ["--outdir", str(out), *sorted(str(p) for p in src.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    paths = {p.stem: str(p) for p in out.glob("*.pdf")}
    assert len(paths) == 7, (sorted(paths), done.stdout, done.stderr)
    return paths


def _both(name: str, *args: Any, **options: Any) -> float:
    """The score both implementations give (asserted equal)."""
    ours = METRICS[name](*args, **options)
    theirs = float(REF[name](*args, **options))
    assert ours == pytest.approx(theirs, abs=1e-9), (name, ours, theirs)
    return ours


# -- PDFs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "expected", "low", "high"),
    [
        ("report_copy", "report", 1.0, 1.0),
        ("report_edit", "report", 0.9, 0.99),  # two of 70 lines changed: a high but imperfect ratio
        ("memo", "report", 0.0, 0.1),
        (["report_copy", "memo"], ["report", "memo"], 1.0, 1.0),  # the suite's multi-file tasks
        (["memo", "report"], ["report", "memo"], 0.0, 0.1),
        ([None, "memo"], ["report", "memo"], 0.5, 0.5),  # a file the VM lacked counts 0
        ("receipt", "receipt_copy", 1.0, 1.0),  # no text on either side
    ],
)
def test_compare_pdfs(pdfs: dict[str, str], result: Any, expected: Any, low: float, high: float) -> None:
    def path(name: Any) -> Any:
        if isinstance(name, list):
            return [path(n) for n in name]
        return None if name is None else pdfs[name]

    assert low <= _both("compare_pdfs", path(result), path(expected)) <= high


@pytest.mark.parametrize(
    ("pdf", "rules", "score"),
    [
        ("memo", {"relation": "eq", "ref_value": 1}, 1.0),
        ("report", {"relation": "eq", "ref_value": 1}, 0.0),  # the task: fit everything on one page
        ("report", {"relation": "eq", "ref_value": 2}, 1.0),
        ("report", {"relation": "gt", "ref_value": 1}, 1.0),
        ("report", {"relation": "le", "ref_value": 1}, 0.0),
    ],
)
def test_check_pdf_pages(pdfs: dict[str, str], pdf: str, rules: dict[str, Any], score: float) -> None:
    assert _both("check_pdf_pages", pdfs[pdf], rules) == score


@pytest.mark.parametrize(
    ("result", "expected", "score"),
    [
        ("receipt_copy", "receipt", 1.0),  # the same picture converted again
        ("other", "receipt", 0.0),  # a different picture
        ("report", "receipt", 0.0),  # no picture where one is expected
        ("report", "memo", 1.0),  # neither has a picture
    ],
)
def test_compare_pdf_images(pdfs: dict[str, str], result: str, expected: str, score: float) -> None:
    assert _both("compare_pdf_images", pdfs[result], pdfs[expected]) == score


# -- archives ------------------------------------------------------------------------------------------


def _zip(path: Path, members: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, source in members.items():
            zf.write(source, name)
    return str(path)


def _tar(path: Path, members: dict[str, str]) -> str:
    with tarfile.open(path, "w:gz") as tf:
        for name, source in members.items():
            tf.add(source, name)
    return str(path)


def _archive_pair(
    tmp_path: Path, pack: Any, suffix: str, pred: dict[str, str], gold: dict[str, str]
) -> tuple:
    # each side in its own folder: the reference unpacks next to the archive and caches the gold folder
    (tmp_path / "p").mkdir()
    (tmp_path / "g").mkdir()
    return pack(tmp_path / "p" / f"out{suffix}", pred), pack(tmp_path / "g" / f"gold{suffix}", gold)


@pytest.mark.parametrize(
    ("pred", "options", "low", "high"),
    [
        (
            {"slides/a.pdf": "report_copy", "slides/b.pdf": "memo"},
            {"file_path": "slides", "file_type": "pdf"},
            1,
            1,
        ),
        (
            {"slides/a.pdf": "report_edit", "slides/b.pdf": "memo"},
            {"file_path": "slides", "file_type": "pdf"},
            0.95,
            0.995,
        ),
        (
            {"slides/a.pdf": "report_copy"},
            {"file_path": "slides", "file_type": "pdf"},
            0,
            0,
        ),  # a file missing
        (
            {"slides/a.pdf": "report_copy", "slides/c.pdf": "memo"},
            {"file_path": "slides", "file_type": "pdf"},
            0,
            0,
        ),
    ],
)
def test_compare_archive_zip(
    pdfs: dict[str, str],
    tmp_path: Path,
    pred: dict[str, str],
    options: dict[str, Any],
    low: float,
    high: float,
) -> None:
    gold = {"slides/a.pdf": pdfs["report"], "slides/b.pdf": pdfs["memo"]}
    result, expected = _archive_pair(tmp_path, _zip, ".zip", {k: pdfs[v] for k, v in pred.items()}, gold)
    assert low <= _both("compare_archive", result, expected, **options) <= high


@pytest.mark.parametrize(("first", "score"), [("report_copy", 1.0), ("memo", 0.5)])
def test_compare_archive_tar(pdfs: dict[str, str], tmp_path: Path, first: str, score: float) -> None:
    pred = {"a.pdf": pdfs[first], "b.pdf": pdfs["memo"]}
    gold = {"a.pdf": pdfs["report"], "b.pdf": pdfs["memo"]}
    result, expected = _archive_pair(tmp_path, _tar, ".tar.gz", pred, gold)
    # memo against report scores a small ratio, not 0: the pair's mean is just above 0.5
    assert _both("compare_archive", result, expected, file_type="pdf") == pytest.approx(score, abs=0.05)


@pytest.mark.parametrize(("text", "score"), [("same\n", 1.0), ("changed\n", 0.5)])
def test_compare_archive_text(tmp_path: Path, text: str, score: float) -> None:
    (tmp_path / "x.txt").write_text("same\n", "utf-8")
    (tmp_path / "y.txt").write_text(text, "utf-8")
    (tmp_path / "z.txt").write_text("other\n", "utf-8")
    pred = {"notes/1.txt": str(tmp_path / "y.txt"), "notes/2.txt": str(tmp_path / "z.txt")}
    gold = {"notes/1.txt": str(tmp_path / "x.txt"), "notes/2.txt": str(tmp_path / "z.txt")}
    result, expected = _archive_pair(tmp_path, _zip, ".zip", pred, gold)
    assert _both("compare_archive", result, expected, file_path="notes") == score


# -- HTML ----------------------------------------------------------------------------------------------

# A table as LibreOffice Calc exports it to HTML (sdval/sdnum carry the cell's value and number format).
_HTML = """<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 4.0 Transitional//EN">
<html><head><meta http-equiv="content-type" content="text/html; charset=utf-8"/><title>{title}</title></head>
<body><table cellspacing="0" border="0">
<tr><td height="17" align="left">Year</td><td align="left">Value</td></tr>
<tr><td height="17" align="right" sdval="2021" sdnum="{sdnum}">2021</td><td align="right">{value}</td></tr>
</table>{tail}</body></html>
"""


def _html(
    path: Path, title: str = "survey", sdnum: str = "1033;", value: str = "728.5", tail: str = ""
) -> str:
    path.write_text(_HTML.format(title=title, sdnum=sdnum, value=value, tail=tail), "utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("change", "options", "score"),
    [
        ({}, {}, 1.0),
        ({}, {"ignore_sdnum": True}, 1.0),
        ({"sdnum": "1033;0;0"}, {}, 0.0),
        ({"sdnum": "1033;0;0"}, {"ignore_sdnum": True}, 1.0),
        ({"value": "728.6"}, {"ignore_sdnum": True}, 0.0),
        ({"title": "other"}, {"ignore_sdnum": True}, 0.0),
        ({"tail": "<p>extra</p>"}, {"ignore_sdnum": True}, 0.0),
    ],
)
def test_compare_htmls(tmp_path: Path, change: dict[str, str], options: dict[str, Any], score: float) -> None:
    result, expected = _html(tmp_path / "result.html", **change), _html(tmp_path / "gold.html")
    assert _both("compare_htmls", result, expected, **options) == score


# -- audio ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sounds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("audio")
    rng = np.random.default_rng(0)
    sr = 44100
    t = np.arange(sr * 4) / sr
    tune = 0.3 * np.sin(2 * np.pi * 440 * t * (1 + 0.1 * np.sin(t))) + 0.2 * np.sin(2 * np.pi * 660 * t) * (
        t % 1 < 0.5
    )
    tune = (tune + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
    other = (0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.7 < 0.3) + 0.05 * rng.standard_normal(t.size)).astype(
        np.float32
    )
    files = {
        "tune.wav": (np.stack([tune, 0.8 * tune], 1), sr, {}),  # stereo, 44.1 kHz
        "tune.mp3": (np.stack([tune, 0.8 * tune], 1), sr, {"format": "MP3"}),
        "tune16.wav": (tune, sr, {"subtype": "PCM_16"}),
        "other.wav": (other[::2], sr // 2, {}),
        "empty.wav": (np.zeros(0, np.float32), 22050, {}),
    }
    for name, (data, rate, kw) in files.items():
        soundfile.write(root / name, data, rate, **kw)
    (root / "broken.mp3").write_bytes(b"ID3 this is not an MPEG stream")
    return {name: str(root / name) for name in [*files, "broken.mp3"]}


@pytest.mark.parametrize(
    ("result", "expected", "low", "high"),
    [
        ("tune.wav", "tune.wav", 1.0, 1.0),
        ("tune.mp3", "tune.wav", 0.97, 0.9999),  # the same sound through MP3: close, not identical
        ("tune16.wav", "tune.mp3", 0.97, 0.9999),
        ("other.wav", "tune.wav", 0.3, 0.6),
        ("tune.mp3", "other.wav", 0.3, 0.6),
        ("empty.wav", "empty.wav", 1.0, 1.0),
        ("empty.wav", "tune.wav", 0.0, 0.0),
        ("broken.mp3", "tune.wav", 0.0, 0.0),
    ],
)
def test_compare_audios(sounds: dict[str, str], result: str, expected: str, low: float, high: float) -> None:
    ours = METRICS["compare_audios"](sounds[result], sounds[expected])
    theirs = float(REF["compare_audios"](sounds[result], sounds[expected]))
    # the same decoder, resampler and MFCCs; FastDTW recomputed with vectorised distances (rounding only)
    assert ours == pytest.approx(theirs, abs=1e-6)
    assert low <= ours <= high


# -- video ---------------------------------------------------------------------------------------------


def _frame(i: int) -> np.ndarray:
    """Frame i of a 64x64 scene: a gradient with a square moving across it (BGR)."""
    y, x = np.mgrid[0:64, 0:64]
    image = np.stack([(x * 4) % 256, (y * 4) % 256, ((x + y) * 2) % 256], -1).astype(np.uint8)
    image[8 + i % 40 : 24 + i % 40, 10:30] = (0, 0, 255)
    return image


def _video(path: Path, frames: list[np.ndarray], fourcc: str = "mp4v") -> str:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 10, (64, 64))
    assert writer.isOpened()
    for f in frames:
        writer.write(f)
    writer.release()
    return str(path)


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("video")
    frames = [_frame(i) for i in range(24)]
    flipped = [f[::-1].copy() for f in frames]
    return {
        "gold": _video(root / "gold.mp4", frames),
        "same": _video(root / "same.avi", frames, "MJPG"),  # re-encoded in another codec
        "flipped": _video(root / "flipped.mp4", flipped),  # the task's input: upside down
        "short": _video(root / "short.mp4", frames[:12]),
        "three_off": _video(root / "three_off.mp4", flipped[:3] + frames[3:]),
        "six_off": _video(root / "six_off.mp4", flipped[:6] + frames[6:]),
    }


@pytest.mark.parametrize(
    ("result", "options", "score"),
    [
        ("same", {}, 1.0),
        ("flipped", {}, 0.0),
        ("short", {}, 0.0),  # ends first
        ("short", {"max_frames_to_check": 10}, 1.0),  # ... after the frames checked
        ("three_off", {}, 1.0),  # at most `threshold` (5) frames may differ
        ("six_off", {}, 0.0),
        ("six_off", {"threshold": 6}, 1.0),
    ],
)
def test_compare_videos(videos: dict[str, str], result: str, options: dict[str, Any], score: float) -> None:
    assert _both("compare_videos", videos[result], videos["gold"], **options) == score


# -- MP3 tags ------------------------------------------------------------------------------------------


def _mp3(path: Path, **tags: Any) -> str:
    soundfile.write(path, np.zeros(4410, np.float32), 22050, format="MP3")
    if tags:
        id3 = EasyID3()
        for key, value in tags.items():
            id3[key] = value
        id3.save(path)
    return str(path)


def _eq(title: str, artist: str) -> dict[str, dict[str, str]]:
    return {"title": {"method": "eq", "ref": title}, "artist": {"method": "eq", "ref": artist}}


@pytest.mark.parametrize(
    ("tags", "rules", "score"),
    [
        ({"title": "Missing You", "artist": "Cheng Xiang"}, _eq("Missing You", "Cheng Xiang"), 1.0),
        ({"title": "Missing You", "artist": "Cheng"}, _eq("Missing You", "Cheng Xiang"), 0.0),
        ({"title": "Missing You"}, _eq("Missing You", "Cheng Xiang"), 0.0),  # no artist tag: ""
        ({"title": "Missing You"}, _eq("Missing You", ""), 1.0),
        ({"title": "夜上海", "artist": ["Zhou", "Xuan"]}, _eq("夜上海", "Zhou,Xuan"), 1.0),  # values joined
        ({"title": "Red Daughter"}, {"title": {"method": "re", "ref": "^Red"}}, 1.0),
    ],
)
def test_check_mp3_meta(tmp_path: Path, tags: dict[str, Any], rules: dict[str, Any], score: float) -> None:
    assert _both("check_mp3_meta", _mp3(tmp_path / "song.mp3", **tags), rules) == score


# -- EPUB ----------------------------------------------------------------------------------------------

_OPF = """<?xml version="1.0" encoding="utf-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="2.0" unique-identifier="uuid_id">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">
    <dc:title>Pass Through</dc:title>
    <dc:identifier id="uuid_id">{uid}</dc:identifier>
  </metadata>
  <manifest>{manifest}</manifest>
</package>
"""
_NCX = """<?xml version="1.0" encoding="utf-8"?>
<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1">
  <navMap>
    <navPoint id="{uid}-1" playOrder="1"><navLabel><text>Chapter 1</text></navLabel></navPoint>
  </navMap>
</ncx>
"""


def _epub(path: Path, chapters: list[str], uid: str = "a1", folder: str = "", wrap: bool = False) -> str:
    """An e-book laid out as Calibre writes one (everything at the root), or under `folder`."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mimetype", "application/epub+zip")
        items = "".join(f'<item href="ch{i}.html" id="c{i}"/>' for i in range(len(chapters)))
        zf.writestr(folder + "content.opf", _OPF.format(uid=uid, manifest=items))
        zf.writestr(folder + "toc.ncx", _NCX.format(uid=uid))
        for i, text in enumerate(chapters):
            body = "\n  ".join(f"<p>{line}</p>" for line in text.split(". "))
            sep = "\r\n" if wrap else ""
            zf.writestr(
                f"{folder}ch{i}.html",
                f"<html><head><title>Ch {i}</title></head>{sep}<body>{body}</body></html>",
            )
    return str(path)


_BOOK = ["It rained. The road ran on. Nobody came", "Morning again. The road ended. A door opened"]


@pytest.mark.parametrize(
    ("kind", "low", "high"),
    [
        ({"chapters": _BOOK}, 1.0, 1.0),
        ({"chapters": _BOOK, "uid": "b2", "wrap": True}, 1.0, 1.0),  # identifiers and line breaks differ
        ({"chapters": [_BOOK[0], "Morning again. The road went on. A door opened"]}, 0.75, 0.99),
        # a chapter missing: parts pair by position, so the rest pair with the wrong parts
        ({"chapters": _BOOK[:1]}, 0.2, 0.6),
        # other text in the same markup: most pretty-printed lines still agree
        ({"chapters": ["Something else entirely. Really"] * 2}, 0.8, 0.95),
    ],
)
def test_compare_epub(tmp_path: Path, kind: dict[str, Any], low: float, high: float) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "g").mkdir()
    result = _epub(tmp_path / "r" / "Pass Through.epub", **kind)
    expected = _epub(tmp_path / "g" / "Pass Through Gold.epub", _BOOK)
    assert low <= _both("compare_epub", result, expected) <= high


def test_compare_epub_not_a_book(tmp_path: Path) -> None:
    (tmp_path / "book.epub").write_text("plain text, not a zip", "utf-8")
    expected = _epub(tmp_path / "gold.epub", _BOOK)
    assert _both("compare_epub", str(tmp_path / "book.epub"), expected) == 0.0
    assert _both("compare_epub", None, expected) == 0.0


# -- CSV -----------------------------------------------------------------------------------------------

_ROWS = [["Name", "Email"], ["Ann Lee", "ann@example.com"], ["Bo Chen", "bo@example.com"]]


def _csv(path: Path, rows: list[list[str]], encoding: str = "utf-8", newline: str = "\n") -> str:
    with open(path, "w", encoding=encoding, newline="") as f:
        csv.writer(f, lineterminator=newline).writerows(rows)
    return str(path)


@pytest.mark.parametrize(
    ("result", "options", "score"),
    [
        ({}, {}, 1.0),
        ({"newline": "\r\n"}, {}, 1.0),  # line ends do not matter
        ({"rows": [*_ROWS, ["Cy Diaz", "cy@example.com"]]}, {}, 0.0),
        ({"rows": [["NAME", "EMAIL"], *_ROWS[1:]]}, {}, 0.0),
        ({"rows": [["NAME", "EMAIL"], *_ROWS[1:]]}, {"ignore_case": True}, 1.0),
        ({"rows": [["Name ", "Email"], *_ROWS[1:]]}, {}, 0.0),
        ({"rows": [["Name", "Email "], *_ROWS[1:]]}, {"strict": False}, 1.0),  # ends stripped
        ({"rows": [["Name", "Émail"], *_ROWS[1:]], "encoding": "latin-1"}, {}, 0.0),
    ],
)
def test_compare_csv(tmp_path: Path, result: dict[str, Any], options: dict[str, Any], score: float) -> None:
    pred = _csv(tmp_path / "out.csv", result.pop("rows", _ROWS), **result)
    assert _both("compare_csv", pred, _csv(tmp_path / "gold.csv", _ROWS), **options) == score


def test_compare_csv_gold_list_and_latin1(tmp_path: Path) -> None:
    pred = _csv(tmp_path / "out.csv", [["Name", "Émail"]], encoding="latin-1")
    golds = [_csv(tmp_path / "g1.csv", _ROWS), _csv(tmp_path / "g2.csv", [["Name", "Émail"]])]
    assert _both("compare_csv", pred, golds) == 1.0  # any gold matches; Latin-1 is read as such
    assert _both("compare_csv", pred, golds[:1]) == 0.0
    assert _both("compare_csv", None, golds) == 0.0


# -- getters -------------------------------------------------------------------------------------------


def _ref_env(port: int, cache: Path) -> SimpleNamespace:
    controller = REF_CONTROLLER("127.0.0.1", port)
    controller.retry_times, controller.retry_interval = 1, 0  # a refused request answers at once
    return SimpleNamespace(controller=controller, cache_dir=str(cache))


def _ours(name: str, config: dict[str, Any], address: str, cache: Path) -> Any:
    async def go() -> Any:
        async with VMClient(address, timeout_s=10, retries=1) as client:
            ctx = TaskContext(task_id="t", cache_dir=cache, download_cache=cache / "downloads")
            return await GETTERS[name](config, client, ctx)

    return run(go(), timeout=30)


def test_content_from_vm_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "Desktop").mkdir(parents=True)
    book = openpyxl.Workbook()
    for row in [
        ["Name", "Citations", "h-index", "Top paper"],
        ["Ann", 120, 7, "A"],
        ["Yann LeCun", 345074, 147, "Deep learning"],
    ]:
        book.active.append(row)
    book.save(home / "Desktop" / "researchers.xlsx")
    config = {
        "path": str(home / "Desktop" / "researchers.xlsx"),
        "file_type": "xlsx",
        "file_content": "last_row",
    }
    (tmp_path / "ours").mkdir()
    (tmp_path / "ref").mkdir()
    with vm_file_server(home) as (address, port):
        ours = _ours("content_from_vm_file", config, address, tmp_path / "ours")
        theirs = REF_FILE.get_content_from_vm_file(_ref_env(port, tmp_path / "ref"), config)
        assert ours == theirs == ["Yann LeCun", "345074", "147", "Deep learning"]
        # a workbook the VM lacks: the reference raises reading None; guirl gives None (deliberate)
        missing = {**config, "path": str(home / "Desktop" / "nope.xlsx")}
        assert _ours("content_from_vm_file", missing, address, tmp_path / "ours") is None
        with pytest.raises(ValueError):
            REF_FILE.get_content_from_vm_file(_ref_env(port, tmp_path / "ref"), missing)
        with pytest.raises(Exception, match="not implemented"):
            _ours("content_from_vm_file", {**config, "file_type": "docx"}, address, tmp_path / "ours")


@pytest.mark.parametrize("served", [True, False])
def test_vm_wallpaper(tmp_path: Path, served: bool) -> None:
    """The server sends the wallpaper file (guirl's: the one /setup/change_wallpaper set); with none set it
    answers 404, and both getters write an empty file, as the reference does when the VM gives nothing."""
    picture = tmp_path / "wallpaper.png"
    _picture(picture, 1)
    (tmp_path / "ours").mkdir()
    (tmp_path / "ref").mkdir()
    with vm_file_server(tmp_path, wallpaper=picture if served else None) as (address, port):
        ours = _ours("vm_wallpaper", {"dest": "background.png"}, address, tmp_path / "ours")
        theirs = REF_INFO.get_vm_wallpaper(_ref_env(port, tmp_path / "ref"), {"dest": "background.png"})
    content = picture.read_bytes() if served else b""
    assert Path(ours).read_bytes() == Path(theirs).read_bytes() == content
    assert Path(ours).name == Path(theirs).name == "background.png"


def test_spoiled_results_agree(pdfs: dict[str, str], sounds: dict[str, str], tmp_path: Path) -> None:
    """Results the policy spoiled that both implementations score 0."""
    absent = str(tmp_path / "absent")
    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4 truncated")
    bad = str(tmp_path / "bad.pdf")
    for name, args in [
        ("compare_pdfs", (absent, pdfs["report"])),
        ("compare_pdfs", (bad, pdfs["report"])),
        ("compare_pdf_images", (None, pdfs["receipt"])),
        ("compare_pdf_images", (absent, pdfs["receipt"])),
        ("compare_archive", (None, absent)),
        ("compare_audios", (None, sounds["tune.wav"])),
        ("compare_audios", (absent, sounds["tune.wav"])),
        ("check_mp3_meta", (None, _eq("Missing You", "Cheng Xiang"))),
        ("compare_csv", (absent, [absent])),
    ]:
        assert _both(name, *args) == 0.0, (name, args)


# -- deliberate differences ----------------------------------------------------------------------------


def test_differences_on_purpose(
    pdfs: dict[str, str], sounds: dict[str, str], videos: dict[str, str], tmp_path: Path
) -> None:
    """Each: what the reference does, then what guirl does instead."""
    absent = str(tmp_path / "absent")
    # compare_pdfs: None opens as a new empty PDF, so a missing result scores 1.0 against a PDF without
    # text; guirl scores a missing result 0.
    assert CHROME.compare_pdfs(None, pdfs["receipt"]) == 1.0
    assert METRICS["compare_pdfs"](None, pdfs["receipt"]) == 0.0
    # check_pdf_pages: a missing or corrupt PDF raises; guirl 0.
    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4 truncated")
    with pytest.raises(FileNotFoundError):
        PDF.check_pdf_pages(absent, {"relation": "eq", "ref_value": 1})
    assert METRICS["check_pdf_pages"](absent, {"relation": "eq", "ref_value": 1}) == 0.0
    assert METRICS["check_pdf_pages"](str(tmp_path / "bad.pdf"), {"relation": "eq", "ref_value": 1}) == 0.0
    assert METRICS["compare_pdf_images"](str(tmp_path / "bad.pdf"), pdfs["report"]) == 0.0
    # compare_archive: a result that is no archive, or lacks the folder `file_path`, raises; guirl 0.
    # An unknown file_type raises ValueError; guirl raises UnsupportedMetric.
    (tmp_path / "p").mkdir()
    (tmp_path / "g").mkdir()
    wrong = _zip(tmp_path / "p" / "out.zip", {"other/a.pdf": pdfs["report"]})
    gold = _zip(tmp_path / "g" / "gold.zip", {"slides/a.pdf": pdfs["report"]})
    with pytest.raises(FileNotFoundError):
        CHROME.compare_archive(wrong, gold, file_path="slides", file_type="pdf")
    assert METRICS["compare_archive"](wrong, gold, file_path="slides", file_type="pdf") == 0.0
    (tmp_path / "p" / "junk.zip").write_bytes(b"not an archive")
    assert METRICS["compare_archive"](str(tmp_path / "p" / "junk.zip"), gold, file_type="pdf") == 0.0
    with pytest.raises(UnsupportedMetric):
        METRICS["compare_archive"](gold, gold, file_type="spreadsheet")
    # compare_htmls: a missing result raises; guirl 0.
    html = _html(tmp_path / "gold.html")
    with pytest.raises(TypeError):
        CHROME.compare_htmls(None, html)
    assert METRICS["compare_htmls"](None, html) == 0.0
    # compare_audios: two undecodable files are "perfectly similar" (1.0); guirl scores an undecodable
    # result 0.
    assert VLC.compare_audios(sounds["broken.mp3"], sounds["broken.mp3"]) == 1.0
    assert METRICS["compare_audios"](sounds["broken.mp3"], sounds["empty.wav"]) == 0.0
    # compare_videos: a result that does not exist reads as an empty video, so two such score 1.0; guirl 0.
    assert VLC.compare_videos(absent, absent) == 1.0
    assert METRICS["compare_videos"](absent, videos["gold"]) == 0.0
    assert METRICS["compare_videos"](None, videos["gold"]) == 0.0
    # check_mp3_meta: an MP3 without an ID3 header raises; guirl 0.
    bare = _mp3(tmp_path / "bare.mp3")
    with pytest.raises(ID3NoHeaderError):
        OTHERS.check_mp3_meta(bare, _eq("Missing You", "Cheng Xiang"))
    assert METRICS["check_mp3_meta"](bare, _eq("Missing You", "Cheng Xiang")) == 0.0
    # compare_epub: documents in a sub-folder (OEBPS/, as most e-book tools write them) make the reference
    # fail writing its scratch copy; guirl compares them (identical books: 1.0).
    (tmp_path / "r").mkdir()
    nested = _epub(tmp_path / "r" / "nested.epub", _BOOK, folder="OEBPS/")
    nested_gold = _epub(tmp_path / "g" / "nested_gold.epub", _BOOK, folder="OEBPS/")
    with pytest.raises(FileNotFoundError):
        OTHERS.compare_epub(nested, nested_gold)
    assert METRICS["compare_epub"](nested, nested_gold) == 1.0
