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


def to_pyautogui(action: AnyAction) -> str:
    """The pyautogui program equivalent to `action`, for a VM that only offers OSWorld's `/execute`.

    Every value is written by a base type's own `repr` (an int, a finite float, a string literal), so the
    program is exactly the intended call: text can never break out of its literal. Types are checked here,
    not trusted, because a Struct built in Python (rather than decoded) is not validated."""
    match action:
        case Click(x=x, y=y, button=b, clicks=n):
            return f"pyautogui.click({_int(x)}, {_int(y)}, clicks={_int(n)}, button={_str(b)})"
        case MoveTo(x=x, y=y):
            return f"pyautogui.moveTo({_int(x)}, {_int(y)})"
        case Drag(x=x, y=y, to_x=tx, to_y=ty, button=b):
            return (
                f"pyautogui.moveTo({_int(x)}, {_int(y)}); "
                f"pyautogui.dragTo({_int(tx)}, {_int(ty)}, duration=0.2, button={_str(b)})"
            )
        case DragTo(to_x=tx, to_y=ty, button=b):
            return f"pyautogui.dragTo({_int(tx)}, {_int(ty)}, duration=0.2, button={_str(b)})"
        case Scroll(amount=a, horizontal=h, x=x, y=y):
            fn = "hscroll" if h else "scroll"
            at = f", x={_int(x)}, y={_int(y)}" if x is not None and y is not None else ""
            return f"pyautogui.{fn}({_int(a)}{at})"
        case TypeText(text=text):
            return f"pyautogui.write({_str(text)}, interval=0.0)"
        case Hotkey(keys=keys):
            return f"pyautogui.hotkey({', '.join(_str(k) for k in keys)})"
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
