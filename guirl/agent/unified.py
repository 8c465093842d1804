"""GUI-R1's unified action space: its answer text parsed and rendered, its prompt, and the mapping to and
from guirl's typed desktop actions.

GUI-R1 (arXiv 2504.10458) trains one policy on mobile, desktop and web data with one answer format:
`<think> ... </think> <answer>[{'action': 'click', 'point': [x, y], 'input_text': 'no input text'}]</answer>`,
`point` in integer pixels of the image the model was shown, `[-100, -100]` for actions without one, and
`'no input text'` for none. The list is a Python literal; it is read with `json` and `ast.literal_eval`,
never `eval` (which GUI-R1's public format reward uses on model text).

`parse_answer` is strict for `format_ok` (exactly one think block, then one answer block, nothing else) and
tolerant for `actions` (the last answer block, a bare dict, float points), so accuracy can still be scored
on a response whose layout slipped, as GUI-R1's reward does.
"""

from __future__ import annotations

import ast
import json
import math
import warnings
from dataclasses import dataclass

from guirl.agent.actions import KEY_NAMES_MAX, AnyAction, Click, Done, Hotkey, Scroll, TypeText, Wait
from guirl.agent.parse import MAX_KEY_LEN, MAX_MODEL_COORD, MAX_TEXT, MAX_WAIT_S, normalize_key

# "close" is its own action, not an alias of navigate_back: GUI-R1's 'close/delete' label (a close or
# delete gesture on mobile) is a different label from 'press_back' in its data, and scoring one as the other
# would reward a wrong answer that GUI-R1's own reward scores 0.
UNIFIED_ACTIONS = (
    "click",
    "type",
    "scroll",
    "select",
    "press",
    "hotkey",
    "open_app",
    "navigate_back",
    "navigate_home",
    "close",
    "wait",
    "complete",
)
ALIASES: dict[str, str] = {
    "press_back": "navigate_back",
    "press_home": "navigate_home",
    "enter": "press",
    "press_enter": "press",
    "close/delete": "close",
    "finished": "complete",
    "swipe": "scroll",
}
"""Dataset and other models' action names to unified ones. `long_press` is left out on purpose: it opens a
context menu, so scoring it as a click would reward the wrong action."""
IMPLIED_KEYS = {"enter": "enter", "press_enter": "enter"}
"""Aliases that name their key: 'enter' is press with key "enter"."""
# A finger swiping up moves the content up, which is a scroll down (Android's `input swipe` sense).
_SWIPE_TO_SCROLL = {"up": "down", "down": "up", "left": "right", "right": "left"}

POINT_ACTIONS = frozenset({"click"})
"""Actions that need a point."""
POINTABLE = frozenset({"click", "type", "select", "scroll"})
"""Actions that may carry a point (type and select click it first; scroll scrolls there)."""
TEXT_ACTIONS = frozenset({"type", "select", "open_app"})
"""Actions that need free text."""
KEY_ACTIONS = frozenset({"press", "hotkey"})
"""Actions whose text is a key ("enter") or a chord ("ctrl+c")."""
SCROLL_DIRECTIONS = ("up", "down", "left", "right")
NO_INPUT_TEXT = "no input text"
NO_POINT = (-100, -100)
GUI_R1_HIGH = (
    "complete",
    "close/delete",
    "press_home",
    "click",
    "press_back",
    "type",
    "select",
    "scroll",
    "enter",
)
"""GUI-R1's dataset names for the full ("high") action set, as its prompt lists them."""
GUI_R1_LOW = ("click",)
MAX_NESTING = 8
"""A GUI-R1 answer nests 3 deep (list, dict, point); deeper text is refused before any parser sees it."""
SCROLL_CLICKS = 5
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_GUI_R1_NAMES = {"navigate_back": "press_back", "navigate_home": "press_home", "close": "close/delete"}


