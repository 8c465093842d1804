"""Synthetic GUI grounding rows: desktop-like screens drawn with PIL, one target element per row.

A screen has a desktop background, a taskbar, desktop icons with labels and 1-3 windows (title bar,
sometimes a menu bar with one menu opened, text fields, checkboxes, buttons, a scrollable list).
Each row names one element: mostly `click` with the element's box, some `type` (the field's box and
the text) and `scroll` (the list's box and the direction). Labels are drawn with PIL's bundled font
(`ImageFont.load_default(size=...)`, no downloads) at 12 px or more, and every label on a screen is
unique, so the target is never ambiguous; the other elements stay on screen as distractors.

Held-out split: `split="test"` shares nothing with "train" but the kinds of widgets and the instruction
templates. Its labels (buttons, fields, menus, menu items, checkboxes, icons, window titles, lists,
list items, typed texts) come from a vocabulary disjoint from train's; its screens come from another
random stream (the seed key includes the split); and it arranges them differently: a top panel instead
of a bottom taskbar, desktop icons on the right instead of the left, one large window with others
stacked beside it instead of side-by-side columns, macOS-like title bars (circles left, title centred),
toolbar buttons above the form instead of a button row below it, field labels above the fields
instead of beside them, checkboxes in a row, the list on the left. A model that memorised train
screens or words has nothing to recall on test.

`response` holds GUI-R1's answer for the image as rendered (`point` in its pixels); a trainer that
resizes the screenshot rebuilds the answer with `gui_r1_answer(row, size=...)` after the think part.
"""

from __future__ import annotations

import colorsys
import io
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont

from guirl.data.rows import GroundingRow, gui_r1_answer

SPLITS = ("train", "test")
DEFAULT_SIZES = ((640, 400), (800, 600), (1024, 640), (1280, 800))
TYPE_SHARE = 0.2
"""Rows that type into a field (when the screen has one)."""
SCROLL_SHARE = 0.35
"""Of the other rows on a screen with a list, those that scroll it (about 1 row in 12 overall)."""

