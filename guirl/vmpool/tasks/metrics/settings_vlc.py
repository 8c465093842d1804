"""VLC's state and settings (OSWorld's metrics/vlc.py, without its audio/video comparisons): the status XML
of VLC's HTTP interface, the vlcrc configuration file and the window size. Merged into settings.py's
`METRICS`.

vlcrc lists every option, a set one as `key=value` and one left at its default commented out with the
default value (`#qt-bgcone=1`). Like the reference, an option's value is read from its line either way
(the last such line wins), and is VLC's default when the file has no line for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlparse
from xml.etree import ElementTree

# The defaults the reference assumes when vlcrc has no line for an option (VLC 3's defaults).
_DEFAULTS = {
    "qt-bgcone": "1",
    "qt-max-volume": "125",
    "qt-minimal-view": "0",
    "qt-slider-colours": "153;210;153;20;210;20;255;199;15;245;39;29",
    "one-instance-when-started-from-file": "1",
    "global-key-play-pause": "",
}


def _vlcrc(path: str | None) -> list[str] | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().split("\n")
    except (OSError, UnicodeDecodeError):
        return None


def _option(lines: list[str], key: str) -> str:
    """The value of `key` in vlcrc, set or commented out; VLC's default when it has no line."""
    value = _DEFAULTS[key]
    for line in lines:
        name, sep, rest = line.strip().lstrip("#").partition("=")
        if sep and name.strip() == key:
            value = rest.rsplit("=", 1)[-1].strip()  # the reference keeps the text after the last "="
    return value


def _check_option(result: str | None, rule: Mapping[str, Any], key: str, rule_key: str) -> float:
    lines = _vlcrc(result)
    if lines is None:  # no vlcrc (the reference raises)
        return 0.0
    return float(_option(lines, key) == str(rule[rule_key]))


def check_qt_bgcone(result: str | None, rule: Mapping[str, Any]) -> float:
    """1.0 when vlcrc's `qt-bgcone` (the cone shown when idle) equals `rule["expected_qt_bgcone"]`."""
    return _check_option(result, rule, "qt-bgcone", "expected_qt_bgcone")


def check_qt_max_volume(result: str | None, rule: Mapping[str, Any]) -> float:
    """1.0 when vlcrc's `qt-max-volume` equals `rule["expected_qt_max_volume"]`."""
    return _check_option(result, rule, "qt-max-volume", "expected_qt_max_volume")


def check_qt_minimal_view(result: str | None, rule: Mapping[str, Any]) -> float:
    """1.0 when vlcrc's `qt-minimal-view` equals `rule["expected_qt_minimal_view"]`."""
    return _check_option(result, rule, "qt-minimal-view", "expected_qt_minimal_view")


def check_one_instance_when_started_from_file(result: str | None, rule: Mapping[str, Any]) -> float:
    """1.0 when vlcrc's `one-instance-when-started-from-file` equals the rule's expected value."""
    return _check_option(
        result, rule, "one-instance-when-started-from-file", "expected_one_instance_when_started_from_file"
    )


def check_global_key_play_pause(result: str | None, rule: Mapping[str, Any]) -> float:
    """1.0 when a global play/pause hotkey is set ("1") or not ("0") as `rule[...]` expects."""
    lines = _vlcrc(result)
    if lines is None:
        return 0.0
    is_set = "1" if _option(lines, "global-key-play-pause") else "0"
    return float(is_set == str(rule["expected_global_key_play_pause"]))


def check_qt_slider_colours(result: str | None, rule: Mapping[str, Any]) -> float:
    """vlcrc's volume-slider colours: equal to `rule["expected_qt_slider_colours"]` (`type: match`), or
    every colour with all of R, G, B below 100 (`type: blackish`)."""
    kind = rule["type"]
    if kind not in ("match", "blackish"):  # the reference returns None, which the evaluator cannot score
        raise ValueError(f"check_qt_slider_colours: unknown type {kind!r} (expected match/blackish)")
    lines = _vlcrc(result)
    if lines is None:
        return 0.0
    colours = _option(lines, "qt-slider-colours")
    if kind == "match":
        return float(colours == rule["expected_qt_slider_colours"])
    try:
        values = [int(v) for v in colours.split(";")]
    except ValueError:  # not a colour list (the reference logs it and scores 0)
        return 0.0
    rgb = zip(values[0::3], values[1::3], values[2::3], strict=False)
    return float(all(all(c < 100 for c in colour) for colour in rgb))


