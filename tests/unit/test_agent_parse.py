"""Parsing model responses into typed actions: every schema action, coordinates, hostile text, round trips."""

from __future__ import annotations

import json
import math
import random
import time

import pytest

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
from guirl.agent.parse import ParseError, parse_response
from guirl.agent.render import describe, render_response

SCREEN = (1920, 1080)


def call(**arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'computer_use', 'arguments': arguments})}\n</tool_call>"


def parse(text: str, **kw: object) -> list[AnyAction]:
    kw = {"screen": SCREEN, "coordinates": "relative", **kw}
    return parse_response(text, **kw).actions  # type: ignore[arg-type]


def error(text: str, **kw: object) -> str:
    with pytest.raises(ParseError) as info:
        parse(text, **kw)
    assert len(str(info.value)) < 400  # never the whole model output
    return info.value.code


# --- every action of the schema ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("left_click", Click(x=961, y=541)),  # 500 * 1920 / 999 = 960.96; 500 * 1080 / 999 = 540.54
        ("right_click", Click(x=961, y=541, button="right")),
        ("middle_click", Click(x=961, y=541, button="middle")),
        ("double_click", Click(x=961, y=541, clicks=2)),
        ("triple_click", Click(x=961, y=541, clicks=3)),
        ("mouse_move", MoveTo(x=961, y=541)),
        ("left_click_drag", DragTo(to_x=961, to_y=541)),
    ],
)
def test_pointer_actions(name, expected):
    assert parse("Action: do it\n" + call(action=name, coordinate=[500, 500])) == [expected]


def test_keyboard_actions():
    assert parse(call(action="type", text="hello\nworld")) == [TypeText(text="hello\nworld")]
    assert parse(call(action="key", keys=["ctrl", "s"])) == [Hotkey(keys=["ctrl", "s"])]
    assert parse(call(action="key", keys=["Control", "Shift", "T"])) == [Hotkey(keys=["ctrl", "shift", "t"])]
    assert parse(call(action="key", keys=["Return"])) == [Hotkey(keys=["enter"])]
    assert parse(call(action="key", keys="Escape")) == [Hotkey(keys=["esc"])]
    assert parse(call(action="key", keys=["ctrl+c"])) == [Hotkey(keys=["ctrl", "c"])]
    assert parse(call(action="key", keys=["+"])) == [Hotkey(keys=["+"])]
    assert parse(call(action="key", keys=["cmd", "PageDown"])) == [Hotkey(keys=["win", "pagedown"])]


def test_scroll_wait_terminate():
    assert parse(call(action="scroll", pixels=-5)) == [Scroll(amount=-5)]
    assert parse(call(action="scroll", pixels=3, coordinate=[0, 999])) == [Scroll(amount=3, x=0, y=1079)]
    assert parse(call(action="hscroll", pixels=2.6)) == [Scroll(amount=3, horizontal=True)]
    assert parse(call(action="scroll", pixels=-5000)) == [Scroll(amount=-100)]  # clamped
    assert parse(call(action="wait")) == [Wait(seconds=1.0)]
    assert parse(call(action="wait", time=2.5)) == [Wait(seconds=2.5)]
    assert parse(call(action="wait", time=600)) == [Wait(seconds=60.0)]
    assert parse(call(action="wait", time=-1)) == [Wait(seconds=0.0)]
    assert parse(call(action="terminate", status="success")) == [Done()]
    assert parse(call(action="terminate", status="failure")) == [Fail()]
    assert parse(call(action="terminate")) == [Done()]


def test_action_line_and_calls():
    text = "**Action:** Click the OK button\n" + call(action="left_click", coordinate=[1, 2])
    parsed = parse_response(text, screen=SCREEN, coordinates="relative")
    assert parsed.action_line == "Click the OK button"
    assert parsed.calls == [{"action": "left_click", "coordinate": [1, 2]}]
    assert parsed.dropped_calls == 0
    assert parse_response(call(action="wait"), screen=SCREEN, coordinates="relative").action_line == ""


def test_action_line_on_the_next_line_and_in_linear_time():
    text = "Thinking...\n- \nAction:\n  Click OK  \n" + call(action="wait")
    assert parse_response(text, screen=SCREEN, coordinates="relative").action_line == "Click OK"
    # A degenerate response (runs of dashed or blank lines, no Action line) once cost quadratic regex
    # backtracking: these 50 KB took ~8 s on the worker's event loop. Linear now: milliseconds.
    for junk in ("x" + "-\n" * 25_000, "x" + "\n" * 25_000 + "y"):
        started = time.monotonic()
        parsed = parse_response(junk + call(action="wait"), screen=SCREEN, coordinates="relative")
        assert time.monotonic() - started < 1.0
        assert parsed.action_line == "" and parsed.actions == [Wait(seconds=1.0)]