# Disjoint per split (tests check it); one string per category, "|"-separated.
_VOCAB = {
    "train": {
        "button": "Save|Cancel|Open|Apply|Delete|Export|Print|Refresh|Upload|Share|Submit|Reset|Next|Back|"
        "Copy|Paste|Search|Send|Close|Clear|Help|Login|Sync|Undo|Add|Remove|Start|Stop|Accept|Browse",
        "field": "Name|Email|Password|Username|Phone|Address|City|Country|Title|Subject|Message|Comment|"
        "Company|Website|Age|Notes|Tags|Query|Amount|Date",
        "menu": "File|Edit|View|Tools|Window|Format|Insert|Options|Bookmarks|History|Settings|Go",
        "menu_item": "New|Open Recent|Save As|Zoom In|Zoom Out|Full Screen|Preferences|Find|Replace|"
        "Select All|Word Count|Spelling|Page Setup|Properties|About|Check for Updates|Show Ruler|Bold",
        "checkbox": "Remember me|Dark mode|Auto save|Show hidden files|Enable sound|Notifications|Word wrap|"
        "Line numbers|Send reports|Start at login|Use proxy|Keep backups",
        "icon": "Mail|Calendar|Music|Photos|Terminal|Browser|Trash|Documents|Calculator|Camera|Maps|Weather|"
        "Clock|Chat|Paint|Journal",
        "title": "Text Editor|Inbox|File Manager|Preferences Panel|Spreadsheet|Image Viewer|Control Center|"
        "Task List|Mail Client|Notebook",
        "list": "Files|Songs|Tasks|Messages|Projects|Recent",
        "list_item": "report.pdf|budget.xlsx|notes.txt|photo.png|draft.docx|slides.pptx|data.csv|readme.md|"
        "invoice.pdf|song.mp3|backup.zip|script.py|letter.doc|plan.txt",
        "text": "hello world|meeting at noon|john smith|weekly report|blue sky|project alpha|42 main street|"
        "quick brown fox|good morning|coffee break|red apple|team lunch|open source|rainy day",
    },
    "test": {
        "button": "Download|Rename|Archive|Publish|Import|Preview|Confirm|Continue|Redo|Merge|Restore|"
        "Connect|Install|Update|Finish|Skip|Retry|Pause|Resume|Attach|Compare|Convert|Duplicate|Invite|"
        "Approve|Decline|Verify|Schedule|Filter|Sort",
        "field": "Surname|Nickname|Street|Zip code|Region|Mobile|Fax|Department|Job title|Birthday|Caption|"
        "Summary|Keyword|Quantity|Price|Budget|Location|Description|Reference|Account",
        "menu": "Run|Source|Canvas|Layer|Table|Data|Review|Arrange|Selection|Project|Debug|Navigate",
        "menu_item": "Duplicate Tab|Reload Page|Toggle Sidebar|Go to Line|Run Script|Crop Image|"
        "Flip Horizontal|Merge Layers|Insert Row|Sort Range|Track Changes|Align Left|Group Items|"
        "Invert Selection|Build Project|Step Over|Clear Console|Show Grid",
        "checkbox": "Stay signed in|High contrast|Auto update|Show previews|Mute alerts|Compact view|"
        "Spell check|Show grid lines|Share usage data|Launch on startup|Offline mode|Sync folders",
        "icon": "Contacts|Videos|Downloads|Podcasts|Games|Wallet|Store|Books|News|Backup|Printer|Network|"
        "Recorder|Scanner|Fonts|Health",
        "title": "Code Studio|Media Player|Photo Editor|Address Book|System Monitor|Web Browser|"
        "Drawing Board|Package Manager|Video Call|Star Atlas",
        "list": "Albums|Issues|Orders|Playlists|Sessions|Devices",
        "list_item": "summary.odt|chart.svg|memo.rtf|clip.mp4|archive.tar|index.html|config.yaml|thesis.tex|"
        "logo.gif|table.ods|track.flac|main.rs|poster.eps|model.obj",
        "text": "see you soon|green valley|mary jones|quarterly plan|silver moon|version two|17 oak avenue|"
        "lazy dog|happy birthday|tea time|yellow pear|board meeting|closed door|sunny morning",
    },
}
VOCAB: dict[str, dict[str, tuple[str, ...]]] = {
    split: {kind: tuple(words.split("|")) for kind, words in kinds.items()} for split, kinds in _VOCAB.items()
}

_CLICK_TEMPLATES = {
    "button": (
        "Click the '{label}' button",
        "Click on '{label}'",
        "Press the {label} button in the {window} window",
    ),
    "field": ("Click the {label} field", "Click on the '{label}' input box"),
    "menu": ("Open the {label} menu", "Click the '{label}' menu in the {window} window"),
    "menu_item": ("Select '{label}' in the {group} menu", "Choose '{label}' from the {group} menu"),
    "checkbox": ("{verb} the '{label}' box", "Click the {label} checkbox"),
    "icon": ("Click on the {label} icon", "Click the '{label}' icon on the desktop"),
    "list_item": ("Click '{label}' in the {group} list", "Select the item '{label}' in the {window} window"),
}
_TYPE_TEMPLATES = ("Type '{text}' in the {label} field", "Enter '{text}' into the '{label}' box")
_SCROLL_TEMPLATES = ("Scroll {direction} in the {label} list", "Scroll the '{label}' list {direction}")


@dataclass(frozen=True)
class Element:
    """One widget on a synthetic screen; `box` in pixels (x1, y1, x2, y2), x2/y2 exclusive."""

    kind: str
    label: str
    box: tuple[int, int, int, int]
    window: str = ""
    """Title of the window holding it ("" on the desktop)."""
    group: str = ""
    """The menu of a menu item, the list of a list item."""
    state: str = ""
    """checked/unchecked for a checkbox; the list's scroll thumb: top/middle/bottom."""


