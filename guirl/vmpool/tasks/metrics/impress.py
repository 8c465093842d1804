"""LibreOffice Impress decks and settings beyond compare_pptx_files (OSWorld's metrics/slides.py).

Each reads what the reference reads: the deck through python-pptx or its slide XML, LibreOffice's
registrymodifications.xcu, or the accessibility tree's XML. Differences from OSWorld: a missing, corrupt or
malformed result scores 0.0 where the reference raises or returns None; check_page_number_colors raises
UnsupportedMetric for a colour it has no test for (the reference passes any deck), and reads a colour's
channels from its RRGGBB value (the reference reads "#RRGGBB" positions, one character off: red from GB...).
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Callable, Mapping
from typing import Any
from xml.etree import ElementTree as ET

from pptx.util import Inches

from guirl.vmpool.tasks.metrics import UnsupportedMetric
from guirl.vmpool.tasks.metrics.slides import _open

_NS = {
    "a": "http://schemas.openxmlformats.org/drawingml/2006/main",
    "p": "http://schemas.openxmlformats.org/presentationml/2006/main",
    "oor": "http://openoffice.org/2001/registry",
}
_OOR = "{http://openoffice.org/2001/registry}"
_PICTURE = 13
_FILL_SOLID = 1
_FILL_BACKGROUND = 5
_SLACK = Inches(0.5)


def _xml_root(path: Any) -> ET.Element | None:
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return None
    try:
        return ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return None


def _zip_xml(path: Any, member: str) -> ET.Element | None:
    """The parsed XML of one member of a deck; None for a missing deck or member, or a corrupt one."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as zf:
            if member not in zf.namelist():
                return None
            with zf.open(member) as f:
                return ET.parse(f).getroot()
    except (zipfile.BadZipFile, ET.ParseError, OSError):
        return None


def check_presenter_console_disable(result: Any) -> float:
    """1.0 when LibreOffice's settings turn Impress's presenter console off (EnablePresenterScreen false)."""
    root = _xml_root(result)
    if root is None:
        return 0.0
    item = ".//item[@oor:path='/org.openoffice.Office.Impress/Misc/Start']"
    prop = root.find(item + "/prop[@oor:name='EnablePresenterScreen']", _NS)
    if prop is None:
        return 0.0
    value = prop.find("value")
    return float(value is not None and (value.text or "").lower() == "false")


def check_auto_saving_time(result: Any, rules: Mapping[str, Any]) -> float:
    """1.0 when LibreOffice's autosave interval (Save/Document AutoSaveTimeIntervall; the last such entry)
    is `rules["minutes"]`."""
    root = _xml_root(result)
    if root is None:
        return 0.0
    interval = None
    for item in root.findall(".//item"):
        if item.get(_OOR + "path") != "/org.openoffice.Office.Common/Save/Document":
            continue
        for prop in item.findall(".//prop"):
            if prop.get(_OOR + "name") == "AutoSaveTimeIntervall":
                value = prop.find(".//value")
                interval = None if value is None else value.text
                break
    try:
        return float(interval is not None and int(interval) == rules["minutes"])
    except ValueError:  # not a number: LibreOffice did not write it
        return 0.0


def check_left_panel(result: Any) -> float:
    """1.0 when the accessibility tree (XML) has Impress's "Slides View" document frame: the slide pane is
    open."""
    if not isinstance(result, (str, bytes)):
        return 0.0
    try:
        root = ET.fromstring(result)
    except ET.ParseError:
        return 0.0
    return float(any(f.get("name") == "Slides View" for f in root.iter("document-frame")))


def check_slide_orientation_Portrait(result: Any) -> float:  # noqa: N802  (OSWorld's name)
    """1.0 when the deck's slides are taller than wide."""
    prs = _open(result)
    return 0.0 if prs is None else float(prs.slide_width < prs.slide_height)


def check_image_stretch_and_center(result: Any, expected: Any) -> float:
    """1.0 when the first picture of the original deck's first slide is, in the result's first slide (the
    last picture with the same bytes), stretched to the slide's size and centred, within half an inch."""
    modified, original = _open(result), _open(expected)
    if original is None:
        raise ValueError(f"the original deck {expected!r} cannot be read")
    if modified is None or not len(modified.slides) or not len(original.slides):
        return 0.0
    originals = [s for s in original.slides[0].shapes if s.shape_type == _PICTURE]
    if not originals:
        return 0.0
    blob = originals[0].image.blob
    matches = [s for s in modified.slides[0].shapes if s.shape_type == _PICTURE and s.image.blob == blob]
    if not matches:
        return 0.0
    image = matches[-1]
    width, height = original.slide_width, original.slide_height
    return float(
        abs(image.width - width) <= _SLACK
        and abs(image.height - height) <= _SLACK
        and abs(image.left - (width - image.width) / 2) <= _SLACK
        and abs(image.top - (height - image.height) / 2) <= _SLACK
    )