# --- coordinates ---------------------------------------------------------------------------------


def test_relative_mapping_and_clamping():
    assert parse(call(action="left_click", coordinate=[0, 0])) == [Click(x=0, y=0)]
    assert parse(call(action="left_click", coordinate=[999, 999])) == [Click(x=1919, y=1079)]  # 1920 -> edge
    assert parse(call(action="left_click", coordinate=[1500, -30])) == [Click(x=1919, y=0)]
    assert parse(call(action="left_click", coordinate=[499.6, 0.4])) == [Click(x=960, y=0)]


def test_absolute_mapping_and_clamping():
    kw = {"coordinates": "absolute", "image_size": (1280, 720)}
    assert parse(call(action="left_click", coordinate=[640, 360]), **kw) == [Click(x=960, y=540)]
    assert parse(call(action="left_click", coordinate=[1280, 720]), **kw) == [Click(x=1919, y=1079)]
    assert parse(call(action="left_click", coordinate=[-5, 10]), **kw) == [Click(x=0, y=15)]
    # No image size: the model saw the screen itself.
    assert parse(call(action="left_click", coordinate=[640, 360]), coordinates="absolute") == [
        Click(x=640, y=360)
    ]


def test_bad_coordinate_mode():
    with pytest.raises(ValueError):
        parse(call(action="wait"), coordinates="pixels")


# --- layout variants -----------------------------------------------------------------------------


def test_one_line_json_forms():
    line = json.dumps({"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [0, 0]}})
    assert parse(f"Action: click\n{line}") == [Click(x=0, y=0)]
    assert parse('Action: wait\n{"action": "wait", "time": 3}') == [Wait(seconds=3.0)]
    assert parse('```json\n{"action": "terminate", "status": "failure"}\n```') == [Fail()]


def test_missing_closing_tag_at_the_end():
    text = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "type", "text": "hi"}}'
    assert parse(text) == [TypeText(text="hi")]


def test_several_calls_limit_and_terminal():
    text = "".join(call(action="type", text=str(i)) for i in range(4))
    parsed = parse_response(text, screen=SCREEN, coordinates="relative", max_calls=2)
    assert parsed.actions == [TypeText(text="0"), TypeText(text="1")] and parsed.dropped_calls == 2
    assert len(parsed.calls) == 2
    text = call(action="type", text="a") + call(action="terminate") + call(action="type", text="b")
    parsed = parse_response(text, screen=SCREEN, coordinates="relative")
    assert parsed.actions == [TypeText(text="a"), Done()] and parsed.dropped_calls == 1
    # Calls past the limit are counted even when broken.
    parsed = parse_response(
        call(action="wait") + "<tool_call>{oops", screen=SCREEN, coordinates="relative", max_calls=1
    )
    assert parsed.actions == [Wait()] and parsed.dropped_calls == 1


def test_click_without_coordinate_uses_this_responses_pointer():
    text = call(action="mouse_move", coordinate=[0, 0]) + call(action="left_click")
    assert parse(text) == [MoveTo(x=0, y=0), Click(x=0, y=0)]
    assert error(call(action="left_click")) == "bad_arguments"


def test_think_blocks_are_ignored():
    thought = '<think>\nI could emit <tool_call>{"action": "terminate"}</tool_call> but no.\n</think>\n'
    assert parse(thought + "Action: type\n" + call(action="type", text="x")) == [TypeText(text="x")]
    # Qwen3 thinking models: the chat template opens the block, the response only closes it.
    assert parse("let me see...\n</think>\n\n" + call(action="wait")) == [Wait()]
    assert error("<think>only thinking</think>") == "empty"


def test_tool_call_markup_inside_text_arguments():
    text = "a</tool_call>b<tool_call>c\nAction: d"
    assert parse(call(action="type", text=text)) == [TypeText(text=text)]


def test_unicode():
    assert parse(call(action="type", text="héllo 你好 🎉 \u2028")) == [TypeText(text="héllo 你好 🎉 \u2028")]
    raw = (
        '<tool_call>{"name": "computer_use", "arguments": {"action": "type", "text": "\\u4f60\\ud83c\\udf89"'
    )
    raw += "}}"
    assert parse(raw) == [TypeText(text="你🎉")]