@dataclass(frozen=True)
class SynthSample:
    """A row and what it was made from (for tests and for looking at the data)."""

    row: GroundingRow
    target: Element
    elements: tuple[Element, ...]


def synthesize(
    n: int,
    *,
    seed: int,
    split: str = "train",
    sizes: tuple[tuple[int, int], ...] = DEFAULT_SIZES,
    workers: int = 1,
) -> Iterator[GroundingRow]:
    """`n` rows, each its own screen, row i at `sizes[i % len(sizes)]`; row i depends only on (seed,
    split, i, sizes), so `workers` > 1 (processes) yields the same rows in the same order, faster."""
    _check(n, split, sizes)
    if workers <= 1:
        return (sample.row for sample in synthesize_samples(n, seed=seed, split=split, sizes=sizes))
    return _parallel_rows(n, seed, split, tuple(sizes), workers)


def _parallel_rows(
    n: int, seed: int, split: str, sizes: tuple[tuple[int, int], ...], workers: int
) -> Iterator[GroundingRow]:
    import multiprocessing
    from functools import partial

    make = partial(_row_at, seed=seed, split=split, sizes=sizes)
    # spawn, not fork: the caller may hold threads or sockets (CONVENTIONS.md)
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(make, range(n), chunksize=8)


def synthesize_samples(
    n: int, *, seed: int, split: str = "train", sizes: tuple[tuple[int, int], ...] = DEFAULT_SIZES
) -> Iterator[SynthSample]:
    """Like `synthesize` (one process), with each row's target element and the screen's other elements."""
    _check(n, split, sizes)
    return (sample_at(index, seed=seed, split=split, sizes=sizes) for index in range(n))


def sample_at(index: int, *, seed: int, split: str, sizes: tuple[tuple[int, int], ...]) -> SynthSample:
    """Row `index` of the (seed, split, sizes) stream."""
    # a string seed is hashed (sha512) by random.Random: one stream per (split, seed, row)
    rng = random.Random(f"guirl-synth/{split}/{seed}/{index}")
    width, height = sizes[index % len(sizes)]
    image, elements = _Screen(rng, split, width, height).render()
    return _sample(rng, split, f"synth-{split}-{seed}-{index:07d}", image, elements)


def _row_at(index: int, *, seed: int, split: str, sizes: tuple[tuple[int, int], ...]) -> GroundingRow:
    return sample_at(index, seed=seed, split=split, sizes=sizes).row


def _check(n: int, split: str, sizes: tuple[tuple[int, int], ...]) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not sizes or any(w < 320 or h < 240 for w, h in sizes):
        raise ValueError(f"sizes must be (width, height) pairs of at least 320x240, got {sizes!r}")


@lru_cache(maxsize=32)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _hls(h: float, lightness: float, s: float) -> tuple[int, int, int]:
    r, g, b = colorsys.hls_to_rgb(h % 1.0, lightness, s)
    return round(r * 255), round(g * 255), round(b * 255)