def canonical_action(name: str, input_text: str = "") -> tuple[str, str]:
    """A dataset's or model's (action, input_text) in unified terms; ValueError for an unknown action."""
    key = name.strip().lower()
    text = "" if input_text.strip().lower() == NO_INPUT_TEXT else input_text
    if key in UNIFIED_ACTIONS:
        return key, text
    if key not in ALIASES:
        raise ValueError(f"unknown action {name[:40]!r}")
    if key in IMPLIED_KEYS:
        return ALIASES[key], IMPLIED_KEYS[key]
    if key == "swipe":
        text = _SWIPE_TO_SCROLL.get(text.strip().lower(), text)
    return ALIASES[key], text


def key_chord(text: str) -> tuple[str, ...]:
    """Key names of "enter" or "ctrl+c" in pyautogui's spelling; a lone or trailing "+" is the plus key."""
    text = text.strip().lower()
    if text.endswith("++") or text == "+":
        parts = [*text[:-2].split("+"), "+"] if len(text) > 1 else ["+"]
    else:
        parts = text.split("+")
    names = tuple(normalize_key(p.strip()) if p != "+" else "+" for p in parts)
    if not names or len(names) > KEY_NAMES_MAX or not all(0 < len(n) <= MAX_KEY_LEN for n in names):
        raise ValueError(f"not a key or chord: {text[:40]!r}")
    return names


def normalize_input_text(action: str, text: str) -> str:
    """`text` checked and normalised for unified `action`: ValueError if that action cannot take it."""
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ValueError(f"{action}: input_text must be a string of at most {MAX_TEXT} characters")
    if text.strip().lower() == NO_INPUT_TEXT:
        raise ValueError(f"{action}: {NO_INPUT_TEXT!r} is GUI-R1's marker for no text; use ''")
    if action in TEXT_ACTIONS and not text.strip():
        raise ValueError(f"{action} needs input_text")
    if action == "scroll":
        text = text.strip().lower()
        if text not in SCROLL_DIRECTIONS:
            raise ValueError(f"scroll input_text must be one of {SCROLL_DIRECTIONS}, not {text[:40]!r}")
    elif action in KEY_ACTIONS:
        keys = key_chord(text)
        if action == "press" and len(keys) != 1:
            raise ValueError(f"press takes one key, not {text[:40]!r}; a chord is a hotkey")
        text = "+".join(keys)
    elif action == "wait" and text.strip():
        _wait_seconds(text)
    return text


@dataclass(frozen=True)
class UnifiedAction:
    """One action of the unified space; `point` is in pixels of the image the model was shown."""

    action: str
    point: tuple[float, float] | None = None
    input_text: str = ""

    def __post_init__(self) -> None:
        if self.action not in UNIFIED_ACTIONS:
            raise ValueError(f"not a unified action: {self.action!r} (canonical_action maps aliases)")
        if self.point is None:
            if self.action in POINT_ACTIONS:
                raise ValueError(f"{self.action} needs a point")
        elif self.action not in POINTABLE:
            raise ValueError(f"{self.action} takes no point")
        else:
            object.__setattr__(self, "point", _check_point(self.point))
        object.__setattr__(self, "input_text", normalize_input_text(self.action, self.input_text))


@dataclass(frozen=True)
class ParsedAnswer:
    """What a GUI-R1 response says: its actions, and whether its layout is the one the prompt asks for."""

    actions: list[UnifiedAction]
    has_think: bool
    has_answer: bool
    format_ok: bool
    error: str
    """Why `format_ok` is False, or why `actions` is empty ("" when neither); for logs."""


def parse_answer(text: str, *, max_chars: int = 20_000) -> ParsedAnswer:
    """The actions in a GUI-R1 response; never raises, never executes anything.

    `actions` come from the last `<answer>…</answer>` block (the decision after the reasoning; a model that
    quotes the prompt's template while thinking writes an earlier one), up to the first invalid entry."""
    if not isinstance(text, str):
        return ParsedAnswer([], False, False, False, f"response is a {type(text).__name__}, not text")
    if len(text) > max_chars:
        return ParsedAnswer([], False, False, False, f"response has {len(text)} characters (> {max_chars})")
    opened = text.find("<think>")
    has_think = opened >= 0 and text.find("</think>", opened) >= 0
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if start < 0:
        return ParsedAnswer([], has_think, False, False, "no <answer>...</answer>")
    problems = [] if _strict_layout(text) else ["not exactly <think>...</think> then <answer>...</answer>"]
    actions, answer_problems = _read_answer(text[start + len("<answer>") : end].strip())
    problems += answer_problems
    return ParsedAnswer(actions, has_think, True, not problems, "; ".join(problems))


