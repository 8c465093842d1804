"""PDFs, archives, audio, video, e-books, CSV and HTML files (OSWorld's metrics/pdf.py, others.py, vlc.py's
media comparisons, chrome.py's file comparisons, table.py's compare_csv).

This module holds the text-like formats; PDFs and archives are in media_pdf.py, audio and video in
media_av.py, and their metrics are merged into `METRICS` here.

Differences from OSWorld, all on results the reference raises on: a missing, unreadable or undecodable
result scores 0.0 (compare_htmls, check_mp3_meta, compare_epub); compare_epub reads documents in the
e-book's sub-folders (the reference fails writing them out).
"""

from __future__ import annotations

import difflib
import os
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

from guirl.vmpool.tasks.metrics import media_av, media_pdf
from guirl.vmpool.tasks.metrics.value_rules import match_value_to_rule

REQUIRES = ("bs4", "lxml", "mutagen")
"""Modules beyond guirl's own dependencies that this module's functions import (the `osworld` extra)."""


def _is_file(path: Any) -> bool:
    return isinstance(path, (str, os.PathLike)) and bool(path) and os.path.isfile(path)


# -- HTML ----------------------------------------------------------------------------------------------


def _soup(path: Any) -> Any:
    from bs4 import BeautifulSoup

    if not _is_file(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return BeautifulSoup(f.read(), "lxml")
    except (OSError, UnicodeDecodeError):
        return None


def _same_node(a: Any, b: Any, ignore_sdnum: bool) -> bool:
    from bs4 import Tag

    if not (isinstance(a, Tag) and isinstance(b, Tag)):
        return bool(a == b)  # strings (text, comments) compare as text; a string never equals a tag
    if a.name != b.name or a.text.strip() != b.text.strip():
        return False
    if a.attrs == b.attrs:
        return True
    if ignore_sdnum:  # LibreOffice's number-format attribute
        return {k: v for k, v in a.attrs.items() if k != "sdnum"} == {
            k: v for k, v in b.attrs.items() if k != "sdnum"
        }
    return False


def compare_htmls(result: Any, expected: Any, **options: Any) -> float:
    """1.0 when the two HTML documents' nodes, walked in document order (up to the shorter walk), agree:
    same tag names, same stripped text, same attributes (`ignore_sdnum`: except `sdnum`); strings equal."""
    pred = _soup(result)
    if pred is None:
        return 0.0
    gold = _soup(expected)
    if gold is None:
        raise ValueError(f"the gold HTML {expected!r} cannot be read")
    ignore_sdnum = bool(options.get("ignore_sdnum"))
    for a, b in zip(pred.descendants, gold.descendants):
        if not _same_node(a, b, ignore_sdnum):
            return 0.0
    return 1.0


# -- MP3 tags ------------------------------------------------------------------------------------------


def check_mp3_meta(result: Any, meta: Mapping[str, Mapping[str, Any]]) -> float:
    """1.0 when each ID3 tag named in `meta` (EasyID3 names: title, artist, album, ...; several values
    joined by ",", an absent tag is "") matches its `{"method", "ref"}` rule."""
    from mutagen import MutagenError
    from mutagen.easyid3 import EasyID3

    if not _is_file(result):
        return 0.0
    try:
        tags = EasyID3(result)
    except (MutagenError, OSError):  # no ID3 header, or not an MP3 at all
        return 0.0

    def value(key: str) -> str:
        v = tags.get(key, "")
        return ",".join(v) if isinstance(v, list) else v

    return float(all(match_value_to_rule(value(k), rule) for k, rule in meta.items()))


# -- EPUB ----------------------------------------------------------------------------------------------


def _epub_parts(path: Any) -> list[list[str]] | None:
    """The lines compared of each part of an e-book, sorted by member name: the root toc.ncx without its
    navPoint lines, the root content.opf without its dc:identifier lines (both differ between two
    conversions of the same book), and every .html document re-serialised by lxml with line breaks
    removed first. None when the file is not a readable zip of UTF-8 text."""
    import lxml.etree
    import lxml.html

    if not _is_file(path):
        return None
    parts: list[tuple[str, list[str]]] = []
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            for name, drop in (("toc.ncx", "navPoint"), ("content.opf", "dc:identifier")):
                if name in names:
                    lines = zf.read(name).decode().splitlines()
                    parts.append((name, [line for line in lines if drop not in line]))
            for name in names:
                if name.endswith(".html"):
                    text = zf.read(name).decode().replace("\n", "").replace("\r", "")
                    tree = lxml.html.fromstring(text.encode())
                    parts.append(
                        (name, lxml.html.tostring(tree, pretty_print=True, encoding="unicode").splitlines())
                    )
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError, lxml.etree.ParserError):
        return None
    return [lines for _, lines in sorted(parts)]


def compare_epub(result: Any, expected: Any) -> float:
    """The mean, over the result's parts paired in name order with the gold's, of difflib's line
    similarity ratio (see `_epub_parts`); 0.0 for a result with no such part."""
    pred = _epub_parts(result)
    if not pred:
        return 0.0
    gold = _epub_parts(expected)
    if gold is None:
        raise ValueError(f"the gold e-book {expected!r} cannot be read")
    total = sum(difflib.SequenceMatcher(a=p, b=g).ratio() for p, g in zip(pred, gold))
    return total / len(pred)


# -- CSV -----------------------------------------------------------------------------------------------


def _csv_lines(path: Any) -> list[str] | None:
    if not _is_file(path):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # the reference's fallback chain ends at latin-1, which decodes anything
        text = data.decode("latin-1")
    return text.splitlines()


def compare_csv(result: Any, expected: Any, **options: Any) -> float:
    """1.0 when the result's lines equal those of the gold file (or of any gold file, for a list);
    `strict=False` strips each line, `ignore_case` lowercases. Files are read as UTF-8, else Latin-1."""
    pred = _csv_lines(result)
    if pred is None:
        return 0.0

    def canon(lines: list[str]) -> list[str]:
        if not options.get("strict", True):
            lines = [line.strip() for line in lines]
        if options.get("ignore_case", False):
            lines = [line.lower() for line in lines]
        return lines

    for gold_path in [expected] if isinstance(expected, (str, os.PathLike)) else list(expected):
        gold = _csv_lines(gold_path)
        if gold is not None and canon(pred) == canon(gold):  # a missing gold file is skipped, as there
            return 1.0
    return 0.0


METRICS: dict[str, Callable[..., float]] = {
    "compare_htmls": compare_htmls,
    "check_mp3_meta": check_mp3_meta,
    "compare_epub": compare_epub,
    "compare_csv": compare_csv,
    "compare_audios": media_av.compare_audios,
    "compare_videos": media_av.compare_videos,
    **media_pdf.METRICS,
}
"""This family's metrics, by OSWorld's names."""
