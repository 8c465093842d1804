"""Parity of guirl's Impress metrics and slide-media getters with OSWorld's (desktop-env 1.0.2
`metrics/slides.py`, `getters/impress.py`).

Decks are built with python-pptx and written by LibreOffice Impress (one `soffice --convert-to pptx` call
for the module), as the tasks' decks are saved by Impress; LibreOffice's settings file is the one that
soffice call wrote into its fresh profile, with the tasks' settings items added in its own format. The
getters run against guirl's VM server on loopback: guirl's through `VMClient`, the reference's through
desktop-env's `PythonController`. Each case states the score both must give; deliberate differences are in
`test_differences_on_purpose`.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from zipfile import BadZipFile

import numpy as np
import pytest
import soundfile
from lxml import etree
from PIL import Image, ImageDraw
from pptx import Presentation
from pptx.dml.color import RGBColor
from pptx.exc import PackageNotFoundError
from pptx.oxml.ns import qn
from pptx.util import Inches

from guirl.vmpool.client import VMClient
from guirl.vmpool.tasks.getters import GETTERS
from guirl.vmpool.tasks.metrics import METRICS, UnsupportedMetric
from guirl.vmpool.tasks.setup import TaskContext
from tests.helpers import run
from tests.integration.vm_file_server import vm_file_server
from tests.osworld_reference import reference

REF = reference("metrics.slides")
REF_GETTERS = reference("getters.impress")
# desktop-env's VM client, imported under the stub packages reference() set up
REF_CONTROLLER = importlib.import_module("desktop_env.controllers.python").PythonController

_BG = (
    '<p:bg xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" '
    'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" '
    'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><p:bgPr><a:blipFill>'
    '<a:blip r:embed="{rid}"/><a:stretch><a:fillRect/></a:stretch></a:blipFill><a:effectLst/></p:bgPr></p:bg>'
)


def _deck(path: Path, media: Path, **kind: Any) -> None:
    """A two-slide deck; `kind` adds what one metric or getter looks at."""
    prs = Presentation()
    if kind.get("portrait"):
        prs.slide_width, prs.slide_height = prs.slide_height, prs.slide_width
    backgrounds = kind.get("backgrounds", [None, None])
    for i in range(2):
        slide = prs.slides.add_slide(prs.slide_layouts[5])
        slide.shapes.title.text = f"Slide {i + 1}"
        if backgrounds[i]:
            slide.background.fill.solid()
            slide.background.fill.fore_color.rgb = RGBColor.from_string(backgrounds[i])
    first = prs.slides[0]
    picture = kind.get("picture")
    if picture == "small":
        first.shapes.add_picture(str(media / "photo.png"), Inches(1), Inches(1), Inches(3), Inches(2))
    elif picture == "stretched":
        first.shapes.add_picture(str(media / "photo.png"), 0, 0, prs.slide_width, prs.slide_height)
    elif picture == "offset":  # full size, but an inch to the right
        first.shapes.add_picture(str(media / "photo.png"), Inches(1), 0, prs.slide_width, prs.slide_height)
    if "transition" in kind:
        transition = etree.SubElement(first._element, qn("p:transition"), spd="slow")
        etree.SubElement(transition, qn(f"p:{kind['transition']}"))
    if "audio" in kind:
        first.shapes.add_movie(
            str(media / kind["audio"]), Inches(1), Inches(3), Inches(1), Inches(1), mime_type="audio/mpeg"
        )
    if kind.get("background_image"):
        second = prs.slides[1]
        _, rid = second.part.get_or_add_image_part(str(media / "photo.png"))
        second._element.find(qn("p:cSld")).insert(0, etree.fromstring(_BG.format(rid=rid)))
    if "number_color" in kind:
        _colour_slide_number(prs, kind["number_color"])
    prs.save(path)


def _colour_slide_number(prs: Any, colour: str) -> None:
    """Give the master's slide-number field (its last shape) an explicit RGB colour, on the field and the
    paragraph end, as Impress writes a coloured field."""
    (number,) = [p for p in prs.slide_master.placeholders if p.placeholder_format.type == 13]  # SLIDE_NUMBER
    paragraph = number.text_frame.paragraphs[0]._p
    for props in (paragraph.find(qn("a:fld")).get_or_add_rPr(), paragraph.get_or_add_endParaRPr()):
        fill = etree.SubElement(props, qn("a:solidFill"))
        etree.SubElement(fill, qn("a:srgbClr"), val=colour)


LO_DECKS: dict[str, dict[str, Any]] = {
    "portrait": {"portrait": True},
    "landscape": {},
    "pic_small": {"picture": "small"},
    "pic_stretched": {"picture": "stretched"},
    "pic_offset": {"picture": "offset"},
    "fill_blue": {"backgrounds": ["0000FF", "0000FF"]},
    "fill_half": {"backgrounds": ["0000FF", None]},
    "fill_white": {"backgrounds": ["FFFFFF", "FFFFFF"]},
    "fill_navy": {"backgrounds": ["000080", "000080"]},
    "dissolve": {"transition": "dissolve"},
    "fade": {"transition": "fade"},
    "audio": {"audio": "tune.mp3"},
    "background_image": {"background_image": True},
    "number_red": {"number_color": "FF0000"},
}
# decks python-pptx writes with the slide number last in the master (Impress writes the body last)
PPTX_DECKS: dict[str, str] = {
    "num_FF0000": "FF0000",
    "num_000000": "000000",
    "num_00FF00": "00FF00",
    "num_0000FF": "0000FF",
    "num_C00000": "C00000",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("impress")
    media, src, out = root / "media", root / "src", root / "lo"
    for d in (media, src):
        d.mkdir()
    image = Image.new("RGB", (320, 200), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((20, 20, 200, 150), fill="navy")
    draw.ellipse((150, 60, 300, 190), fill="orange")
    image.save(media / "photo.png")
    t = np.arange(22050 * 2) / 22050
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    soundfile.write(media / "tune.mp3", tone, 22050, format="MP3")
    for name, kind in LO_DECKS.items():
        _deck(src / f"{name}.pptx", media, **kind)
    profile = root / "profile"
    done = subprocess.run(
        ["soffice", "--headless", f"-env:UserInstallation={profile.as_uri()}", "--convert-to", "pptx"]
        + ["--outdir", str(out), *sorted(str(p) for p in src.glob("*.pptx"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    paths = {name: out / f"{name}.pptx" for name in LO_DECKS}
    assert all(p.exists() for p in paths.values()), sorted(out.iterdir())
    paths["pic_original"] = src / "pic_small.pptx"  # the task's original deck, before Impress saved it
    for name, colour in PPTX_DECKS.items():
        _deck(root / f"{name}.pptx", media, number_color=colour)
        paths[name] = root / f"{name}.pptx"
    paths["xcu"] = profile / "user" / "registrymodifications.xcu"
    paths["media"] = media
    return paths


def _settings(files: dict[str, Path], tmp_path: Path, *items: str) -> str:
    """LibreOffice's settings file from the test's profile, with `items` added as Impress adds them."""
    text = files["xcu"].read_text(encoding="utf-8")
    assert text.rstrip().endswith("</oor:items>")
    path = tmp_path / "registrymodifications.xcu"
    path.write_text(text.rstrip()[: -len("</oor:items>")] + "".join(items) + "\n</oor:items>\n", "utf-8")
    return str(path)


def _item(path: str, name: str, value: str) -> str:
    prop = f'<prop oor:name="{name}" oor:op="fuse"><value>{value}</value></prop>'
    return f'<item oor:path="{path}">{prop}</item>\n'


def _both(name: str, *args: Any) -> float:
    """The score both implementations give (asserted equal)."""
    ours = METRICS[name](*args)
    theirs = float(getattr(REF, name)(*args))
    assert ours == pytest.approx(theirs, abs=1e-12), (name, ours, theirs)
    return ours


@pytest.mark.parametrize(("deck", "score"), [("portrait", 1.0), ("landscape", 0.0)])
def test_check_slide_orientation_portrait(files: dict[str, Path], deck: str, score: float) -> None:
    assert _both("check_slide_orientation_Portrait", str(files[deck])) == score


@pytest.mark.parametrize(
    ("deck", "original", "score"),
    [
        ("pic_stretched", "pic_original", 1.0),
        ("pic_offset", "pic_original", 0.0),  # full size but not centred
        ("pic_small", "pic_original", 0.0),  # not stretched
        ("landscape", "pic_original", 0.0),  # the picture was removed
        ("pic_stretched", "landscape", 0.0),  # an original without a picture
    ],
)
def test_check_image_stretch_and_center(
    files: dict[str, Path], deck: str, original: str, score: float
) -> None:
    assert _both("check_image_stretch_and_center", str(files[deck]), str(files[original])) == score


_DIAGONAL = np.sqrt(3 * 255**2)


@pytest.mark.parametrize(
    ("deck", "rules", "score"),
    [
        ("fill_blue", {"rgb": [0, 0, 255], "original_rgb": [255, 255, 255]}, 1.0),
        # the second slide inherits the master's white: as far as can be
        ("fill_half", {"rgb": [0, 0, 255], "original_rgb": [255, 255, 255]}, 0.5),
        ("fill_white", {"rgb": [0, 0, 255], "original_rgb": [255, 255, 255]}, 0.0),
        ("fill_white", {"rgb": [0, 0, 255]}, 1 - np.sqrt(2 * 255**2) / _DIAGONAL),
        ("fill_navy", {"rgb": [0, 0, 255], "original_rgb": [255, 255, 255]}, 1 - 127 / _DIAGONAL),
        ("landscape", {"rgb": [0, 0, 255], "original_rgb": [255, 255, 255]}, 0.0),
    ],
)
def test_evaluate_presentation_fill_to_rgb_distance(
    files: dict[str, Path], deck: str, rules: dict[str, Any], score: float
) -> None:
    assert _both("evaluate_presentation_fill_to_rgb_distance", str(files[deck]), rules) == pytest.approx(
        score
    )


@pytest.mark.parametrize(
    ("deck", "rules", "score"),
    [
        ("dissolve", {"slide_idx": 0, "transition_type": "dissolve"}, 1.0),
        ("fade", {"slide_idx": 0, "transition_type": "dissolve"}, 0.0),
        ("fade", {"slide_idx": 0, "transition_type": "fade"}, 1.0),
        ("dissolve", {"slide_idx": 1, "transition_type": "dissolve"}, 0.0),  # on the first slide only
        ("dissolve", {"slide_idx": 5, "transition_type": "dissolve"}, 0.0),  # no such slide
        ("landscape", {"slide_idx": 0, "transition_type": "dissolve"}, 0.0),
    ],
)
def test_check_transition(files: dict[str, Path], deck: str, rules: dict[str, Any], score: float) -> None:
    assert _both("check_transition", str(files[deck]), rules) == score


@pytest.mark.parametrize(
    ("deck", "colour", "score"),
    [
        ("num_FF0000", "red", 1.0),
        ("num_FF0000", "black", 0.0),
        ("num_000000", "black", 1.0),
        ("num_000000", "red", 0.0),
        ("num_00FF00", "green", 1.0),
        ("num_00FF00", "blue", 0.0),
        # Impress writes the master's body outline after the slide number: the colour read is the body's
        ("number_red", "red", 0.0),
        ("number_red", "black", 1.0),
    ],
)
def test_check_page_number_colors(files: dict[str, Path], deck: str, colour: str, score: float) -> None:
    assert _both("check_page_number_colors", str(files[deck]), {"color": colour}) == score


_START = "/org.openoffice.Office.Impress/Misc/Start"
_SAVE = "/org.openoffice.Office.Common/Save/Document"


@pytest.mark.parametrize(
    ("items", "score"),
    [
        ((_item(_START, "EnablePresenterScreen", "false"),), 1.0),
        ((_item(_START, "EnablePresenterScreen", "true"),), 0.0),
        ((), 0.0),
    ],
)
def test_check_presenter_console_disable(
    files: dict[str, Path], tmp_path: Path, items: tuple[str, ...], score: float
) -> None:
    assert _both("check_presenter_console_disable", _settings(files, tmp_path, *items)) == score


@pytest.mark.parametrize(
    ("items", "score"),
    [
        ((_item(_SAVE, "AutoSaveTimeIntervall", "3"),), 1.0),
        ((_item(_SAVE, "AutoSaveTimeIntervall", "10"),), 0.0),
        (
            (_item(_SAVE, "AutoSaveTimeIntervall", "10"), _item(_SAVE, "AutoSaveTimeIntervall", "3")),
            1.0,
        ),  # last
        ((_item(_SAVE, "AutoSave", "true"),), 0.0),
        ((), 0.0),
    ],
)
def test_check_auto_saving_time(
    files: dict[str, Path], tmp_path: Path, items: tuple[str, ...], score: float
) -> None:
    assert _both("check_auto_saving_time", _settings(files, tmp_path, *items), {"minutes": 3}) == score


def _tree(*inner: str) -> str:
    """An accessibility tree in the shape OSWorld's VM server sends (AT-SPI roles as tags)."""
    ns = 'xmlns:st="uri:deskat:state.at-spi.gnome.org" xmlns:cp="uri:deskat:component.at-spi.gnome.org"'
    panel = f'<panel name="">{"".join(inner)}</panel>'
    frame = f'<frame name="deck.pptx - LibreOffice Impress" st:showing="true">{panel}</frame>'
    return (
        f'<desktop-frame {ns} name="main"><application name="soffice">{frame}</application></desktop-frame>'
    )