def render_answer(actions: list[UnifiedAction], think: str = "") -> str:
    """GUI-R1's response text for `actions` (an SFT target), with GUI-R1's dataset names where they exist
    ('press_back', 'enter', ...) and points rounded to integers, as its prompt asks."""
    if not actions:
        raise ValueError("an answer needs at least one action")
    if any(tag in think for tag in _TAGS):
        raise ValueError("think text must not contain <think>/<answer> tags")
    items = ", ".join(_render_item(a) for a in actions)
    return f"<think> {think + ' ' if think else ''}</think> <answer>[{items}]</answer>"


def gui_r1_prompt(instruction: str, history: str, task_type: str = "high", *, image_marker: str = "") -> str:
    """GUI-R1's user prompt. The image goes where the caller puts its image part (before this text); pass
    `image_marker="<image>"` for GUI-R1's exact text, for a processor that swaps the marker for the image."""
    if task_type not in ("high", "low"):
        raise ValueError(f"task_type must be 'high' or 'low', not {task_type!r}")
    space = "[" + ", ".join(repr(a) for a in (GUI_R1_HIGH if task_type == "high" else GUI_R1_LOW)) + "]"
    screenshot = f"In this UI screenshot {image_marker}," if image_marker else "In this UI screenshot,"
    history = history if history.strip() else "None"
    lines = [
        f"You are GUI-R1, a reasoning GUI Agent Assistant. {screenshot} I want you to continue executing the "
        f"command '{instruction}', with the action history being '{history}'.",
        f"Please provide the action to perform (enumerate from {space}), the point where the cursor is moved "
        "to (integer) if a click is performed, and any input text required to complete the action.",
        "Output the thinking process in <think> </think> tags, and the final answer in <answer> </answer> "
        "tags as follows:",
    ]
    click = "[{'action': enum['click'], 'point': [123, 300], 'input_text': 'no input text'}]"
    if task_type == "low":  # GUI-R1's own low prompt, its spelling ("enum[ 'click']") kept
        lines += [
            "<think> ... </think> <answer>[{'action': enum[ 'click'], 'point': [x, y], "
            "'input_text': 'no input text'}]</answer>",
            "Example:",
            click,
            "",
        ]
        return "\n".join(lines)
    no_point = "'point': [-100, -100]"
    lines += [
        f"<think> ... </think> <answer>[{{'action': enum{space}, 'point': [x, y], "
        "'input_text': 'no input text [default]'}]</answer>",
        "Note:",
        " specific input text (no default) is necessary for actions enum['type', 'select', 'open_app'] ",
        "for action enum['scroll'], input_text must be enum['up', 'left', 'right', 'down'].",
        "Example:",
        "[{'action': enum['complete', 'close/delete', 'press_home', 'press_back', 'enter'], "
        f"{no_point}, 'input_text': 'no input text'}}]",
        click,
        f"[{{'action': enum['type', 'select'], {no_point}, 'input_text': 'shanghai shopping mall'}}]",
        f"[{{'action': enum['scroll'], {no_point}, 'input_text': enum['up', 'left', 'right', 'down']}}]",
    ]
    return "\n".join(lines)


