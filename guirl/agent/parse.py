"""The policy's text to typed actions (`parse_response`); `guirl.agent.render` goes the other way.

A response is an `Action: <summary>` line and one or more `<tool_call>{"name": "computer_use",
"arguments": {...}}</tool_call>` blocks (Qwen's computer_use format; see `guirl.agent.prompt`). Parsing is
strict about values (a coordinate that is not a finite number is an error, never a guess) and lenient about
layout (a missing closing tag at the end, a bare JSON line, a `<think>` block first).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from guirl.agent.actions import (
    KEY_NAMES_MAX,
    TERMINAL,
    AnyAction,
    Button,
    Click,
    Done,
    DragTo,
    Fail,
    Hotkey,
    MoveTo,
    Scroll,
    TypeText,
    Wait,
)

ParseCode = Literal[
    "empty", "no_tool_call", "bad_json", "wrong_tool", "unknown_action", "bad_arguments", "too_many_calls"
]
"""Why a response failed to parse. `parse_response` never raises `too_many_calls` (it keeps the first
`max_calls` and counts the rest); the code is for callers that refuse such responses outright."""
Coordinates = Literal["relative", "absolute"]

TOOL_NAME = "computer_use"
GRID = 999
"""Relative coordinates run 0..999 on each screen axis (the prompt says 1000x1000), mapped as x * W / 999."""
MAX_MODEL_COORD = 100_000
"""A coordinate beyond this is garbage, not a near miss to clamp."""
MAX_TEXT = 10_000
MAX_KEY_LEN = 32
MAX_SCROLL = 100
MAX_WAIT_S = 60.0
_EXCERPT = 200
_OPEN, _CLOSE, _THINK_END = "<tool_call>", "</tool_call>", "</think>"
# The `Action:` summary, found line by line in linear time: one MULTILINE regex over the whole response
# (`^[\s*#>-]*action[\s*]*:[\s*]*(.*?)\s*$`) backtracks quadratically on runs of blank or dashed lines,
# and a degenerate response of 64 KB of them blocked the worker's event loop for seconds.
_ACTION_HEAD = re.compile(r"[\s*#>-]*action[\s*]*:", re.IGNORECASE)
_SKIP_GAP = re.compile(r"[\s*]*")
_DECODER = json.JSONDecoder()
_END = object()
_KEY_ALIASES = {
    **dict.fromkeys(["return"], "enter"),
    **dict.fromkeys(["control", "ctl"], "ctrl"),
    **dict.fromkeys(["cmd", "command", "super", "meta", "windows"], "win"),
    **dict.fromkeys(["pgup", "page_up"], "pageup"),
    **dict.fromkeys(["pgdn", "page_down"], "pagedown"),
    **{f"arrow{d}": d for d in ("up", "down", "left", "right")},
    "escape": "esc",
    "option": "alt",
    "del": "delete",
    "spacebar": "space",
    " ": "space",
}


class ParseError(ValueError):
    """The response could not be turned into actions; `code` says why, the message shows an excerpt."""

    def __init__(self, code: ParseCode, message: str, excerpt: str | None = None) -> None:
        if excerpt is not None:
            clipped = excerpt[:_EXCERPT] + ("..." if len(excerpt) > _EXCERPT else "")
            message = f"{message}: {clipped!r}"
        super().__init__(message)
        self.code: ParseCode = code


@dataclass
class ParsedResponse:
    """The actions of one response, in order; `calls[i]` is the tool-call arguments `actions[i]` came from."""

    action_line: str
    """The summary after `Action:` ("" when the response had none)."""
    actions: list[AnyAction]
    calls: list[dict[str, Any]]
    dropped_calls: int = 0
    """Tool calls ignored: past `max_calls`, or after a terminate."""


@dataclass
class _Frame:
    """What maps model coordinates to screen pixels, plus the pointer as this response has moved it."""

    screen: tuple[int, int]
    coordinates: Coordinates
    image_size: tuple[int, int] | None
    pointer: tuple[int, int] | None = field(default=None)

    def scale(self) -> tuple[float, float]:
        """Model units per screen pixel on each axis."""
        w, h = self.screen
        if self.coordinates == "relative":
            return GRID / w, GRID / h
        if self.coordinates != "absolute":
            raise ValueError(f"coordinates must be 'relative' or 'absolute', got {self.coordinates!r}")
        iw, ih = self.image_size or self.screen  # no image size: the model saw the screen unscaled
        return iw / w, ih / h

    def to_screen(self, x: float, y: float) -> tuple[int, int]:
        sx, sy = self.scale()
        w, h = self.screen
        return min(max(round(x / sx), 0), w - 1), min(max(round(y / sy), 0), h - 1)

    def to_model(self, x: int, y: int) -> list[int]:
        sx, sy = self.scale()
        iw, ih = (GRID + 1, GRID + 1) if self.coordinates == "relative" else (self.image_size or self.screen)
        return [min(max(round(x * sx), 0), iw - 1), min(max(round(y * sy), 0), ih - 1)]


Handler = Callable[[dict[str, Any], "_Frame"], AnyAction]


# --- parsing ---------------------------------------------------------------------------------------------


def parse_response(
    text: str,
    *,
    screen: tuple[int, int],
    coordinates: Coordinates,
    image_size: tuple[int, int] | None = None,
    max_calls: int = 5,
) -> ParsedResponse:
    """Typed actions of a model response, with coordinates mapped to `screen` pixels and clamped onto it.

    `image_size` is the (width, height) of the screenshot the model saw (for `absolute` coordinates).
    Raises `ParseError`."""
    if max_calls < 1:
        raise ValueError(f"max_calls must be at least 1, got {max_calls}")
    frame = _Frame(screen, coordinates, image_size)
    frame.scale()  # reject a bad `coordinates` before looking at the text
    body = _strip_think(text or "")
    if not body.strip():
        raise ParseError("empty", "the response is empty")
    first = body.find(_OPEN)
    calls_iter = _tool_call_blocks(body, first) if first != -1 else _json_lines(body)
    action_line = _action_line(body[: first if first != -1 else len(body)])
    parsed = ParsedResponse(action_line=action_line, actions=[], calls=[])
    while True:
        # Check before decoding the next call, so a broken call past the limit is dropped, not an error.
        if len(parsed.actions) >= max_calls or (parsed.actions and isinstance(parsed.actions[-1], TERMINAL)):
            parsed.dropped_calls = _count_rest(calls_iter)
            break
        obj = next(calls_iter, _END)
        if obj is _END:
            break
        args = _arguments(obj)
        parsed.actions.append(_to_action(args, frame))
        parsed.calls.append(args)
    if not parsed.actions:
        raise ParseError("no_tool_call", "no computer_use tool call found", body)
    return parsed


def _action_line(text: str) -> str:
    """The summary after the first line that starts with `Action:` (markdown decoration allowed); an empty
    summary continues on the next non-blank line, as "Action:\nClick OK" is written. "" when none."""
    pos = 0
    for line in text.split("\n"):
        head = _ACTION_HEAD.match(line)
        if head is not None:
            start = _SKIP_GAP.match(text, pos + head.end()).end()
            end = text.find("\n", start)
            return text[start : end if end != -1 else len(text)].rstrip()
        pos += len(line) + 1
    return ""


def _strip_think(text: str) -> str:
    # A thinking model's thought ends at its first </think> (the chat template opens it), before any answer.
    end = text.find(_THINK_END)
    return text[end + len(_THINK_END) :] if end != -1 else text


def _tool_call_blocks(body: str, pos: int) -> Iterator[Any]:
    """The JSON value of each `<tool_call>` block from `pos`, decoded lazily (so calls past the limit that
    are broken are counted, not errors). Decoding the JSON, not searching for `</tool_call>`, finds a
    block's end, so the closing tag inside a string argument is harmless."""
    while pos != -1:
        start = pos + len(_OPEN)
        try:
            obj, end = _DECODER.raw_decode(body, _skip_ws(body, start))
        except (ValueError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise ParseError("bad_json", f"a tool call is not valid JSON ({reason})", body[start:]) from None
        end = _skip_ws(body, end)
        if body.startswith(_CLOSE, end):
            end += len(_CLOSE)
        elif end < len(body):  # only the end of the text may stand in for the closing tag
            raise ParseError("bad_json", "text after a tool call's JSON before </tool_call>", body[end:])
        yield obj
        pos = body.find(_OPEN, end)


def _json_lines(body: str) -> Iterator[Any]:
    """Tool calls written as bare one-line JSON objects (no tags), as OpenClaw-RL's GUI-RL tolerates."""
    broken = None
    found = False
    for line in body.splitlines():
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            broken = broken or line
            continue
        if isinstance(obj, dict) and ("action" in obj or ("name" in obj and "arguments" in obj)):
            found = True
            yield obj
    if broken is not None and not found:
        raise ParseError("bad_json", "a JSON line is not valid JSON", broken)


def _count_rest(calls: Iterator[Any]) -> int:
    n = 0
    try:
        for _ in calls:
            n += 1
    except ParseError:
        n += 1  # a broken block past the limit still counts as one dropped call
    return n


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _arguments(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ParseError("bad_json", f"a tool call must be a JSON object, got {type(obj).__name__}")
    if "name" not in obj and "arguments" not in obj:
        return obj  # the bare {"action": ...} form
    name = obj.get("name")
    if name != TOOL_NAME:
        raise ParseError("wrong_tool", f"unknown tool (only {TOOL_NAME} exists)", repr(name))
    args = obj.get("arguments")
    if isinstance(args, str):  # OpenAI-style arguments: a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            raise ParseError("bad_arguments", "arguments are a string that is not JSON", args) from None
    if not isinstance(args, dict):
        raise ParseError("bad_arguments", "arguments must be a JSON object", repr(args))
    return args


def _to_action(args: dict[str, Any], frame: _Frame) -> AnyAction:
    name = args.get("action")
    if name is None:
        raise ParseError("bad_arguments", "the arguments have no action")
    if not isinstance(name, str) or name.strip().lower() not in _HANDLERS:
        raise ParseError("unknown_action", "unknown computer_use action", repr(name))
    return _HANDLERS[name.strip().lower()](args, frame)


def _bad(message: str, value: Any) -> ParseError:
    return ParseError("bad_arguments", message, repr(value))


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"{what} must be a number", value)
    try:
        f = float(value)
    except OverflowError:
        raise _bad(f"{what} is out of range", value) from None
    if not math.isfinite(f):
        raise _bad(f"{what} must be finite", value)
    return f


def _point(args: dict[str, Any], frame: _Frame) -> tuple[int, int]:
    """The call's coordinate in screen pixels, or, without one, where this response left the pointer."""
    at = _maybe_point(args, frame)
    if at is None:
        if frame.pointer is None:  # the pointer's position before this response is not known here
            raise _bad(f"{args.get('action')} needs a coordinate", args)
        at = frame.pointer
    return at


def _maybe_point(args: dict[str, Any], frame: _Frame) -> tuple[int, int] | None:
    value = args.get("coordinate")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise _bad("coordinate must be [x, y]", value)
    x, y = (_number(v, "coordinate") for v in value)
    if max(abs(x), abs(y)) > MAX_MODEL_COORD:
        raise _bad("coordinate is out of range", value)
    frame.pointer = frame.to_screen(x, y)
    return frame.pointer


def _click(button: Button, clicks: int = 1) -> Handler:
    def make(args: dict[str, Any], frame: _Frame) -> AnyAction:
        x, y = _point(args, frame)
        return Click(x=x, y=y, button=button, clicks=clicks)

    return make


def _move(args: dict[str, Any], frame: _Frame) -> AnyAction:
    x, y = _point(args, frame)
    return MoveTo(x=x, y=y)


def _drag(args: dict[str, Any], frame: _Frame) -> AnyAction:
    at = _maybe_point(args, frame)
    if at is None:
        raise _bad("left_click_drag needs a coordinate", args)
    return DragTo(to_x=at[0], to_y=at[1])


def _scroll(horizontal: bool) -> Handler:
    def make(args: dict[str, Any], frame: _Frame) -> AnyAction:
        if args.get("pixels") is None:
            raise _bad("scroll needs pixels", args)
        # OpenClaw-RL's GUI-RL hands `pixels` to pyautogui.scroll unchanged, so the unit is wheel clicks.
        amount = min(max(round(_number(args["pixels"], "pixels")), -MAX_SCROLL), MAX_SCROLL)
        at = _maybe_point(args, frame)
        x, y = at if at is not None else (None, None)
        return Scroll(amount=amount, horizontal=horizontal, x=x, y=y)

    return make


def _type(args: dict[str, Any], frame: _Frame) -> AnyAction:
    text = args.get("text")
    if not isinstance(text, str):
        raise _bad("type needs a text string", text)
    if len(text) > MAX_TEXT:
        raise _bad(f"text is longer than {MAX_TEXT} characters", text)
    return TypeText(text=text)


def normalize_key(key: str) -> str:
    """A model's key name in pyautogui's spelling ("Return" -> "enter", "Control" -> "ctrl")."""
    name = key.strip().lower() or key  # a lone space is the space bar, not an empty name
    return _KEY_ALIASES.get(name, name)


def _key(args: dict[str, Any], frame: _Frame) -> AnyAction:
    keys = args.get("keys")
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise _bad("keys must be a non-empty list of key names", keys)
    names: list[str] = []
    for key in keys:
        parts = key.split("+")
        # "ctrl+c" in one string is a chord; a lone "+" is the plus key.
        names.extend(parts if len(parts) > 1 and all(p.strip() for p in parts) else [key])
    names = [normalize_key(k) for k in names]
    if len(names) > KEY_NAMES_MAX or not all(0 < len(k) <= MAX_KEY_LEN for k in names):
        raise _bad(f"keys must be 1..{KEY_NAMES_MAX} names of 1..{MAX_KEY_LEN} characters", keys)
    return Hotkey(keys=names)


def _wait(args: dict[str, Any], frame: _Frame) -> AnyAction:
    seconds = args.get("time")
    seconds = 1.0 if seconds is None else _number(seconds, "time")
    return Wait(seconds=min(max(seconds, 0.0), MAX_WAIT_S))


def _terminate(args: dict[str, Any], frame: _Frame) -> AnyAction:
    status = args.get("status", "success")
    if not isinstance(status, str) or status.strip().lower() not in ("success", "failure", "fail"):
        raise _bad("status must be success or failure", status)
    return Done() if status.strip().lower() == "success" else Fail()


_HANDLERS: dict[str, Handler] = {
    "key": _key,
    "type": _type,
    "mouse_move": _move,
    "left_click": _click("left"),
    "left_click_drag": _drag,
    "right_click": _click("right"),
    "middle_click": _click("middle"),
    "double_click": _click("left", 2),
    "triple_click": _click("left", 3),
    "scroll": _scroll(False),
    "hscroll": _scroll(True),
    "wait": _wait,
    "terminate": _terminate,
}