@pytest.mark.parametrize(
    ("tree", "score"),
    [
        (
            _tree(
                '<document-frame name="Slides View" st:showing="true"/>',
                '<document-frame name="Normal View"/>',
            ),
            1.0,
        ),
        (_tree('<document-frame name="Normal View" st:showing="true"/>'), 0.0),
        (_tree('<panel name="Slides View"/>'), 0.0),  # only a document frame counts
    ],
)
def test_check_left_panel(tree: str, score: float) -> None:
    assert _both("check_left_panel", tree) == score


# -- getters -------------------------------------------------------------------------------------------


def _home(files: dict[str, Path], tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "Desktop").mkdir(parents=True)
    for name in ("audio", "background_image", "landscape"):
        shutil.copy(files[name], home / "Desktop" / f"{name}.pptx")
    (home / "Music").mkdir()
    shutil.copy(files["media"] / "tune.mp3", home / "Music" / "tune.mp3")
    shutil.copy(files["media"] / "tune.mp3", home / "Music" / "my tune.mp3")
    # the audio deck with its sound linked instead of embedded, as Impress links a file it did not embed
    for link, name in (("tune.mp3", "linked"), ("my%20tune.mp3", "linked_space")):
        with (
            zipfile.ZipFile(files["audio"]) as zin,
            zipfile.ZipFile(home / "Desktop" / f"{name}.pptx", "w") as zout,
        ):
            for info in zin.infolist():
                data = zin.read(info)
                if info.filename == "ppt/slides/_rels/slide1.xml.rels":
                    data = data.replace(
                        b'Target="../media/media1.mp3"',
                        f'Target="file://{home}/Music/{link}" TargetMode="External"'.encode(),
                        1,
                    )
                zout.writestr(info, data)
    return home