def to_typed(u: UnifiedAction, *, image_size: tuple[int, int], screen: tuple[int, int]) -> list[AnyAction]:
    """Typed desktop actions for `u`, points scaled from image to screen pixels and clamped on screen.

    type/select with a point click it first (focus). select then types the option and presses Enter: the
    click opened the list, type-ahead finds the option, Enter commits it. Without a point select only types
    (type-ahead on a focused closed list; Enter there could submit the form). navigate_back is alt+left
    (browser and file-manager Back); navigate_home is the Super key (the start menu / overview, the
    desktop's home). open_app and close have no faithful desktop equivalent: ValueError."""
    at = None if u.point is None else _to_screen(u.point, image_size, screen)
    focus: list[AnyAction] = [] if at is None else [Click(x=at[0], y=at[1])]
    match u.action:
        case "click":
            return focus
        case "type":
            return [*focus, TypeText(text=u.input_text)]
        case "select":
            enter: list[AnyAction] = [Hotkey(keys=["enter"])] if focus else []
            return [*focus, TypeText(text=u.input_text), *enter]
        case "scroll":
            amount = SCROLL_CLICKS if u.input_text in ("up", "right") else -SCROLL_CLICKS
            x, y = at if at is not None else (None, None)
            return [Scroll(amount=amount, horizontal=u.input_text in ("left", "right"), x=x, y=y)]
        case "press" | "hotkey":
            return [Hotkey(keys=list(key_chord(u.input_text)))]
        case "navigate_back":
            return [Hotkey(keys=["alt", "left"])]
        case "navigate_home":
            return [Hotkey(keys=["win"])]
        case "wait":
            return [Wait(seconds=_wait_seconds(u.input_text) if u.input_text.strip() else 1.0)]
        case "complete":
            return [Done()]
    raise ValueError(f"{u.action} has no desktop equivalent (not on a desktop)")


def from_typed(a: AnyAction, *, image_size: tuple[int, int], screen: tuple[int, int]) -> UnifiedAction:
    """The unified action for a typed one, points scaled from screen to image pixels (unrounded).

    Only a left single click is a click; a hotkey stays a press/hotkey (alt+left is not read back as
    navigate_back: a typed action does not carry that intent). Other types raise ValueError naming them."""
    match a:
        case Click(x=x, y=y, button="left", clicks=1):
            return UnifiedAction("click", _to_image((x, y), image_size, screen))
        case TypeText(text=text):
            return UnifiedAction("type", None, text)
        case Scroll(amount=amount, horizontal=horizontal, x=x, y=y) if amount != 0:
            sign = amount > 0
            direction = ("right" if sign else "left") if horizontal else ("up" if sign else "down")
            point = None if x is None or y is None else _to_image((x, y), image_size, screen)
            return UnifiedAction("scroll", point, direction)
        case Hotkey(keys=keys):
            return UnifiedAction("press" if len(keys) == 1 else "hotkey", None, "+".join(keys))
        case Wait(seconds=seconds):
            return UnifiedAction("wait", None, f"{seconds:g}")
        case Done():
            return UnifiedAction("complete")
    raise ValueError(f"{type(a).__name__} has no unified action: {a!r}")


# --- parsing helpers -----------------------------------------------------------------------------


def _strict_layout(text: str) -> bool:
    s = text.strip()
    if any(s.count(tag) != 1 for tag in _TAGS) or not (s.startswith("<think>") and s.endswith("</answer>")):
        return False
    think_end, answer = s.index("</think>"), s.index("<answer>")
    return think_end < answer and not s[think_end + len("</think>") : answer].strip()


def _read_answer(content: str) -> tuple[list[UnifiedAction], list[str]]:
    """The answer's actions (up to the first invalid one) and every way it breaks the strict format."""
    value, why = _literal(content)
    if why:
        return [], [why]
    problems = []
    if isinstance(value, dict):
        value, problems = [value], ["answer is a dict, not a list of dicts"]
    if not isinstance(value, list):
        return [], [f"answer is a {type(value).__name__}, not a list of actions"]
    if not value:
        return [], ["answer is an empty list"]
    actions = []
    for i, item in enumerate(value):
        action, item_problems = _read_item(i, item)
        problems += item_problems
        if action is None:
            break
        actions.append(action)
    return actions, problems


def _literal(content: str) -> tuple[object, str]:
    if not content:
        return None, "empty answer"
    if _nesting(content) > MAX_NESTING:
        return None, f"answer nests deeper than {MAX_NESTING}"
    try:
        return json.loads(content), ""
    except (ValueError, RecursionError):
        pass
    try:
        # the compiler warns about odd literals in model text ("invalid decimal literal"): that text is
        # only being read, and a warning per answer would flood a worker's log
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return ast.literal_eval(content), ""
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
        return None, f"answer is not a Python or JSON literal ({type(e).__name__})"


