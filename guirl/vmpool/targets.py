"""The targets app: a desktop task family a small model can learn, and the app that plays it.

A Tk window (Python's tkinter: Debian's `python3-tk`) fills the screen and shows what the task's seed drew:

- `click`: four coloured targets, each labelled with its colour's name, at positions and sizes drawn from
  the seed; the task: "Click the target labelled red." (one step). With `goals` (e.g. red alone) the goal
  is always one of those colours and the other three are drawn from the rest: the task is then finding
  that colour among distractors, not also reading which colour the instruction names;
- `type`: one text field at a seeded place, focused; the task: "Type river into the field." (one step);
- `menu`: a `menu` button; clicking it shows four labelled items at seeded places; the task: "Open the
  menu, then pick blue." (two steps).

The app writes what the user did to `RECORD`, one event a line (`click red`, `click none`, `open`,
`field riv`), rewritten after each event. An evaluator reads it with OSWorld's `vm_command_line` getter
running `python -m guirl.vmpool.targets --read` and its `exact_match` metric: a task succeeds when the
record is exactly its expected events (one wrong click fails it). `--read` first syncs with the app: the
last click may still be in the app's X queue when the evaluation starts, so the reader asks (a nonce in
`SYNC`) and the app answers (the nonce in `ACK`) only after a round trip to the X server and handling every
event queued by then — the click the agent made before the evaluation among them.

`layout()` is a pure function of (kind, seed, screen size, labels, goals): `guirl tasks generate` draws the
same layout to write each task's instruction, expected record and reference solution.

    python -m guirl.vmpool.targets --kind click --seed 7 --width 640 --height 400 [--labels red,green,...]
        [--goals red]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass

COLOURS: dict[str, str] = {
    "red": "#d62728",
    "green": "#2ca02c",
    "blue": "#1f77b4",
    "orange": "#ff7f0e",
    "purple": "#9467bd",
    "yellow": "#f0d020",
    "pink": "#f7a8d8",
    "brown": "#8c564b",
    "cyan": "#17becf",
    "black": "#111111",
}
"""The labels a target can carry, each drawn in its colour (a label names what the target looks like)."""
WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "tiger",
    "piano",
    "lemon",
    "ocean",
    "candle",
    "forest",
    "silver",
)
"""What a `type` task asks to type."""
KINDS = ("click", "type", "menu")
RECORD = "/tmp/guirl-targets.txt"
"""Where the app writes its record (on the desktop)."""
SYNC = "/tmp/guirl-targets.sync"
ACK = "/tmp/guirl-targets.ack"
READ_TIMEOUT_S = 10.0
"""How long `--read` waits for the app's answer."""
TITLE = "guirl targets"
"""The window's title (a task's setup waits for it to be visible)."""
N_TARGETS = 4
GRID = (2, 2)
"""Targets sit in the cells of a 2 x 2 grid (which colour where: drawn from the seed), each at a drawn size
and place within its cell (the menu's button sits in the middle, clear of them): a policy learns four
regions of the screen, then which one holds the colour asked for."""