def is_vlc_recordings_folder(result: str | None, rule: Mapping[str, Any]) -> float:
    """1.0 when vlcrc sets `input-record-path` (uncommented) to `rule["recording_file_path"]`."""
    lines = _vlcrc(result)
    if lines is None:
        return 0.0
    for line in lines:
        if line.startswith("#") or not line.strip():
            continue
        if "input-record-path" in line:  # the first set line decides, as in the reference
            return float(line.split("=")[-1].strip() == rule["recording_file_path"])
    return 0.0


def is_vlc_fullscreen(result: Mapping[str, int] | None, expected: Mapping[str, int] | None) -> float:
    """1.0 when VLC's window is exactly the screen's size. The suite's task passes the screen size
    (`vm_screen_size`) as the result and the window's (`vm_window_size`) as expected; the comparison is
    symmetric. No VLC window (None) scores 0.0."""
    if result is None or expected is None:
        return 0.0
    return float(result["width"] == expected["width"] and result["height"] == expected["height"])


_FILE_INFO = ("filename", "title", "uri", "location", "name")
_URL_INFO = (
    ("meta", "url"),
    ("meta", "URI"),
    ("meta", "location"),
    ("meta", "title"),
    ("meta", "filename"),
    ("Stream 0", "Codec"),
    ("Stream 0", "Type"),
    ("Stream 0", "Language"),
)


def _info(tree: ElementTree.Element, places: list[tuple[str, str]]) -> str | None:
    """The first non-empty `information/category[@name=c]/info[@name=n]` text, in the given order."""
    for category, name in places:
        element = tree.find(f'information/category[@name="{category}"]/info[@name="{name}"]')
        if element is not None and element.text:
            return element.text
    return None


def _url_matches(info: str, expected: str) -> bool:
    if expected in info:
        return True
    try:
        parsed = urlparse(expected)
        if info == os.path.basename(parsed.path):  # an HLS stream shows its playlist's file name
            return True
        if "://" in info:  # the same host, and the expected path within the playing one
            got = urlparse(info)
            return parsed.netloc == got.netloc and parsed.path in got.path
    except ValueError:  # an unparsable URL (the reference logs it and scores 0)
        return False
    return False


def is_vlc_playing(result: str | None, rule: Mapping[str, Any]) -> float:
    """1.0 when VLC's status.xml says it is playing the expected media: a file whose name is
    `rule["file_name"]` (`type: file_name`), or the stream `rule["url"]` (`type: url`)."""
    if not result:
        return 0.0
    try:
        with open(result, "rb") as f:
            tree = ElementTree.fromstring(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ElementTree.ParseError):
        return 0.0
    state = tree.find("state")
    if state is None or state.text != "playing":
        return 0.0
    if rule["type"] == "file_name":
        info = _info(tree, [("meta", name) for name in _FILE_INFO])
        expected = rule["file_name"]
        return float(info is not None and (os.path.basename(info) == expected or info.endswith(expected)))
    if rule["type"] == "url":
        info = _info(tree, list(_URL_INFO))
        return float(info is not None and _url_matches(info, rule["url"]))
    return 0.0  # an unknown type: the reference logs an error and scores 0


METRICS: dict[str, Callable[..., float]] = {
    "is_vlc_playing": is_vlc_playing,
    "is_vlc_recordings_folder": is_vlc_recordings_folder,
    "is_vlc_fullscreen": is_vlc_fullscreen,
    "check_global_key_play_pause": check_global_key_play_pause,
    "check_qt_max_volume": check_qt_max_volume,
    "check_qt_slider_colours": check_qt_slider_colours,
    "check_qt_minimal_view": check_qt_minimal_view,
    "check_one_instance_when_started_from_file": check_one_instance_when_started_from_file,
    "check_qt_bgcone": check_qt_bgcone,
}
"""VLC's metrics, by OSWorld's names."""