# --- malformed and adversarial output --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "empty"),
        ("  \n\t ", "empty"),
        ("I think I should click the button.", "no_tool_call"),
        ('Action: click\n<tool_call>\n{"name": "computer_use", "arguments": {</tool_call>', "bad_json"),
        ("<tool_call></tool_call>", "bad_json"),
        ("<tool_call>[1, 2]</tool_call>", "bad_json"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "wait"}}}</tool_call>', "bad_json"),
        ("{not json}", "bad_json"),
        (call(action="left_click", coordinate=[1, 2]).replace("computer_use", "browser"), "wrong_tool"),
        ('<tool_call>{"arguments": {"action": "wait"}}</tool_call>', "wrong_tool"),
        (call(action="swipe"), "unknown_action"),
        (call(action=5), "unknown_action"),
        (call(coordinate=[1, 2]), "bad_arguments"),
        ('<tool_call>{"name": "computer_use", "arguments": [1]}</tool_call>', "bad_arguments"),
        ('<tool_call>{"name": "computer_use", "arguments": "{nope"}</tool_call>', "bad_arguments"),
        (call(action="left_click"), "bad_arguments"),
        (call(action="left_click_drag"), "bad_arguments"),
        (call(action="left_click", coordinate=[math.nan, 1]), "bad_arguments"),
        (call(action="left_click", coordinate=[math.inf, 1]), "bad_arguments"),
        (call(action="left_click", coordinate=[1e300, 1]), "bad_arguments"),
        (call(action="left_click", coordinate=["500", "300"]), "bad_arguments"),
        (call(action="left_click", coordinate=[True, 1]), "bad_arguments"),
        (call(action="left_click", coordinate=[1, 2, 3]), "bad_arguments"),
        (call(action="left_click", coordinate=[[1, 2], [3, 4]]), "bad_arguments"),
        (call(action="left_click", coordinate={"x": 1, "y": 2}), "bad_arguments"),
        (call(action="left_click", coordinate="500,300"), "bad_arguments"),
        (call(action="scroll"), "bad_arguments"),
        (call(action="scroll", pixels="lots"), "bad_arguments"),
        (call(action="wait", time=math.nan), "bad_arguments"),
        (call(action="type"), "bad_arguments"),
        (call(action="type", text=["a"]), "bad_arguments"),
        (call(action="type", text="x" * 10_001), "bad_arguments"),
        (call(action="key", keys=[]), "bad_arguments"),
        (call(action="key", keys=[""]), "bad_arguments"),
        (call(action="key", keys=["a"] * 9), "bad_arguments"),
        (call(action="key", keys=["k" * 33]), "bad_arguments"),
        (call(action="key", keys=[1]), "bad_arguments"),
        (call(action="terminate", status="maybe"), "bad_arguments"),
        (call(action="terminate", status=None), "bad_arguments"),
    ],
)
def test_malformed(text, code):
    assert error(text) == code


def test_nan_literal_in_json():
    raw = '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [NaN, 1]}}'
    assert error(raw) == "bad_arguments"


def test_deeply_nested_json():
    assert error("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>") == "bad_json"
    nested = '{"action": "wait", "junk": ' + "[" * 50_000 + "]" * 50_000 + "}"
    assert error(f'<tool_call>{{"name": "computer_use", "arguments": {nested}}}</tool_call>') == "bad_json"


def test_random_garbage_never_escapes_parse_error():
    rng = random.Random(7)
    alphabet = 'abc {}[]":,<>/\\\n\tAction:tool_call0123456789.-eE\u00e9\u4f60\x00'
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
        if rng.random() < 0.5:
            text = "<tool_call>" + text
        try:
            parse(text)
        except ParseError as exc:
            assert len(str(exc)) < 400
    big = "".join(rng.choice(alphabet) for _ in range(10_000))
    assert error(big) in {"no_tool_call", "bad_json"}
    assert error("<tool_call>" + big) == "bad_json"


def test_think_close_inside_text_fails_safely():
    # A thought ends at the first </think>; text that contains one cannot be parsed (it never yields a
    # different action: the rest is not valid JSON).
    assert error(call(action="type", text="a</think>" + call(action="terminate"))) in {
        "no_tool_call",
        "bad_json",
    }


# --- render -> parse round trips -------------------------------------------------------------------

KEYS = [
    "ctrl",
    "shift",
    "alt",
    "win",
    "enter",
    "esc",
    "tab",
    "a",
    "z",
    "1",
    "f5",
    "+",
    "space",
    "pageup",
    "up",
]
TEXT_CHARS = "aZ9 '\"\\\n\t{}[]<>/:é你🎉\x00\u2028`$"