def parse_goals(text: str) -> tuple[str, ...] | None:
    """A `--goals` flag: comma-separated colours, or "any" (None: the goal is any colour drawn). Names are
    not checked here (`layout` refuses what it cannot draw); none at all gives (), which is refused too."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    return None if names == ("any",) else names


@dataclass(frozen=True)
class Box:
    label: str
    x: int
    y: int
    w: int
    h: int

    @property
    def centre(self) -> tuple[int, int]:
        return self.x + self.w // 2, self.y + self.h // 2

    def contains(self, x: float, y: float) -> bool:
        return self.x <= x < self.x + self.w and self.y <= y < self.y + self.h

    def overlaps(self, other: Box, gap: int) -> bool:
        return not (
            self.x + self.w + gap <= other.x
            or other.x + other.w + gap <= self.x
            or self.y + self.h + gap <= other.y
            or other.y + other.h + gap <= self.y
        )


@dataclass(frozen=True)
class Layout:
    kind: str
    seed: int
    width: int
    height: int
    goal: str
    """The label to click or pick, or the word to type."""
    targets: tuple[Box, ...] = ()
    """`click`: the targets; `menu`: the items the menu shows."""
    button: Box | None = None
    """`menu`: the button that opens it."""
    field: Box | None = None
    """`type`: the text field."""

    @property
    def instruction(self) -> str:
        match self.kind:
            case "click":
                return f"Click the target labelled {self.goal}."
            case "type":
                return f"Type {self.goal} into the field."
        return f"Open the menu, then pick {self.goal}."

    @property
    def expected(self) -> str:
        """The record of a success."""
        match self.kind:
            case "click":
                return f"click {self.goal}"
            case "type":
                return f"field {self.goal}"
        return f"open\nclick {self.goal}"

    def goal_box(self) -> Box:
        (box,) = [b for b in self.targets if b.label == self.goal]
        return box


def _place(rng: random.Random, width: int, height: int, taken: list[Box], label: str, size) -> Box:
    gap = max(2, min(width, height) // 50)
    for _ in range(2000):
        w = int(width * rng.uniform(*size[0]))
        h = int(height * rng.uniform(*size[1]))
        box = Box(label, rng.randrange(gap, width - w - gap), rng.randrange(gap, height - h - gap), w, h)
        if not any(box.overlaps(t, gap) for t in taken):
            return box
    raise ValueError(f"no room for {len(taken) + 1} targets on a {width}x{height} screen")


def layout(
    kind: str,
    seed: int,
    width: int,
    height: int,
    labels: tuple[str, ...] | None = None,
    goals: tuple[str, ...] | None = None,
) -> Layout:
    """What `seed` draws for a task of `kind` on a `width` x `height` screen: the targets' labels (among
    `labels`, default every colour), positions and sizes, and the goal (among `goals`, default any of the
    targets drawn; with `goals`, the goal is drawn first and the other targets from the rest of `labels`)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    if width < 320 or height < 200:
        raise ValueError(f"a {width}x{height} screen is too small (at least 320x200)")
    labels = tuple(labels or COLOURS)
    unknown = [x for x in labels if x not in COLOURS]
    if unknown or len(set(labels)) < N_TARGETS or len(set(labels)) != len(labels):
        raise ValueError(
            f"labels: {N_TARGETS} or more distinct colours of {', '.join(COLOURS)} (got {list(labels)})"
        )
    if goals is not None and (not goals or any(g not in labels for g in goals)):
        raise ValueError(f"goals: one or more of the labels ({', '.join(labels)}), got {list(goals)}")
    rng = random.Random(f"guirl-targets/{kind}/{seed}")
    if kind == "type":
        field = _place(rng, width, height, [], "field", ((0.3, 0.45), (0.1, 0.14)))
        return Layout(kind, seed, width, height, rng.choice(WORDS), field=field)
    button = None
    if kind == "menu":  # in the middle of the screen; the items are drawn around it
        w, h = width // 8, height // 10
        button = Box("menu", (width - w) // 2, (height - h) // 2, w, h)
    cells = rng.sample(range(GRID[0] * GRID[1]), N_TARGETS)
    if goals is None:
        chosen = rng.sample(sorted(labels), N_TARGETS)
    else:  # the goal first, then the others; which cell each takes: drawn
        goal = rng.choice(sorted(set(goals)))
        others = rng.sample(sorted(set(labels) - {goal}), N_TARGETS - 1)
        chosen = rng.sample([goal, *others], N_TARGETS)
    targets = []
    for cell, label in zip(cells, chosen):
        for _ in range(1000):
            box = _in_cell(rng, width, height, cell, label, (0.6, 0.8), (0.5, 0.68))
            if button is None or not box.overlaps(button, max(2, min(width, height) // 50)):
                break
        else:
            raise ValueError(f"no room for the menu's items on a {width}x{height} screen")
        targets.append(box)
    targets = tuple(targets)
    goal = rng.choice(chosen) if goals is None else goal
    return Layout(kind, seed, width, height, goal, targets, button=button)


def _in_cell(rng: random.Random, width: int, height: int, cell: int, label: str, fw, fh) -> Box:
    """A box of `fw` x `fh` of a grid cell's size (fractions drawn from those ranges), placed in the cell."""
    cw, ch = width // GRID[0], height // GRID[1]
    x0, y0 = (cell % GRID[0]) * cw, (cell // GRID[0]) * ch
    w, h = int(cw * rng.uniform(*fw)), int(ch * rng.uniform(*fh))
    gap = max(2, min(width, height) // 50)
    if cw - w - gap < gap or ch - h - gap < gap:
        raise ValueError(f"a {width}x{height} screen leaves no room around the targets")
    return Box(
        label, x0 + rng.randrange(gap, cw - w - gap + 1), y0 + rng.randrange(gap, ch - h - gap + 1), w, h
    )


# -- the app (on the desktop) -------------------------------------------------------------------------


class _Record:
    def __init__(self, path: str) -> None:
        self.path = path
        self.events: list[str] = []
        self.field = ""
        self.write()

    def add(self, event: str) -> None:
        self.events.append(event)
        self.write()

    def set_field(self, text: str) -> None:
        self.field = text
        self.write()

    def write(self) -> None:
        _write(self.path, "\n".join([*self.events, *([f"field {self.field}"] if self.field else [])]))


def font_size(height: int) -> int:
    """The labels' font size on a screen `height` pixels high."""
    return max(10, height // 28)


def text_colour(label: str) -> str:
    """A label's text colour: dark on the light colours, white on the others."""
    return "#111111" if label in ("orange", "yellow", "pink", "cyan") else "#ffffff"


def run_app(lay: Layout, record_path: str) -> None:  # pragma: no cover - runs on a desktop (tested there)
    import tkinter as tk

    root = tk.Tk()
    screen = (root.winfo_screenwidth(), root.winfo_screenheight())
    if screen != (lay.width, lay.height):  # the setup never sees the window: an environment fault
        sys.exit(
            f"targets: the task is drawn for a {lay.width}x{lay.height} screen; "
            f"this one is {screen[0]}x{screen[1]}"
        )
    root.title("starting")  # TITLE once the window covers the screen: what a task's setup waits for
    root.geometry(f"{lay.width}x{lay.height}+0+0")
    root.attributes("-fullscreen", True)  # no window manager's frame: the layout's pixels are the screen's
    canvas = tk.Canvas(root, width=lay.width, height=lay.height, bg="#e8e8e8", highlightthickness=0)
    canvas.place(x=0, y=0)
    for stale in (SYNC, ACK):  # an earlier app's exchange on this desktop
        if os.path.exists(stale):
            os.remove(stale)
    record = _Record(record_path)
    font = ("DejaVu Sans", font_size(lay.height), "bold")

    def draw(box: Box, fill: str, state: str = "normal", tag: str = "") -> None:
        text = text_colour(box.label)
        canvas.create_rectangle(
            box.x, box.y, box.x + box.w, box.y + box.h, fill=fill, outline="#333333", state=state, tags=tag
        )
        canvas.create_text(*box.centre, text=box.label, fill=text, font=font, state=state, tags=tag)

    opened = [lay.kind != "menu"]
    for box in lay.targets:
        draw(box, COLOURS[box.label], "normal" if opened[0] else "hidden", "items")
    if lay.button is not None:
        draw(lay.button, "#555555")
        canvas.itemconfigure("items", state="hidden")

    def on_click(event) -> None:
        if lay.button is not None and lay.button.contains(event.x, event.y) and not opened[0]:
            opened[0] = True
            canvas.itemconfigure("items", state="normal")
            record.add("open")
            return
        hit = [b.label for b in lay.targets if b.contains(event.x, event.y)] if opened[0] else []
        record.add(f"click {hit[0] if hit else 'none'}")

    canvas.bind("<Button-1>", on_click)
    root.protocol("WM_DELETE_WINDOW", lambda: None)  # never closed by the policy: no answer = a fault
    if lay.field is not None:
        f = lay.field
        text = tk.StringVar(root)
        entry = tk.Entry(root, textvariable=text, font=font, relief="solid", bd=2)
        entry.place(x=f.x, y=f.y, width=f.w, height=f.h)
        text.trace_add("write", lambda *_: record.set_field(text.get()))
        entry.focus_set()

    def ready() -> None:
        root.update_idletasks()
        if (root.winfo_rootx(), root.winfo_rooty(), root.winfo_width(), root.winfo_height()) != (
            0,
            0,
            lay.width,
            lay.height,
        ):
            root.after(20, ready)
            return
        root.title(TITLE)

    root.after(20, ready)

    def answer_sync() -> None:  # a reader's request: every event the X server sent so far handled first
        root.after(10, answer_sync)
        try:
            taken = f"{SYNC}.taken"
            os.replace(SYNC, taken)  # one request taken once, whatever a reader writes next
            with open(taken, encoding="utf-8") as f:
                nonce = f.read()
        except OSError:
            return
        root.winfo_pointerxy()  # a round trip: the events before its reply are in the queue now
        root.update()
        record.write()
        _write(ACK, nonce)

    root.after(10, answer_sync)
    root.mainloop()


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def read_record(record_path: str = RECORD, timeout_s: float = READ_TIMEOUT_S) -> str:
    """The app's record once the app has handled every event sent to it so far (see the module docstring).
    Raises TimeoutError when the app does not answer (it is not running)."""
    nonce = f"{os.getpid()}-{time.monotonic_ns()}"
    _write(SYNC, nonce)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(ACK, encoding="utf-8") as f:
                if f.read() == nonce:
                    with open(record_path, encoding="utf-8") as r:
                        return r.read()
        except OSError:
            pass
        time.sleep(0.01)  # the app answers within its next 10 ms tick
    raise TimeoutError(f"the targets app did not answer in {timeout_s:g} s (is it running?)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m guirl.vmpool.targets", description=__doc__.split("\n")[0])
    p.add_argument(
        "--read", action="store_true", help="print the running app's record (an evaluator's getter)"
    )
    p.add_argument("--kind", choices=KINDS)
    p.add_argument("--seed", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--height", type=int)
    p.add_argument("--labels", default="", help="comma-separated colours the targets are drawn from")
    p.add_argument("--goals", default="", help="comma-separated colours a goal is drawn from (default: any)")
    p.add_argument("--record", default=RECORD)
    args = p.parse_args(argv)
    if args.read:
        try:
            sys.stdout.write(read_record(args.record))
        except TimeoutError as exc:
            print(f"targets: {exc}", file=sys.stderr)
            return 1
        return 0
    if None in (args.kind, args.seed, args.width, args.height):
        p.error("--kind, --seed, --width and --height are required to start the app")
    try:
        labels = tuple(x for x in args.labels.split(",") if x) or None
        lay = layout(args.kind, args.seed, args.width, args.height, labels, parse_goals(args.goals or "any"))
    except ValueError as exc:
        print(f"targets: {exc}", file=sys.stderr)
        return 2
    run_app(lay, args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