class _Screen:
    """Draws one screen and records its elements; `split` picks the vocabulary and the arrangement."""

    def __init__(self, rng: random.Random, split: str, width: int, height: int) -> None:
        self.rng, self.split, self.width, self.height = rng, split, width, height
        self.test = split == "test"
        lo = max(12, round(width / 92))
        self.font_px = rng.randint(lo, lo + 2)
        self.font = _font(self.font_px)
        self.used: set[str] = set()
        self.elements: list[Element] = []
        self.dropdowns: list[tuple[str, float, float, list[str], str]] = []
        dark = rng.random() < 0.3
        self.window_bg = _hls(rng.random(), rng.uniform(0.13, 0.2), 0.1) if dark else (250, 250, 250)
        self.fg = (235, 235, 235) if dark else (25, 25, 30)
        self.muted = (150, 150, 155) if dark else (130, 130, 135)
        self.field_bg = _hls(0, 0.1, 0) if dark else (255, 255, 255)
        self.accent = _hls(rng.random(), rng.uniform(0.35, 0.45), rng.uniform(0.5, 0.8))
        self.title_bg = _hls(rng.random(), rng.uniform(0.25, 0.35) if dark else rng.uniform(0.8, 0.9), 0.25)
        self.image = Image.new("RGB", (width, height), _hls(rng.random(), rng.uniform(0.3, 0.7), 0.5))
        self.draw = ImageDraw.Draw(self.image)

    def take(self, kind: str, k: int) -> list[str]:
        """Up to `k` labels of `kind` not yet on this screen."""
        free = [w for w in VOCAB[self.split][kind] if w not in self.used]
        picked = self.rng.sample(free, min(k, len(free)))
        self.used.update(picked)
        return picked

    def text_w(self, text: str) -> int:
        return round(self.font.getlength(text))

    def text(
        self, xy: tuple[float, float], text: str, fill: tuple[int, int, int], anchor: str = "lm"
    ) -> None:
        self.draw.text(xy, text, font=self.font, fill=fill, anchor=anchor)

    def add(self, kind: str, label: str, box: tuple[float, float, float, float], **kw: str) -> None:
        x1, y1, x2, y2 = (round(v) for v in box)
        self.elements.append(Element(kind, label, (x1, y1, x2, y2), **kw))

    def render(self) -> tuple[Image.Image, list[Element]]:
        left, top, right, bottom = self.panel()
        left, right = self.desktop_icons(left, top, right, bottom)
        for rect in self.window_rects(left, top, right, bottom):
            self.window(rect)
        for dropdown in self.dropdowns:  # over every window, as an open menu is
            self.open_menu(*dropdown)
        return self.image, self.elements

    def panel(self) -> tuple[int, int, int, int]:
        """The taskbar (train: bottom, start button and clock) or top panel (test: centred clock)."""
        h = self.font_px + 14
        y = 0 if self.test else self.height - h
        self.draw.rectangle((0, y, self.width, y + h - 1), fill=(32, 34, 40))
        clock = f"{self.rng.randint(0, 23):02d}:{self.rng.randint(0, 59):02d}"
        if self.test:
            self.text((self.width / 2, h / 2), clock, (230, 230, 230), "mm")
            return 0, h, self.width, self.height
        self.draw.rectangle((6, y + 4, 6 + h - 8, y + h - 5), fill=self.accent)
        self.text((self.width - 10, y + h / 2), clock, (230, 230, 230), "rm")
        return 0, 0, self.width, y

    def desktop_icons(self, left: int, top: int, right: int, bottom: int) -> tuple[int, int]:
        """A column of labelled icons (train: left, test: right); returns the free x range."""
        size = self.rng.randint(26, 36) + self.font_px // 2
        labels = self.take("icon", self.rng.randint(2, 5))
        col_w = max([size, *(self.text_w(t) for t in labels)]) + 16
        x0 = right - col_w - 4 if self.test else left + 4
        y = top + 10
        for label in labels:
            if y + size + self.font_px + 10 > bottom:
                break
            cx = x0 + col_w / 2
            self.icon_shape((cx - size / 2, y, cx + size / 2, y + size))
            self.draw.rectangle(
                (
                    cx - self.text_w(label) / 2 - 2,
                    y + size + 2,
                    cx + self.text_w(label) / 2 + 2,
                    y + size + self.font_px + 6,
                ),
                fill=(20, 20, 25),
            )
            self.text((cx, y + size + 4 + self.font_px / 2), label, (245, 245, 245), "mm")
            box = (x0 + 2, y - 2, x0 + col_w - 2, y + size + self.font_px + 8)
            self.add("icon", label, box)
            y += size + self.font_px + 22
        return (left, x0 - 6) if self.test else (x0 + col_w + 6, right)

    def icon_shape(self, box: tuple[float, float, float, float]) -> None:
        fill = _hls(self.rng.random(), 0.5, 0.7)
        x1, y1, x2, y2 = box
        shape = self.rng.randrange(4)
        if shape == 0:
            self.draw.rounded_rectangle(box, radius=6, fill=fill, outline=(255, 255, 255))
        elif shape == 1:
            self.draw.ellipse(box, fill=fill, outline=(255, 255, 255))
        elif shape == 2:
            self.draw.polygon([((x1 + x2) / 2, y1), (x2, y2), (x1, y2)], fill=fill, outline=(255, 255, 255))
        else:
            cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
            self.draw.polygon([(cx, y1), (x2, cy), (cx, y2), (x1, cy)], fill=fill, outline=(255, 255, 255))

    def window_rects(self, left: int, top: int, right: int, bottom: int) -> list[tuple[int, int, int, int]]:
        """Non-overlapping windows: train side by side in columns; test one large window plus others
        stacked beside it (or one above the other)."""
        rng, gap = self.rng, 10
        left, top, right, bottom = left + 4, top + 8, right - 4, bottom - 8
        w, h = right - left, bottom - top
        k = min(rng.choice((1, 2, 2, 3)), max(1, w // 260))
        if not self.test:
            col = (w - gap * (k - 1)) / k
            rects = []
            for i in range(k):
                x1 = left + i * (col + gap)
                y1 = top + rng.randint(0, max(0, h // 6))
                y2 = bottom - rng.randint(0, max(0, h // 8))
                rects.append((round(x1), y1, round(x1 + col), y2))
            return rects
        if k == 1:
            mw, mh = rng.randint(0, w // 8), rng.randint(0, h // 8)
            return [(left + mw, top + mh, right - rng.randint(0, w // 8), bottom - mh)]
        if k == 2 and h >= 400:
            mid = top + round(h * rng.uniform(0.45, 0.55))
            return [(left, top, right, mid - gap // 2), (left, mid + gap // 2, right, bottom)]
        split_x = left + round(w * rng.uniform(0.52, 0.6))
        rects = [(left, top, split_x - gap // 2, bottom)]
        side = k - 1 if h >= 400 else 1
        step = (h - gap * (side - 1)) / side
        for i in range(side):
            y1 = top + i * (step + gap)
            rects.append((split_x + gap // 2, round(y1), right, round(y1 + step)))
        return rects

    def window(self, rect: tuple[int, int, int, int]) -> None:
        x1, y1, x2, y2 = rect
        (title,) = self.take("title", 1) or ["Window"]
        th = self.font_px + 12
        self.draw.rectangle((x1 + 4, y1 + 4, x2 + 3, y2 + 3), fill=(0, 0, 0))  # shadow
        self.draw.rectangle(rect, fill=self.window_bg, outline=self.muted)
        self.draw.rectangle((x1, y1, x2, y1 + th), fill=self.title_bg, outline=self.muted)
        title_fg = (255, 255, 255) if sum(self.title_bg) < 384 else (20, 20, 20)
        if self.test:
            for i, color in enumerate(((237, 94, 87), (245, 190, 60), (98, 196, 84))):
                cx = x1 + 14 + i * 18
                self.draw.ellipse((cx - 6, y1 + th / 2 - 6, cx + 6, y1 + th / 2 + 6), fill=color)
            self.text(((x1 + x2) / 2, y1 + th / 2), title, title_fg, "mm")
        else:
            self.text((x1 + 10, y1 + th / 2), title, title_fg)
            for i in range(3):
                bx = x2 - (i + 1) * (th - 2)
                self.draw.rectangle((bx + 4, y1 + 5, bx + th - 8, y1 + th - 5), outline=title_fg)
        top = y1 + th + 1
        if self.rng.random() < 0.6:
            top = self.menu_bar(x1, top, x2, title)
        if self.test:
            self.content_test((x1 + 12, top + 10, x2 - 12, y2 - 10), title)
        else:
            self.content_train((x1 + 12, top + 10, x2 - 12, y2 - 10), title)

    def menu_bar(self, x1: int, y: int, x2: int, title: str) -> int:
        """A menu bar; sometimes one menu is open (its dropdown is drawn after every window)."""
        mh, ih = self.font_px + 10, self.font_px + 12
        self.draw.line((x1, y + mh, x2, y + mh), fill=self.muted)
        x = x1 + 6
        labels = self.take("menu", self.rng.randint(3, 5))
        items = min(self.rng.randint(3, 5), (self.height - y - mh - 12) // ih)
        open_at = self.rng.randrange(len(labels)) if items >= 3 and self.rng.random() < 0.3 else -1
        for i, label in enumerate(labels):
            w = self.text_w(label) + 16
            if x + w > x2 - 6:
                self.used.discard(label)
                continue
            fg = self.fg
            if i == open_at:
                self.draw.rectangle((x, y + 1, x + w, y + mh - 1), fill=self.accent)
                self.dropdowns.append((label, x, y + mh, self.take("menu_item", items), title))
                fg = (255, 255, 255)
            self.text((x + 8, y + mh / 2), label, fg)
            self.add("menu", label, (x, y, x + w, y + mh), window=title)
            x += w + 2
        return y + mh + 1

    def open_menu(self, menu: str, x: float, y: float, items: list[str], title: str) -> None:
        """An open menu's dropdown; the elements it covers stop being targets."""
        ih = self.font_px + 12
        w = max(self.text_w(t) for t in items) + 36
        x = min(x, self.width - w - 6)
        box = (x, y, x + w, y + ih * len(items) + 8)
        self.draw.rectangle((box[0] + 3, box[1] + 3, box[2] + 3, box[3] + 3), fill=(0, 0, 0))
        self.draw.rectangle(box, fill=self.field_bg, outline=self.muted)
        self.elements = [e for e in self.elements if e.kind == "menu" or not _overlaps(e.box, box)]
        for i, label in enumerate(items):
            iy = y + 4 + i * ih
            self.text((x + 14, iy + ih / 2), label, self.fg)
            self.add("menu_item", label, (x + 2, iy, x + w - 2, iy + ih), window=title, group=menu)

    def button(self, x: float, y: float, label: str, title: str, primary: bool) -> float:
        w, h = self.text_w(label) + 2 * self.rng.randint(10, 16), self.font_px + 14
        fill = self.accent if primary else self.title_bg
        fg = (255, 255, 255) if primary or sum(self.title_bg) < 384 else (20, 20, 20)
        self.draw.rounded_rectangle(
            (x, y, x + w, y + h), radius=self.rng.randint(2, 8), fill=fill, outline=self.muted
        )
        self.text((x + w / 2, y + h / 2), label, fg, "mm")
        self.add("button", label, (x, y, x + w + 1, y + h + 1), window=title)
        return w

    def field(self, box: tuple[float, float, float, float], label: str, title: str) -> None:
        self.draw.rectangle(box, fill=self.field_bg, outline=self.muted)
        if self.rng.random() < 0.6:
            self.text((box[0] + 6, (box[1] + box[3]) / 2), f"Enter {label.lower()}", self.muted)
        self.add("field", label, (box[0], box[1], box[2] + 1, box[3] + 1), window=title)

    def checkbox(self, x: float, y: float, label: str, title: str) -> float:
        s = self.font_px + 2
        checked = self.rng.random() < 0.5
        self.draw.rectangle(
            (x, y, x + s, y + s), fill=self.accent if checked else self.field_bg, outline=self.muted
        )
        if checked:
            self.draw.line(
                (x + 3, y + s / 2, x + s / 2 - 1, y + s - 4, x + s - 3, y + 3), fill=(255, 255, 255), width=2
            )
        self.text((x + s + 6, y + s / 2), label, self.fg)
        w = s + 6 + self.text_w(label)
        self.add(
            "checkbox",
            label,
            (x, y, x + w + 1, y + s + 1),
            window=title,
            state="checked" if checked else "unchecked",
        )
        return w

    def list_box(self, box: tuple[float, float, float, float], title: str) -> None:
        x1, y1, x2, y2 = box
        ih = self.font_px + 10
        rows = min(8, int((y2 - y1 - 4) // ih))
        if rows < 3:
            return
        labels, items = self.take("list", 1), self.take("list_item", rows)
        if not labels or len(items) < 3:  # the vocabulary is used up on this screen
            self.used.difference_update(labels + items)
            return
        y2 = y1 + len(items) * ih + 4  # full of items: the scrollbar says there are more
        box = (x1, y1, x2, y2)
        self.draw.rectangle(box, fill=self.field_bg, outline=self.muted)
        selected = self.rng.randrange(len(items))
        sb = 12
        for i, item in enumerate(items):
            iy = y1 + 2 + i * ih
            fg = self.fg
            if i == selected:
                self.draw.rectangle((x1 + 2, iy, x2 - sb - 3, iy + ih - 1), fill=self.accent)
                fg = (255, 255, 255)
            self.text((x1 + 8, iy + ih / 2), item, fg)
            self.add("list_item", item, (x1 + 1, iy, x2 - sb - 2, iy + ih), window=title, group=labels[0])
        state = self.rng.choice(("top", "middle", "bottom"))
        track = y2 - y1 - 4
        thumb = track * self.rng.uniform(0.3, 0.6)
        ty = {"top": y1 + 2, "middle": y1 + 2 + (track - thumb) / 2, "bottom": y2 - 2 - thumb}[state]
        self.draw.rectangle((x2 - sb - 1, y1 + 1, x2 - 1, y2 - 1), fill=(200, 200, 205))
        self.draw.rounded_rectangle((x2 - sb + 1, ty, x2 - 3, ty + thumb), radius=4, fill=(110, 110, 120))
        self.add("list", labels[0], (x1, y1, x2 + 1, y2 + 1), window=title, state=state)

    def content_train(self, rect: tuple[float, float, float, float], title: str) -> None:
        """Labels beside fields, checkboxes below, a button row at the bottom right, a list on the right."""
        x1, y1, x2, y2 = rect
        rng, rh, bh = self.rng, self.font_px + 16, self.font_px + 14
        if x2 - x1 >= 420 and rng.random() < 0.45:
            lx = x2 - (x2 - x1) * rng.uniform(0.36, 0.44)
            self.list_box((lx, y1, x2, y2 - bh - 12), title)
            x2 = lx - 14
        fields = self.take("field", rng.randint(1, 4))
        label_w = max((self.text_w(f + ":") for f in fields), default=0) + 10
        y = y1
        for name in fields:
            if y + rh > y2 - bh - 10 or x2 - (x1 + label_w) < 90:
                self.used.discard(name)
                continue
            self.text((x1, y + rh / 2 - 2), name + ":", self.fg)
            fx2 = min(x2, x1 + label_w + rng.randint(150, 320))
            self.field((x1 + label_w, y, fx2, y + rh - 4), name, title)
            y += rh + 4
        for label in self.take("checkbox", rng.randint(0, 3)):
            if y + self.font_px + 4 > y2 - bh - 10 or self.text_w(label) + 30 > x2 - x1:
                self.used.discard(label)
                continue
            self.checkbox(x1, y + 2, label, title)
            y += self.font_px + 12
        x = x2
        for i, label in enumerate(self.take("button", rng.randint(1, 3))):
            w = self.text_w(label) + 34
            if x - w < x1:
                self.used.discard(label)
                continue
            x -= w
            self.button(x, y2 - bh, label, title, primary=i == 0)
            x -= 8

    def content_test(self, rect: tuple[float, float, float, float], title: str) -> None:
        """Toolbar buttons on top, labels above fields in one or two columns, checkboxes in a row, a list
        on the left."""
        x1, y1, x2, y2 = rect
        rng, bh = self.rng, self.font_px + 14
        x = x1
        for label in self.take("button", rng.randint(1, 3)):
            if x + self.text_w(label) + 34 > x2:
                self.used.discard(label)
                continue
            x += self.button(x, y1, label, title, primary=rng.random() < 0.3) + 8
        y1 += bh + 8
        self.draw.line((x1, y1, x2, y1), fill=self.muted)
        y1 += 8
        if x2 - x1 >= 400 and rng.random() < 0.45:
            lx = x1 + (x2 - x1) * rng.uniform(0.34, 0.42)
            self.list_box((x1, y1, lx, y2), title)
            x1 = lx + 14
        cols = 2 if x2 - x1 >= 360 else 1
        col_w = (x2 - x1 - 14 * (cols - 1)) / cols
        block = self.font_px * 2 + 20
        fields = self.take("field", rng.randint(1, 4))
        for i, name in enumerate(fields):
            fx, fy = x1 + (i % cols) * (col_w + 14), y1 + (i // cols) * (block + 6)
            if fy + block > y2 - self.font_px - 8:
                self.used.discard(name)
                continue
            self.text((fx, fy + self.font_px / 2), name, self.fg)
            self.field((fx, fy + self.font_px + 4, fx + col_w, fy + block), name, title)
        y = y1 + ((len(fields) + cols - 1) // cols) * (block + 6) + 4
        x = x1
        for label in self.take("checkbox", rng.randint(0, 3)):
            w = self.font_px + 8 + self.text_w(label)
            if x + w > x2 or y + self.font_px + 4 > y2:
                self.used.discard(label)
                continue
            x += self.checkbox(x, y, label, title) + 18


def _overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _sample(
    rng: random.Random, split: str, row_id: str, image: Image.Image, elements: list[Element]
) -> SynthSample:
    """Pick the target (an element kind first, so buttons do not crowd out the rest) and make the row."""
    fields = [e for e in elements if e.kind == "field"]
    lists = [e for e in elements if e.kind == "list"]
    clickable = sorted({e.kind for e in elements if e.kind != "list"})
    roll = rng.random()
    if fields and roll < TYPE_SHARE:
        target = rng.choice(fields)
        text = rng.choice(VOCAB[split]["text"])
        action, input_text, task_type = "type", text, "high"
        instruction = rng.choice(_TYPE_TEMPLATES).format(text=text, label=target.label)
        reason = f"The {target.label} field is in the {target.window} window; I type '{text}' into it."
    elif lists and rng.random() < SCROLL_SHARE:
        target = rng.choice(lists)
        direction = {"top": "down", "bottom": "up"}.get(target.state) or rng.choice(("up", "down"))
        action, input_text, task_type = "scroll", direction, "high"
        instruction = rng.choice(_SCROLL_TEMPLATES).format(direction=direction, label=target.label)
        reason = f"The {target.label} list has a scrollbar; I scroll it {direction}."
    else:
        kind = rng.choice(clickable)
        target = rng.choice([e for e in elements if e.kind == kind])
        verb = "Uncheck" if target.state == "checked" else "Check"
        template = rng.choice(_CLICK_TEMPLATES[kind])
        instruction = template.format(label=target.label, window=target.window, group=target.group, verb=verb)
        # half the click rows are "high" (full action set), or task_type alone would give the action away
        action, input_text, task_type = "click", "", rng.choice(("low", "high"))
        where = f"in the {target.window} window" if target.window else "on the desktop"
        reason = f"The '{target.label}' {kind.replace('_', ' ')} is {where}; I click its centre."
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=1, compress_type=3)  # Z_RLE: flat GUI colours, fast and small
    width, height = image.size
    x1, y1, x2, y2 = target.box
    row = GroundingRow(
        id=row_id,
        image=buf.getvalue(),
        width=width,
        height=height,
        instruction=instruction,
        task_type=task_type,
        gt_action=action,
        gt_bbox=(x1 / width, y1 / height, min(x2, width) / width, min(y2, height) / height),
        gt_input_text=input_text,
        domain=f"synth-{target.kind.replace('_', '-')}",
    )
    response = f"<think> {reason} </think> <answer>{gui_r1_answer(row)}</answer>"
    return SynthSample(row=replace(row, response=response), target=target, elements=tuple(elements))