def _getter_pair(name: str, config: dict[str, Any], home: Path, tmp_path: Path) -> tuple[Any, Any]:
    """(guirl's result, the reference's or the exception it raised) for one getter config, same VM."""
    ours_dir, ref_dir = tmp_path / "ours", tmp_path / "ref"
    ours_dir.mkdir(exist_ok=True)
    ref_dir.mkdir(exist_ok=True)
    with vm_file_server(home) as (address, port):
        ctx = TaskContext(task_id="t", cache_dir=ours_dir, download_cache=tmp_path / "downloads")

        async def ours() -> Any:
            async with VMClient(address, timeout_s=10, retries=1) as client:
                return await GETTERS[name](config, client, ctx)

        mine = run(ours(), timeout=30)
        controller = REF_CONTROLLER("127.0.0.1", port)
        controller.retry_times, controller.retry_interval = 1, 0  # a missing file answers 404 at once
        env = SimpleNamespace(controller=controller, cache_dir=str(ref_dir))
        try:
            theirs = getattr(REF_GETTERS, f"get_{name}")(env, config)
        except Exception as exc:  # noqa: BLE001  (returned for the test to assert on)
            theirs = exc
    return mine, theirs


def _same_file(ours: Any, theirs: Any, content: bytes) -> None:
    assert ours is not None and theirs is not None
    assert Path(ours).read_bytes() == Path(theirs).read_bytes() == content
    assert Path(ours).name == Path(theirs).name