def _random_action(rng: random.Random, w: int, h: int) -> AnyAction:
    x, y, tx, ty = rng.randrange(w), rng.randrange(h), rng.randrange(w), rng.randrange(h)
    kind = rng.randrange(11)
    if kind < 5:
        button, clicks = [("left", 1), ("left", 2), ("left", 3), ("right", 1), ("middle", 1)][kind]
        return Click(x=x, y=y, button=button, clicks=clicks)  # type: ignore[arg-type]
    if kind == 5:
        return MoveTo(x=x, y=y)
    if kind == 6:
        return rng.choice([Drag(x=x, y=y, to_x=tx, to_y=ty), DragTo(to_x=tx, to_y=ty)])
    if kind == 7:
        at = rng.random() < 0.5
        return Scroll(
            amount=rng.randint(-100, 100),
            horizontal=rng.random() < 0.5,
            x=x if at else None,
            y=y if at else None,
        )
    if kind == 8:
        text = "".join(rng.choice(TEXT_CHARS) for _ in range(rng.randint(0, 60)))
        text += rng.choice(["", "</tool_call>", "<tool_call>", "Action: x", '"}}'])
        return TypeText(text=text)
    if kind == 9:
        return Hotkey(keys=rng.sample(KEYS, rng.randint(1, 4)))
    return Wait(seconds=rng.choice([0.0, 1.0, rng.uniform(0, 60)]))


def _expand(actions: list[AnyAction]) -> list[AnyAction]:
    out: list[AnyAction] = []
    for a in actions:  # a Drag renders as mouse_move + left_click_drag
        out += [MoveTo(x=a.x, y=a.y), DragTo(to_x=a.to_x, to_y=a.to_y)] if isinstance(a, Drag) else [a]
    return out


def _close(got: AnyAction, want: AnyAction, tol_x: int, tol_y: int) -> bool:
    if type(got) is not type(want):
        return False
    for field in got.__struct_fields__:
        g, w = getattr(got, field), getattr(want, field)
        if field in ("x", "to_x") and g is not None and w is not None:
            ok = abs(g - w) <= tol_x
        elif field in ("y", "to_y") and g is not None and w is not None:
            ok = abs(g - w) <= tol_y
        else:
            ok = g == w
        if not ok:
            return False
    return True


@pytest.mark.parametrize("coordinates", ["relative", "absolute"])
def test_render_parse_round_trip(coordinates):
    rng = random.Random(20240611)
    for _ in range(600):
        w, h = rng.randint(200, 1998), rng.randint(200, 1998)
        image = (
            (rng.randint(w // 2, 2 * w), rng.randint(h // 2, 2 * h)) if coordinates == "absolute" else None
        )
        units = image if image else (999, 999)
        # One model unit spans w / units pixels: rounding both ways is off by at most half of it, plus a half.
        tol_x, tol_y = math.floor(w / units[0] / 2 + 0.5), math.floor(h / units[1] / 2 + 0.5)
        assert coordinates == "absolute" or (tol_x <= 1 and tol_y <= 1)
        actions = [_random_action(rng, w, h) for _ in range(rng.randint(1, 3))]
        actions.append(rng.choice([Done(), Fail(), Wait(seconds=2.0)]))
        kw = {"screen": (w, h), "coordinates": coordinates, "image_size": image}
        text = render_response(actions, thought=rng.choice(["", "thinking about it"]), **kw)
        parsed = parse_response(text, max_calls=10, **kw)
        want = _expand(actions)
        assert len(parsed.actions) == len(want), text
        assert all(_close(g, e, tol_x, tol_y) for g, e in zip(parsed.actions, want)), (text, parsed.actions)
        summary = "; then ".join(describe(a) for a in actions)
        if "<tool_call>" not in summary and "</think>" not in summary:
            assert parsed.action_line == summary
        assert "\n" not in parsed.action_line


def test_render_format():
    text = render_response([Click(x=961, y=541)], screen=SCREEN, coordinates="relative")
    assert text == (
        "Action: Click at (961, 541)\n"
        '<tool_call>\n{"name": "computer_use", "arguments": '
        '{"action": "left_click", "coordinate": [500, 500]}}\n</tool_call>'
    )
    assert "terminate" in render_response([Fail()], screen=SCREEN, coordinates="relative")
    for bad in ([], [Click(x=1, y=1, button="right", clicks=2)], [DragTo(to_x=1, to_y=1, button="right")]):
        with pytest.raises(ValueError):
            render_response(bad, screen=SCREEN, coordinates="relative")
    with pytest.raises(ValueError):
        render_response([Done()], screen=SCREEN, coordinates="relative", thought="</think>")


def test_describe_is_one_line():
    for action in (
        TypeText(text="a\nb\r\n" * 30),
        Hotkey(keys=["ctrl", "s"]),
        Scroll(amount=-3, horizontal=True),
    ):
        assert "\n" not in describe(action) and "\r" not in describe(action)
    assert describe(Scroll(amount=-3)) == "Scroll down 3"
    assert describe(Hotkey(keys=["ctrl", "s"])) == "Press ctrl+s"
