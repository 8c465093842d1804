"""Typed actions back to policy text: what the scripted engine answers with, and the `Action:` summaries.

`render_response` is the inverse of `guirl.agent.parse.parse_response` (up to the coordinate grid's
rounding): a response it renders parses back to the same actions.
"""

from __future__ import annotations

import json
from typing import Any

from guirl.agent.actions import (
    AnyAction,
    Click,
    Done,
    Drag,
    DragTo,
    Fail,
    Hotkey,
    MoveTo,
    Scroll,
    TypeText,
    Wait,
)
from guirl.agent.parse import _CLOSE, _OPEN, _THINK_END, TOOL_NAME, Coordinates, _Frame

_CLICK_ACTIONS = {
    ("left", 1): "left_click",
    ("left", 2): "double_click",
    ("left", 3): "triple_click",
    ("right", 1): "right_click",
    ("middle", 1): "middle_click",
}


def render_response(
    actions: list[AnyAction],
    *,
    screen: tuple[int, int],
    coordinates: Coordinates,
    image_size: tuple[int, int] | None = None,
    thought: str = "",
) -> str:
    """A model-style response performing `actions` (the inverse of `parse_response`, up to the coordinate
    grid's rounding); `thought` goes first in a `<think>` block. Raises ValueError for an action the tool
    cannot express (a non-left drag, a multiple right or middle click)."""
    if not actions:
        raise ValueError("nothing to render")
    if _THINK_END in thought or _OPEN in thought:
        raise ValueError("a thought cannot contain </think> or <tool_call>")
    frame = _Frame(screen, coordinates, image_size)
    calls = [call for action in actions for call in _to_calls(action, frame)]
    lines = [f"<think>\n{thought}\n</think>\n"] if thought else []
    summary = "; then ".join(describe(a) for a in actions)
    if _OPEN in summary or _THINK_END in summary:  # typed text quoted in the line must not open a call
        summary = summary.replace("<", "\\u003c")
    lines.append("Action: " + summary)
    for call in calls:
        body = json.dumps({"name": TOOL_NAME, "arguments": call}, ensure_ascii=False)
        lines.append(f"{_OPEN}\n{body}\n{_CLOSE}")
    return "\n".join(lines)


def _to_calls(action: AnyAction, frame: _Frame) -> list[dict[str, Any]]:
    match action:
        case Click(x=x, y=y, button=b, clicks=n):
            if (b, n) not in _CLICK_ACTIONS:
                raise ValueError(f"computer_use has no {n}-fold {b} click")
            return [{"action": _CLICK_ACTIONS[b, n], "coordinate": frame.to_model(x, y)}]
        case MoveTo(x=x, y=y):
            return [{"action": "mouse_move", "coordinate": frame.to_model(x, y)}]
        case Drag(x=x, y=y, to_x=tx, to_y=ty, button="left"):
            return [
                {"action": "mouse_move", "coordinate": frame.to_model(x, y)},
                {"action": "left_click_drag", "coordinate": frame.to_model(tx, ty)},
            ]
        case DragTo(to_x=tx, to_y=ty, button="left"):
            return [{"action": "left_click_drag", "coordinate": frame.to_model(tx, ty)}]
        case Drag() | DragTo():
            raise ValueError("computer_use drags with the left button only")
        case Scroll(amount=a, horizontal=h, x=x, y=y):
            call: dict[str, Any] = {"action": "hscroll" if h else "scroll", "pixels": a}
            if x is not None and y is not None:
                call["coordinate"] = frame.to_model(x, y)
            return [call]
        case TypeText(text=text):
            return [{"action": "type", "text": text}]
        case Hotkey(keys=keys):
            return [{"action": "key", "keys": list(keys)}]
        case Wait(seconds=s):
            return [{"action": "wait", "time": s}]
        case Done():
            return [{"action": "terminate", "status": "success"}]
        case Fail():
            return [{"action": "terminate", "status": "failure"}]
    raise TypeError(f"not an action: {action!r}")


def describe(action: AnyAction) -> str:
    """A short one-line human summary of an action (screen pixels), as an `Action:` line says it."""
    match action:
        case Click(x=x, y=y, button=b, clicks=n):
            verb = {1: "Click", 2: "Double-click", 3: "Triple-click"}.get(n, f"Click {n} times")
            return f"{verb}{'' if b == 'left' else f' the {b} button'} at ({x}, {y})"
        case MoveTo(x=x, y=y):
            return f"Move the pointer to ({x}, {y})"
        case Drag(x=x, y=y, to_x=tx, to_y=ty):
            return f"Drag from ({x}, {y}) to ({tx}, {ty})"
        case DragTo(to_x=tx, to_y=ty):
            return f"Drag to ({tx}, {ty})"
        case Scroll(amount=a, horizontal=h, x=x, y=y):
            way = ("right" if a > 0 else "left") if h else ("up" if a > 0 else "down")
            return f"Scroll {way} {abs(a)}" + (f" at ({x}, {y})" if x is not None and y is not None else "")
        case TypeText(text=text):
            shown = text if len(text) <= 40 else text[:40] + "..."
            return f"Type {json.dumps(shown, ensure_ascii=False)}"  # JSON quoting keeps it one line
        case Hotkey(keys=keys):
            return f"Press {'+'.join(keys)}"
        case Wait(seconds=s):
            return f"Wait {s:g} s"
        case Done():
            return "Finish: the task is done"
        case Fail():
            return "Give up: the task cannot be done"
    raise TypeError(f"not an action: {action!r}")
