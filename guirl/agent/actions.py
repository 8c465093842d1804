"""The typed action space: what an agent can do on a desktop, as data.

Model text is parsed into these (never executed); a VM executes them directly (`/action`), and for a VM
that only speaks OSWorld's `/execute`, `to_pyautogui` composes the equivalent pyautogui call with safe
quoting. Coordinates are screen pixels.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

Coord = Annotated[int, Meta(ge=0, le=65535)]
Button = Literal["left", "right", "middle"]
KEY_NAMES_MAX = 8


class Action(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every typed action."""


class Click(Action, tag="click"):
    """Press and release a mouse button `clicks` times at (x, y)."""

    x: Coord
    y: Coord
    button: Button = "left"
    clicks: Annotated[int, Meta(ge=1, le=3)] = 1


class MoveTo(Action, tag="move"):
    """Move the pointer to (x, y)."""

    x: Coord
    y: Coord


class Drag(Action, tag="drag"):
    """Press at (x, y), move to (to_x, to_y), release."""

    x: Coord
    y: Coord
    to_x: Coord
    to_y: Coord
    button: Button = "left"


class DragTo(Action, tag="drag_to"):
    """Press where the pointer is, move to (to_x, to_y), release (Qwen's `left_click_drag`)."""

    to_x: Coord
    to_y: Coord
    button: Button = "left"


class Scroll(Action, tag="scroll"):
    """Scroll `amount` clicks (positive = up/right) at (x, y), or where the pointer is."""

    amount: Annotated[int, Meta(ge=-100, le=100)]
    horizontal: bool = False
    x: Coord | None = None
    y: Coord | None = None


class TypeText(Action, tag="type"):
    """Type text as keystrokes (newlines press Enter)."""

    text: Annotated[str, Meta(max_length=10_000)]


class Hotkey(Action, tag="key"):
    """Press keys together and release them in reverse order, e.g. ["ctrl", "s"]; one key is a key press."""

    keys: Annotated[list[Annotated[str, Meta(min_length=1, max_length=32)]], Meta(min_length=1, max_length=8)]


class Wait(Action, tag="wait"):
    """Do nothing for `seconds`."""

    seconds: Annotated[float, Meta(ge=0, le=60)] = 1.0


class Done(Action, tag="done"):
    """The agent says the task is complete."""


class Fail(Action, tag="fail"):
    """The agent says the task cannot be done (OSWorld's FAIL: how infeasible tasks are solved)."""


AnyAction = Click | MoveTo | Drag | DragTo | Scroll | TypeText | Hotkey | Wait | Done | Fail
"""Every typed action; decode with `msgspec.json.decode(data, type=AnyAction)`."""

TERMINAL = (Done, Fail)
"""Actions that end an episode."""


PYAUTOGUI_PRELUDE = """\
import sys, time
import pyautogui
pyautogui.FAILSAFE = False
pyautogui.PAUSE = 0
def _refuse(reason):
    print(reason, file=sys.stderr)
    raise SystemExit(3)
def _on_screen(**point):
    w, h = pyautogui.size()
    for name, v in point.items():
        if not 0 <= v < (w if name.endswith('x') else h):
            _refuse(f'{name}={v} is off the {w}x{h} screen')
def _hotkey(*keys):
    unknown = [k for k in keys if not pyautogui.isValidKey(k.lower())]
    if unknown:
        _refuse(f'unknown key name(s) {unknown}')
    pyautogui.hotkey(*[k.lower() for k in keys])
def _write(text):
    pieces = text.split('<')
    for i, piece in enumerate(pieces):
        if piece:
            pyautogui.write(piece, interval=0.0)
        if i < len(pieces) - 1:
            pyautogui.hotkey('shift', ',')
"""
"""The fixed head of every program `to_pyautogui` writes. It refuses what guirl's `/action` refuses (a point
off the screen, a key name pyautogui does not know: pyautogui itself would clamp the one and drop the
other) by exiting with status `PYAUTOGUI_REFUSED` and the reason on stderr, and types `<` as shift+comma
(pyautogui types it as `>` on X, which OSWorld's own host also rewrites). It holds no value of the action:
those follow it, as literals."""


PYAUTOGUI_REFUSED = 3
"""Exit status of a `to_pyautogui` program that refused its action (any other failure is the VM's)."""


def to_pyautogui(action: AnyAction) -> str:
    """The pyautogui program equivalent to `action`, for a VM that only offers OSWorld's `/execute`.

    The program is `PYAUTOGUI_PRELUDE` followed by calls whose every argument is written by a base type's
    own `repr` (an int, a finite float, a string literal), so it is exactly the intended call: text can
    never break out of its literal. Types are checked here, not trusted, because a Struct built in Python
    (rather than decoded) is not validated."""
    return PYAUTOGUI_PRELUDE + _action_calls(action)


def _xy(**point: object) -> str:
    return "_on_screen(" + ", ".join(f"{k}={_int(v)}" for k, v in point.items()) + ")\n"


def _action_calls(action: AnyAction) -> str:
    match action:
        case Click(x=x, y=y, button=b, clicks=n):
            interval = ", interval=0.05" if _int(n) != "1" else ""
            return (
                _xy(x=x, y=y)
                + f"pyautogui.click({_int(x)}, {_int(y)}, clicks={_int(n)}{interval}, button={_str(b)})"
            )
        case MoveTo(x=x, y=y):
            return _xy(x=x, y=y) + f"pyautogui.moveTo({_int(x)}, {_int(y)})"
        case Drag(x=x, y=y, to_x=tx, to_y=ty, button=b):
            return (
                _xy(x=x, y=y, to_x=tx, to_y=ty)
                + f"pyautogui.moveTo({_int(x)}, {_int(y)})\n"
                + f"pyautogui.dragTo({_int(tx)}, {_int(ty)}, duration=0.2, button={_str(b)})"
            )
        case DragTo(to_x=tx, to_y=ty, button=b):
            return (
                _xy(to_x=tx, to_y=ty)
                + f"pyautogui.dragTo({_int(tx)}, {_int(ty)}, duration=0.2, button={_str(b)})"
            )
        case Scroll(amount=a, horizontal=h, x=x, y=y):
            fn = "hscroll" if h else "scroll"
            if x is not None and y is not None:
                return _xy(x=x, y=y) + f"pyautogui.{fn}({_int(a)}, x={_int(x)}, y={_int(y)})"
            # one coordinate alone is checked, as /action checks it, and scrolls where the pointer is
            given = {k: v for k, v in (("x", x), ("y", y)) if v is not None}
            return (_xy(**given) if given else "") + f"pyautogui.{fn}({_int(a)})"
        case TypeText(text=text):
            return f"_write({_str(text)})"
        case Hotkey(keys=keys):
            return f"_hotkey({', '.join(_str(k) for k in keys)})"
        case Wait(seconds=s):
            return f"time.sleep({_float(s)})"
        case Done() | Fail():
            return "pass"
    raise TypeError(f"not an action: {action!r}")


def _int(value: object) -> str:
    # int.__repr__ ignores a subclass's __repr__; a non-int (a str in a coordinate) raises TypeError.
    return int.__repr__(value)  # type: ignore[arg-type]


def _float(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"not a finite number: {value!r}")  # nan and inf would be names, not literals
    return float.__repr__(float(value))


def _str(value: object) -> str:
    return str.__repr__(value)  # type: ignore[arg-type]
