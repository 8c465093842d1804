"""`compare_pptx_files`: OSWorld's structural comparison of two PowerPoint decks (osworld-compat.md §5.2).

The score is 1.0 when every examined property agrees and 0.0 at the first disagreement. Per slide, in
OSWorld's order: background colour, notes text, shape count, then for each pair of top-level shapes the
geometry (relative tolerance `approximately_tolerance`), table layout and run formatting, text, paragraphs
(alignment, level) and runs (font name, size, bold, italic, RGB colour, underline, strike-through), the
whole slide's bullet list, and finally a pass over every text shape, groups included.

Differences from OSWorld: a missing or unreadable file scores 0.0 (OSWorld opens python-pptx's blank
template for None and raises on a corrupt file); inputs on which OSWorld raises (a theme-coloured solid
background, a table paired with a non-table, a shape without a position) score instead of raising.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from pptx import Presentation
from pptx.enum.shapes import MSO_SHAPE_TYPE
from pptx.enum.text import PP_ALIGN
from pptx.oxml.ns import qn

_FILL_SOLID = 1
_FILL_BACKGROUND = 5
_PICTURE = 13
_FREEFORM = 5

# Options OSWorld defaults to True; each may be set False by a task.
_TRUE_OPTIONS = (
    "examine_number_of_slides",
    "examine_shape",
    "examine_text",
    "examine_indent",
    "examine_font_name",
    "examine_font_size",
    "examine_font_bold",
    "examine_font_italic",
    "examine_color_rgb",
    "examine_font_underline",
    "examine_strike_through",
    "examine_alignment",
    "examine_bullets",
    "examine_background_color",
    "examine_note",
)
# Task-specific geometry rules OSWorld defaults to False (hard-coded slide numbers and EMU thresholds).
_FALSE_OPTIONS = (
    "examine_title_bottom_position",
    "examine_table_bottom_position",
    "examine_right_position",
    "examine_top_position",
    "examine_shape_for_shift_size",
    "examine_image_size",
    "examine_modify_height",
)


def _open(path: Any) -> Any:
    if not path or not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return None
    try:
        return Presentation(path)
    except Exception:
        return None


def _has_text(shape: Any) -> bool:
    return hasattr(shape, "text")


def _text_shapes(shapes: Any) -> Iterator[Any]:
    """Every shape with text and a text frame, descending into groups."""
    for shape in shapes:
        if hasattr(shape, "text") and hasattr(shape, "text_frame"):
            yield shape
        if hasattr(shape, "shapes"):
            yield from _text_shapes(shape.shapes)


def _rgb(color: Any) -> tuple[bool, Any]:
    """(whether the colour has an RGB value, that value); theme and unset colours have none."""
    try:
        return True, color.rgb
    except AttributeError:
        return False, None


def _background(slide: Any) -> Any:
    fill = slide.background.fill
    if fill.type == _FILL_BACKGROUND:
        fill = slide.slide_layout.slide_master.background.fill
        if fill.type != _FILL_SOLID:
            return None
    elif fill.type != _FILL_SOLID:
        return None
    return _rgb(fill.fore_color)[1]


def _notes(slide: Any) -> str:
    frame = slide.notes_slide.notes_text_frame
    return "" if frame is None else frame.text.strip()


def _off(flag: Any) -> bool:
    """None and False both mean 'not set' for bold and italic."""
    return flag is None or flag is False


def _underline_differs(u1: Any, u2: Any) -> bool:
    # OSWorld: two different set values differ, and unset differs from True; unset vs False (or vs a
    # named underline style) does not.
    if u1 == u2:
        return False
    if u1 is not None and u2 is not None:
        return True
    return (u1 is None and u2 is True) or (u1 is True and u2 is None)


def _alignment(paragraph: Any) -> Any:
    return PP_ALIGN.LEFT if paragraph.alignment is None else paragraph.alignment


def _bullets(slide: Any) -> list[tuple[Any, str, str]]:
    """(level, bullet char, text) of each non-blank paragraph in the slide's XML, in document order."""
    out = []
    for p in slide._element.iter(qn("a:p")):
        ppr = p.find(qn("a:pPr"))
        if ppr is None:
            level, char = "No Level", "No Bullet"
        else:
            level = ppr.get("lvl")
            level = "0" if level is None else level
            bu = ppr.find(qn("a:buChar"))
            char = bu.get("char") if bu is not None else "No Bullet"
        parts = [t.text for t in p.iter(qn("a:t"))]
        if any(part is None for part in parts):
            raise ValueError("empty a:t")  # OSWorld's join fails here and it skips the bullet check
        text = "".join(parts)
        if text.strip():
            out.append((level, char, text))
    return out