@pytest.mark.parametrize(
    ("deck", "slide", "found"),
    [
        ("audio", 0, True),
        ("linked", 0, True),
        ("audio", 1, False),
        ("landscape", 0, False),
        ("landscape", 7, False),
    ],
)
def test_audio_in_slide(files: dict[str, Path], tmp_path: Path, deck: str, slide: int, found: bool) -> None:
    home = _home(files, tmp_path)
    config = {
        "ppt_file_path": str(home / "Desktop" / f"{deck}.pptx"),
        "slide_index": slide,
        "dest": "tune.mp3",
    }
    ours, theirs = _getter_pair("audio_in_slide", config, home, tmp_path)
    if not found:
        assert ours is None and theirs is None
        return
    _same_file(ours, theirs, (files["media"] / "tune.mp3").read_bytes())
    # the extracted sound is the one inserted: the suite's compare_audios task end to end
    assert METRICS["compare_audios"](ours, str(files["media"] / "tune.mp3")) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("deck", "slide", "found"),
    [("background_image", 1, True), ("background_image", 0, False), ("landscape", 1, False)],
)
def test_background_image_in_slide(
    files: dict[str, Path], tmp_path: Path, deck: str, slide: int, found: bool
) -> None:
    home = _home(files, tmp_path)
    config = {"ppt_file_path": str(home / "Desktop" / f"{deck}.pptx"), "slide_index": slide, "dest": "bg.png"}
    ours, theirs = _getter_pair("background_image_in_slide", config, home, tmp_path)
    if not found:
        assert ours is None and theirs is None
        return
    assert Path(ours).read_bytes() == Path(theirs).read_bytes()
    with Image.open(ours) as got, Image.open(files["media"] / "photo.png") as put:
        assert got.size == put.size and np.array_equal(
            np.asarray(got.convert("RGB")), np.asarray(put.convert("RGB"))
        )