def _nesting(s: str) -> int:
    """How deep brackets nest outside string literals, in one pass (no recursion to exhaust)."""
    depth = deepest = 0
    quote, escaped = "", False
    for ch in s:
        if quote:
            escaped, quote = (False, quote) if escaped else (ch == "\\", "" if ch == quote else quote)
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]})":
            depth -= 1
    return deepest


def _read_item(i: int, item: object) -> tuple[UnifiedAction | None, list[str]]:
    if not isinstance(item, dict):
        return None, [f"action {i} is a {type(item).__name__}, not a dict"]
    missing = [k for k in ("action", "point", "input_text") if k not in item]
    problems = [f"action {i} lacks {', '.join(missing)}"] if missing else []
    name, text, raw_point = item.get("action"), item.get("input_text", ""), item.get("point")
    if not isinstance(name, str) or not isinstance(text, str):
        return None, [*problems, f"action {i}: action and input_text must be strings"]
    try:
        action, text = canonical_action(name, text)
        point, exact = _read_point(raw_point)
        if not exact:
            problems.append(f"action {i}: point is not two integers")
        if action not in POINTABLE:
            point = None  # GUI-R1 answers [-100, -100] here; any other point means nothing
        return UnifiedAction(action, point, text), problems
    except ValueError as e:
        return None, [*problems, f"action {i}: {e}"]


def _read_point(raw: object) -> tuple[tuple[float, float] | None, bool]:
    """The point (None for none or [-100, -100]) and whether it was written as two integers."""
    if raw is None:
        return None, True
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        raise ValueError(f"point must be [x, y], not {str(raw)[:40]!r}")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in raw):
        raise ValueError(f"point must be two numbers, not {str(raw)[:40]!r}")
    exact = all(isinstance(v, int) for v in raw)
    if tuple(raw) == NO_POINT:
        return None, exact
    return _check_point(raw), exact


def _check_point(point: object) -> tuple[float, float]:
    if not isinstance(point, list | tuple) or len(point) != 2:
        raise ValueError(f"point must be (x, y), not {point!r}")
    try:
        x, y = float(point[0]), float(point[1])
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"point must be two numbers, not {str(point)[:40]!r}") from None
    if not (math.isfinite(x) and math.isfinite(y)) or max(abs(x), abs(y)) > MAX_MODEL_COORD:
        raise ValueError(f"point {str(point)[:40]} is not finite or beyond {MAX_MODEL_COORD}")
    if (round(x), round(y)) == NO_POINT:
        raise ValueError(f"{NO_POINT} is GUI-R1's marker for no point; use None")
    return x, y


def _wait_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"wait input_text must be seconds, not {text[:40]!r}") from None
    if not 0 <= seconds <= MAX_WAIT_S:
        raise ValueError(f"wait must be 0..{MAX_WAIT_S} s, not {text[:40]!r}")
    return seconds


def _render_item(a: UnifiedAction) -> str:
    name, text = _GUI_R1_NAMES.get(a.action, a.action), a.input_text
    if a.action == "press" and text == "enter":
        name, text = "enter", ""
    x, y = NO_POINT if a.point is None else (round(a.point[0]), round(a.point[1]))
    # str.__repr__ quotes any text as a literal that ast.literal_eval reads back exactly.
    return (
        f"{{'action': {str.__repr__(name)}, 'point': [{x}, {y}], "
        f"'input_text': {str.__repr__(text or NO_INPUT_TEXT)}}}"
    )


# --- coordinates ---------------------------------------------------------------------------------


def _to_screen(
    point: tuple[float, float], image: tuple[int, int], screen: tuple[int, int]
) -> tuple[int, int]:
    (w, h), (sw, sh) = _sizes(image, screen)
    x, y = round(point[0] * sw / w), round(point[1] * sh / h)
    return min(max(x, 0), sw - 1), min(max(y, 0), sh - 1)


def _to_image(point: tuple[int, int], image: tuple[int, int], screen: tuple[int, int]) -> tuple[float, float]:
    (w, h), (sw, sh) = _sizes(image, screen)
    return point[0] * w / sw, point[1] * h / sh


def _sizes(image: tuple[int, int], screen: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    if min(*image, *screen) <= 0:
        raise ValueError(f"image {image} and screen {screen} must be positive sizes")
    return image, screen