def _fill_distance(slide: Any, rgb: list[int], original: list[int] | None) -> float:
    """How far the slide's solid background (its own, or the master's when it inherits) is from `rgb`, as
    a fraction of the RGB cube's diagonal; 1 when it is not a solid RGB colour or is still `original`."""
    fill = slide.background.fill
    if fill.type == _FILL_BACKGROUND:
        fill = slide.slide_layout.slide_master.background.fill
    elif fill.type != _FILL_SOLID:
        return 1.0
    if fill.type != _FILL_SOLID:
        return 1.0
    try:
        colour = fill.fore_color.rgb
    except Exception:  # noqa: BLE001  (a theme or unset colour has no RGB value)
        return 1.0
    if colour is None:
        return 1.0
    if original is not None and tuple(colour) == tuple(original):
        return 1.0
    (r1, g1, b1), (r2, g2, b2) = colour, rgb
    return math.sqrt((r1 - r2) ** 2 + (g1 - g2) ** 2 + (b1 - b2) ** 2) / math.sqrt(255**2 + 255**2 + 255**2)


def evaluate_presentation_fill_to_rgb_distance(result: Any, rules: Mapping[str, Any]) -> float:
    """1 minus the mean over slides of the background's distance from `rules["rgb"]` (see `_fill_distance`;
    a slide still at `original_rgb` counts as the farthest)."""
    prs = _open(result)
    if prs is None or not len(prs.slides):
        return 0.0
    original = rules.get("original_rgb")
    return 1 - sum(_fill_distance(s, rules["rgb"], original) for s in prs.slides) / len(prs.slides)


def check_transition(result: Any, rules: Mapping[str, Any]) -> float:
    """1.0 when slide `slide_idx` (0-based, by its part name slideN.xml) has a transition whose effect is
    `transition_type` (e.g. "dissolve")."""
    root = _zip_xml(result, f"ppt/slides/slide{int(rules['slide_idx']) + 1}.xml")
    if root is None:
        return 0.0
    transition = root.find(".//p:transition", _NS)
    return float(
        transition is not None and transition.find(f".//p:{rules['transition_type']}", _NS) is not None
    )


def _channels(hex_rgb: str) -> tuple[int, int, int]:
    return int(hex_rgb[0:2], 16), int(hex_rgb[2:4], 16), int(hex_rgb[4:6], 16)


# Each colour's test on (r, g, b), OSWorld's: the channel leads the others by more than 50, or all are < 50.
_COLOUR_TESTS: dict[str, Callable[[int, int, int], bool]] = {
    "red": lambda r, g, b: r > g + 50 and r > b + 50,
    "blue": lambda r, g, b: b > g + 50 and b > r + 50,
    "green": lambda r, g, b: g > r + 50 and g > b + 50,
    "black": lambda r, g, b: r < 50 and g < 50 and b < 50,
}


def check_page_number_colors(result: Any, rules: Mapping[str, Any]) -> float:
    """1.0 when the first slide master's next-to-last explicit RGB fill colour (where LibreOffice writes
    the slide-number field's colour) is `rules["color"]` (red, blue, green or black)."""
    test = _COLOUR_TESTS.get(rules["color"])
    if test is None:
        raise UnsupportedMetric(f"check_page_number_colors colour {rules['color']!r} is not implemented")
    root = _zip_xml(result, "ppt/slideMasters/slideMaster1.xml")
    if root is None:
        return 0.0
    colours = root.findall(".//a:solidFill//a:srgbClr", _NS)
    if len(colours) < 2:
        return 0.0
    value = colours[-2].get("val")
    if value is None:
        return 0.0
    try:
        channels = _channels(value)
    except ValueError:
        return 0.0
    return float(test(*channels))


METRICS: dict[str, Callable[..., float]] = {
    "check_image_stretch_and_center": check_image_stretch_and_center,
    "check_left_panel": check_left_panel,
    "check_presenter_console_disable": check_presenter_console_disable,
    "check_slide_orientation_Portrait": check_slide_orientation_Portrait,
    "evaluate_presentation_fill_to_rgb_distance": evaluate_presentation_fill_to_rgb_distance,
    "check_transition": check_transition,
    "check_page_number_colors": check_page_number_colors,
    "check_auto_saving_time": check_auto_saving_time,
}
"""This family's metrics, by OSWorld's names."""