# -- deliberate differences ----------------------------------------------------------------------------


def test_differences_on_purpose(files: dict[str, Path], tmp_path: Path) -> None:
    """Each: what the reference does, then what guirl does instead."""
    corrupt = tmp_path / "corrupt.pptx"
    corrupt.write_bytes(b"PK\x03\x04 not really a zip")
    absent = str(tmp_path / "absent.pptx")
    # A missing or corrupt deck: the reference raises (or opens python-pptx's template for None); guirl 0.
    with pytest.raises(BadZipFile):
        REF.check_transition(str(corrupt), {"slide_idx": 0, "transition_type": "dissolve"})
    with pytest.raises(FileNotFoundError):
        REF.check_page_number_colors(absent, {"color": "red"})
    with pytest.raises(PackageNotFoundError):
        REF.check_slide_orientation_Portrait(str(corrupt))
    with pytest.raises(IndexError):
        REF.check_image_stretch_and_center(None, str(files["pic_original"]))
    with pytest.raises(PackageNotFoundError):
        REF.evaluate_presentation_fill_to_rgb_distance(absent, {"rgb": [0, 0, 255]})
    for name, args in [
        ("check_transition", ({"slide_idx": 0, "transition_type": "dissolve"},)),
        ("check_page_number_colors", ({"color": "red"},)),
        ("check_slide_orientation_Portrait", ()),
        ("evaluate_presentation_fill_to_rgb_distance", ({"rgb": [0, 0, 255]},)),
    ]:
        for spoiled in (None, absent, str(corrupt)):
            assert METRICS[name](spoiled, *args) == 0.0, (name, spoiled)
    for spoiled in (None, absent, str(corrupt)):
        assert METRICS["check_image_stretch_and_center"](spoiled, str(files["pic_original"])) == 0.0
    # A settings file that is missing or not XML: the reference's autosave check returns None (no score);
    # guirl 0. A missing accessibility tree: the reference raises; guirl 0.
    assert REF.check_auto_saving_time(absent, {"minutes": 3}) is None
    assert METRICS["check_auto_saving_time"](absent, {"minutes": 3}) == 0.0
    assert METRICS["check_auto_saving_time"](str(corrupt), {"minutes": 3}) == 0.0
    assert METRICS["check_presenter_console_disable"](None) == 0.0
    with pytest.raises(TypeError):
        REF.check_left_panel(None)
    assert METRICS["check_left_panel"](None) == 0.0
    assert METRICS["check_left_panel"]("<not-closed") == 0.0
    # Slide-number colours: the reference reads "#RRGGBB" positions of a bare RRGGBB value (red from the
    # 2nd-3rd hex digits, green from the 4th-5th, blue from the 6th alone), so pure blue is not blue and a
    # dark red is not red to it; guirl reads the channels.
    assert REF.check_page_number_colors(str(files["num_0000FF"]), {"color": "blue"}) == 0
    assert METRICS["check_page_number_colors"](str(files["num_0000FF"]), {"color": "blue"}) == 1.0
    assert REF.check_page_number_colors(str(files["num_C00000"]), {"color": "red"}) == 0
    assert METRICS["check_page_number_colors"](str(files["num_C00000"]), {"color": "red"}) == 1.0
    # An unknown colour: the reference passes any deck; guirl says it cannot score it.
    assert REF.check_page_number_colors(str(files["num_000000"]), {"color": "purple"}) == 1
    with pytest.raises(UnsupportedMetric):
        METRICS["check_page_number_colors"](str(files["num_000000"]), {"color": "purple"})


def test_getter_differences_on_purpose(files: dict[str, Path], tmp_path: Path) -> None:
    """A deck the VM lacks: the reference raises opening None; guirl gives None. A linked sound whose
    file:// URL is percent-encoded (a space): the reference asks the VM for the encoded path and gets
    nothing; guirl decodes it and fetches the file."""
    home = _home(files, tmp_path)
    missing = {"ppt_file_path": str(home / "Desktop" / "nope.pptx"), "slide_index": 0, "dest": "a.mp3"}
    ours, theirs = _getter_pair("audio_in_slide", missing, home, tmp_path)
    assert ours is None and isinstance(theirs, (TypeError, AttributeError, ValueError))
    linked = {"ppt_file_path": str(home / "Desktop" / "linked_space.pptx"), "slide_index": 0, "dest": "a.mp3"}
    ours, theirs = _getter_pair("audio_in_slide", linked, home, tmp_path)
    assert theirs is None
    assert Path(ours).read_bytes() == (files["media"] / "tune.mp3").read_bytes()