def _bullets_differ(slide1: Any, slide2: Any) -> bool:
    try:
        return _bullets(slide1) != _bullets(slide2)
    except Exception:
        return False


class _Compare:
    def __init__(self, options: dict[str, Any]) -> None:
        self.on = {name: bool(options.get(name, True)) for name in _TRUE_OPTIONS}
        self.rule = {name: bool(options.get(name, False)) for name in _FALSE_OPTIONS}
        self.tolerance = options.get("approximately_tolerance", 0.005)

    def close(self, v1: Any, v2: Any) -> bool:
        if v1 == v2:
            return True
        if v1 == 0 or v2 == 0 or v1 is None or v2 is None:
            return False
        return abs(v1 - v2) / max(abs(v1), abs(v2)) <= self.tolerance

    def same_box(self, s1: Any, s2: Any) -> bool:
        return all(self.close(getattr(s1, a), getattr(s2, a)) for a in ("left", "top", "width", "height"))

    def decks(self, prs1: Any, prs2: Any) -> bool:
        if self.on["examine_number_of_slides"] and len(prs1.slides) != len(prs2.slides):
            return False
        return all(self.slide(i, s1, s2) for i, (s1, s2) in enumerate(zip(prs1.slides, prs2.slides), 1))

    def slide(self, index: int, slide1: Any, slide2: Any) -> bool:
        if self.on["examine_background_color"] and _background(slide1) != _background(slide2):
            return False
        if self.on["examine_note"] and _notes(slide1) != _notes(slide2):
            return False
        if len(slide1.shapes) != len(slide2.shapes):
            return False
        has_runs = False
        for shape1, shape2 in zip(slide1.shapes, slide2.shapes):
            result = self.shape(index, shape1, shape2)
            if result is False:
                return False
            has_runs = has_runs or result == "runs"
        # OSWorld checks the whole slide's bullets once per run of a text shape, so only with a run.
        if has_runs and self.on["examine_bullets"] and _bullets_differ(slide1, slide2):
            return False
        return self.text_shapes(list(_text_shapes(slide1.shapes)), list(_text_shapes(slide2.shapes)))

    def rules(self, index: int, s1: Any, s2: Any) -> bool:
        """OSWorld's task-specific geometry rules (all off by default)."""
        text1, text2 = _has_text(s1), _has_text(s2)
        if self.rule["examine_title_bottom_position"]:
            if text1 and text2 and s1.text == s2.text:
                if s1.text == "Product Comparison" and (s1.top <= s2.top or s1.top < 3600000):
                    return False
            elif not self.same_box(s1, s2):
                return False
        if self.rule["examine_table_bottom_position"]:
            if index == 3 and s1.shape_type == 19 and s2.shape_type == 19:
                if s1.top <= s2.top or s1.top < 3600000:
                    return False
            elif not self.same_box(s1, s2):
                return False
        if self.rule["examine_right_position"] and index == 2 and not text1 and not text2:
            if s1.left <= s2.left or s1.left < 4320000:
                return False
        if self.rule["examine_top_position"] and index == 2 and s1.shape_type == s2.shape_type == _PICTURE:
            if s1.top >= s2.top or s1.top > 1980000:
                return False
        if self.rule["examine_shape_for_shift_size"] and not self.same_box(s1, s2):
            keep = "Elaborate on what you want to discuss."
            if not (text1 and text2 and s1.text == s2.text == keep):
                return False
        return True

    def late_rules(self, s1: Any, s2: Any) -> bool:
        """The rules OSWorld applies after the default geometry check."""
        if self.rule["examine_image_size"]:
            if s1.shape_type == s2.shape_type == _PICTURE:
                if not (self.close(s1.width, s2.width) and self.close(s1.height, s2.height)):
                    return False
            elif not self.same_box(s1, s2):
                return False
        if self.rule["examine_modify_height"]:
            text1, text2 = _has_text(s1), _has_text(s2)
            if (not text1 and not text2) or s1.shape_type == s2.shape_type == _FREEFORM:
                if not self.close(s1.height, s2.height):
                    return False
            elif not self.same_box(s1, s2):
                return False
        return True

    def shape(self, index: int, s1: Any, s2: Any) -> bool | str:
        """False on a mismatch; "runs" when the pair was compared run by run; else True."""
        if not self.rules(index, s1, s2):
            return False
        if self.on["examine_shape"] and not self.same_box(s1, s2):
            return False
        if not self.late_rules(s1, s2):
            return False
        if s1.shape_type == MSO_SHAPE_TYPE.TABLE:
            if not getattr(s2, "has_table", False) or not self.table(s1.table, s2.table):
                return False
        if not (_has_text(s1) and _has_text(s2)):
            return True
        if self.on["examine_text"] and s1.text.strip() != s2.text.strip():
            return False
        paras1, paras2 = s1.text_frame.paragraphs, s2.text_frame.paragraphs
        if len(paras1) != len(paras2):
            return False
        has_runs = False
        for p1, p2 in zip(paras1, paras2):
            if self.on["examine_alignment"] and _alignment(p1) != _alignment(p2):
                return False
            if self.on["examine_text"] and p1.text != p2.text:
                return False
            if self.on["examine_indent"] and p1.level != p2.level:
                return False
            if len(p1.runs) != len(p2.runs):
                return False
            for r1, r2 in zip(p1.runs, p2.runs):
                has_runs = True
                if not self.run(r1.font, r2.font):
                    return False
        return "runs" if has_runs else True

    def run(self, f1: Any, f2: Any) -> bool:
        on = self.on
        if on["examine_font_name"] and f1.name != f2.name:
            return False
        if on["examine_font_size"] and f1.size != f2.size:
            return False
        if on["examine_font_bold"] and f1.bold != f2.bold and not (_off(f1.bold) and _off(f2.bold)):
            return False
        if on["examine_font_italic"] and f1.italic != f2.italic and not (_off(f1.italic) and _off(f2.italic)):
            return False
        if on["examine_color_rgb"] and not self.same_rgb(f1, f2):
            return False
        if on["examine_font_underline"] and _underline_differs(f1.underline, f2.underline):
            return False
        strike1 = f1._element.attrib.get("strike", "noStrike")
        strike2 = f2._element.attrib.get("strike", "noStrike")
        return not (on["examine_strike_through"] and strike1 != strike2)

    @staticmethod
    def same_rgb(f1: Any, f2: Any) -> bool:
        (has1, rgb1), (has2, rgb2) = _rgb(f1.color), _rgb(f2.color)
        return not (has1 and has2) or rgb1 == rgb2

    def table(self, t1: Any, t2: Any) -> bool:
        """Table layout and run formatting; OSWorld compares no cell text here (bold, italic and
        underline regardless of their examine_* options)."""
        if len(t1.rows) != len(t2.rows) or len(t1.columns) != len(t2.columns):
            return False
        for r in range(len(t1.rows)):
            for c in range(len(t1.columns)):
                paras1 = t1.cell(r, c).text_frame.paragraphs
                paras2 = t2.cell(r, c).text_frame.paragraphs
                if len(paras1) != len(paras2):
                    return False
                for p1, p2 in zip(paras1, paras2):
                    if len(p1.runs) != len(p2.runs):
                        return False
                    for r1, r2 in zip(p1.runs, p2.runs):
                        f1, f2 = r1.font, r2.font
                        if self.on["examine_color_rgb"] and not self.same_rgb(f1, f2):
                            return False
                        if f1.bold != f2.bold and not (_off(f1.bold) and _off(f2.bold)):
                            return False
                        if f1.italic != f2.italic and not (_off(f1.italic) and _off(f2.italic)):
                            return False
                        if _underline_differs(f1.underline, f2.underline):
                            return False
        return True

    def text_shapes(self, shapes1: list[Any], shapes2: list[Any]) -> bool:
        if len(shapes1) != len(shapes2):
            return False
        if not self.on["examine_alignment"]:
            return True
        for s1, s2 in zip(shapes1, shapes2):
            if self.on["examine_text"] and s1.text.strip() != s2.text.strip():
                return False
            paras1, paras2 = s1.text_frame.paragraphs, s2.text_frame.paragraphs
            if len(paras1) != len(paras2):
                return False
            if any(_alignment(p1) != _alignment(p2) for p1, p2 in zip(paras1, paras2)):
                return False
        return True


def compare_pptx_files(file1_path: Any, file2_path: Any, **options: Any) -> float:
    """1.0 when the two decks agree on every examined property, else 0.0 (see the module docstring)."""
    prs1, prs2 = _open(file1_path), _open(file2_path)
    if prs1 is None or prs2 is None:
        return 0.0
    return 1.0 if _Compare(options).decks(prs1, prs2) else 0.0
