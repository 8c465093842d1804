"""GUI-R1's unified action space: parsing answers (good, malformed, hostile), rendering, the prompt, and the
mapping to and from typed desktop actions."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from guirl.agent.actions import Click, Done, Drag, DragTo, Fail, Hotkey, MoveTo, Scroll, TypeText, Wait
from guirl.agent.unified import (
    UNIFIED_ACTIONS,
    UnifiedAction,
    canonical_action,
    from_typed,
    gui_r1_prompt,
    parse_answer,
    render_answer,
    to_typed,
)

IMAGE = (1280, 720)
SCREEN = (1920, 1080)  # 1.5x the image on both axes


def answer(body: str, think: str = "look") -> str:
    return f"<think>{think}</think> <answer>{body}</answer>"


def reparse(u: UnifiedAction) -> UnifiedAction:
    parsed = parse_answer(render_answer([u]))
    assert parsed.format_ok, parsed.error
    (back,) = parsed.actions
    return back


def one(body: str) -> UnifiedAction:
    parsed = parse_answer(answer(body))
    assert parsed.format_ok, parsed.error
    assert len(parsed.actions) == 1
    return parsed.actions[0]


# --- good answers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "[{'action': 'click', 'point': [123, 300], 'input_text': 'no input text'}]",
            UnifiedAction("click", (123, 300)),
        ),
        (
            "[{'action': 'type', 'point': [-100, -100], 'input_text': 'shanghai mall'}]",
            UnifiedAction("type", None, "shanghai mall"),
        ),
        (
            "[{'action': 'select', 'point': [40, 50], 'input_text': 'Texas'}]",
            UnifiedAction("select", (40, 50), "Texas"),
        ),
        (
            "[{'action': 'scroll', 'point': [-100, -100], 'input_text': 'UP'}]",
            UnifiedAction("scroll", None, "up"),
        ),
        (
            "[{'action': 'enter', 'point': [-100, -100], 'input_text': 'no input text'}]",
            UnifiedAction("press", None, "enter"),
        ),
        (
            "[{'action': 'press', 'point': [-100, -100], 'input_text': 'Return'}]",
            UnifiedAction("press", None, "enter"),
        ),
        (
            "[{'action': 'hotkey', 'point': [-100, -100], 'input_text': 'Ctrl+C'}]",
            UnifiedAction("hotkey", None, "ctrl+c"),
        ),
        (
            "[{'action': 'open_app', 'point': [-100, -100], 'input_text': 'Chrome'}]",
            UnifiedAction("open_app", None, "Chrome"),
        ),
        (
            "[{'action': 'press_back', 'point': [-100, -100], 'input_text': 'no input text'}]",
            UnifiedAction("navigate_back"),
        ),
        (
            "[{'action': 'press_home', 'point': [-100, -100], 'input_text': 'no input text'}]",
            UnifiedAction("navigate_home"),
        ),
        (
            "[{'action': 'close/delete', 'point': [-100, -100], 'input_text': 'no input text'}]",
            UnifiedAction("close"),
        ),
        ("[{'action': 'wait', 'point': [-100, -100], 'input_text': '2'}]", UnifiedAction("wait", None, "2")),
        (
            "[{'action': 'complete', 'point': [-100, -100], 'input_text': 'no input text'}]",
            UnifiedAction("complete"),
        ),
        (
            "[{'action': 'finished', 'point': [-100, -100], 'input_text': 'no input text'}]",
            UnifiedAction("complete"),
        ),
        # A finger swiping up moves the content up: a scroll down.
        (
            "[{'action': 'swipe', 'point': [-100, -100], 'input_text': 'up'}]",
            UnifiedAction("scroll", None, "down"),
        ),
        # A point on an action that takes none means nothing and is dropped (GUI-R1 accepts it).
        (
            "[{'action': 'complete', 'point': [5, 5], 'input_text': 'no input text'}]",
            UnifiedAction("complete"),
        ),
    ],
)
def test_parses_every_action(body: str, expected: UnifiedAction) -> None:
    assert one(body) == expected


def test_json_and_python_styles_read_alike() -> None:
    py = "[{'action': 'click', 'point': [10, 20], 'input_text': 'no input text'}]"
    js = '[{"action": "click", "point": [10, 20], "input_text": "no input text"}]'
    assert one(py) == one(js) == UnifiedAction("click", (10.0, 20.0))


def test_no_point_marker_is_none() -> None:
    assert one("[{'action': 'type', 'point': [-100, -100], 'input_text': 'hi'}]").point is None


def test_layout_whitespace_and_several_actions() -> None:
    text = (
        "  \n<think>\nA <b>bold</b> plan\n</think>\n\n<answer>\n[{'action': 'click', 'point': [1, 2], "
        "'input_text': 'no input text'}, {'action': 'type', 'point': [-100, -100], 'input_text': 'x'}]\n"
        "</answer>\n"
    )
    parsed = parse_answer(text)
    assert parsed.format_ok and parsed.has_think and parsed.has_answer and parsed.error == ""
    assert [a.action for a in parsed.actions] == ["click", "type"]


# --- format failures -----------------------------------------------------------------------------

CLICK = "[{'action': 'click', 'point': [10, 20], 'input_text': 'no input text'}]"


@pytest.mark.parametrize(
    ("text", "extracted"),
    [
        (f"<answer>{CLICK}</answer>", True),  # no think: the action is still read
        ("<think>a</think>", False),  # no answer
        (f"<think>a</think> <answer>{CLICK}", False),  # unclosed answer
        (f"Sure! <think>a</think> <answer>{CLICK}</answer>", True),  # text before
        (f"<think>a</think> <answer>{CLICK}</answer> done", True),  # text after
        (f"<think>a</think> between <answer>{CLICK}</answer>", True),  # text between
        (f"<answer>{CLICK}</answer> <think>a</think>", True),  # wrong order
        (f"<think>a</think><think>b</think> <answer>{CLICK}</answer>", True),  # two thinks
        (f"<think>a</think> <answer>{CLICK}</answer><answer>{CLICK}</answer>", True),  # two answers
        (f"<think>a</think> <answer>{CLICK[:-1]}</answer>", False),  # bad literal
        ("<think>a</think> <answer>[]</answer>", False),  # empty list
        ("<think>a</think> <answer></answer>", False),  # empty answer
        ("<think>a</think> <answer>[1, 2]</answer>", False),  # not dicts
        ("<think>a</think> <answer>'click'</answer>", False),  # not a list
        (answer("[{'action': 'long_press', 'point': [1, 2], 'input_text': 'no input text'}]"), False),
        (answer("[{'action': 'click', 'point': [-100, -100], 'input_text': 'no input text'}]"), False),
        (answer("[{'action': 'click', 'input_text': 'no input text'}]"), False),  # missing point
        (answer("[{'action': 'click', 'point': ['10', '20'], 'input_text': 'no input text'}]"), False),
        (answer("[{'action': 'click', 'point': '[10, 20]', 'input_text': 'no input text'}]"), False),
        (answer("[{'action': 'click', 'point': [10], 'input_text': 'no input text'}]"), False),
        (answer("[{'action': 'click', 'point': [True, 2], 'input_text': 'no input text'}]"), False),
        (answer('[{"action": "click", "point": [NaN, 2], "input_text": "no input text"}]'), False),
        (answer("[{'action': 'click', 'point': [1e9, 2], 'input_text': 'no input text'}]"), False),
        (answer("[{'action': 'scroll', 'point': [-100, -100], 'input_text': 'no input text'}]"), False),
        (answer("[{'action': 'scroll', 'point': [-100, -100], 'input_text': 'sideways'}]"), False),
        (answer("[{'action': 'type', 'point': [-100, -100], 'input_text': 'no input text'}]"), False),
        (answer("[{'action': 'press', 'point': [-100, -100], 'input_text': 'ctrl+c'}]"), False),  # a chord
        (answer("[{'action': 'wait', 'point': [-100, -100], 'input_text': 'a while'}]"), False),
        (answer("[{'action': 7, 'point': [1, 2], 'input_text': 'no input text'}]"), False),
        (answer("[{'action': 'type', 'point': [-100, -100], 'input_text': None}]"), False),
        # Readable but not the prompt's spelling: float point, missing key, bare dict.
        (answer("[{'action': 'click', 'point': [10.5, 20.0], 'input_text': 'no input text'}]"), True),
        (answer("[{'action': 'click', 'point': [10, 20]}]"), True),
        (answer("{'action': 'click', 'point': [10, 20], 'input_text': 'no input text'}"), True),
    ],
)
def test_format_failures(text: str, extracted: bool) -> None:
    parsed = parse_answer(text)
    assert not parsed.format_ok
    assert parsed.error
    assert bool(parsed.actions) == extracted, parsed


def test_has_flags() -> None:
    assert parse_answer(f"<answer>{CLICK}</answer>").has_think is False
    assert parse_answer(f"<answer>{CLICK}</answer>").has_answer is True
    assert parse_answer("<think>a</think>").has_think is True
    assert parse_answer("<think>a</think>").has_answer is False
    assert parse_answer("</think> <think>").has_think is False  # closed before opened


def test_the_last_answer_block_is_read() -> None:
    # A model that quotes an answer while thinking, then decides, is scored on its decision.
    echo = "[{'action': 'type', 'point': [-100, -100], 'input_text': 'x'}]"
    parsed = parse_answer(f"<think>maybe <answer>{echo}</answer></think> <answer>{CLICK}</answer>")
    assert not parsed.format_ok
    assert parsed.actions == [UnifiedAction("click", (10, 20))]


def test_actions_stop_at_the_first_invalid_entry() -> None:
    bad = "{'action': 'click', 'point': ['a', 'b'], 'input_text': 'no input text'}"
    type_x = "{'action': 'type', 'point': [-100, -100], 'input_text': 'x'}"
    assert parse_answer(answer(f"[{type_x}, {bad}, {type_x}]")).actions == [UnifiedAction("type", None, "x")]
    assert parse_answer(answer(f"[{bad}, {type_x}]")).actions == []


# --- hostile text --------------------------------------------------------------------------------


def test_huge_response_is_refused_quickly() -> None:
    start = time.perf_counter()
    parsed = parse_answer(answer("[" + "{'action': 'click'}, " * 60_000 + "]"))  # ~1.3 MB
    assert time.perf_counter() - start < 0.5
    assert not parsed.format_ok and parsed.actions == [] and "characters" in parsed.error


@pytest.mark.parametrize("levels", [100_000, 150, 9])
def test_deep_nesting_never_recurses(levels: int) -> None:
    text = answer("[" * levels + "]" * levels)
    parsed = parse_answer(text, max_chars=len(text))
    assert not parsed.format_ok and parsed.actions == []


def test_answer_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for body in [
        f"[{{'action': __import__('os').system('touch {marker}'), 'point': [1, 2], 'input_text': ''}}]",
        f"__import__('pathlib').Path('{marker}').touch()",
        f"[{{'action': 'click', 'point': [open('{marker}', 'w'), 2], 'input_text': ''}}]",
        "[{'action': 'click', 'point': [10**10**10, 2], 'input_text': ''}]",  # not computed either
    ]:
        parsed = parse_answer(answer(body))
        assert not parsed.format_ok and parsed.actions == []
    assert not marker.exists()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00" * 100,
        answer("[{'action': 'type', 'point': [-100, -100], 'input_text': 'a'}]\x00"),
        answer("[{'action': 'ty\x00pe', 'point': [-100, -100], 'input_text': 'a'}]"),
        "<think>" * 1000 + "</answer>" * 1000,
        "<answer>" * 2000,
        answer("[{'action': 'click', 'point': [1, 2], 'input_text': '" + "é🙂" * 100 + "'"),
        answer("[{'action': 'click', 'point': [1, 2], 'input_text': 'no input text'}] " * 200),
        answer("[" + "'a', " * 3000 + "]"),
        answer("[{'action': 'click', 'point': [" + "9" * 5000 + ", 2], 'input_text': ''}]"),
        answer("{1, 2}"),
        answer("b'bytes'"),
        answer("[{'action': 'click', 'point': [1+2j, 2], 'input_text': ''}]"),
        answer('"\\ud800"'),
    ],
)
def test_hostile_text_never_raises(text: str) -> None:
    parsed = parse_answer(text)
    assert not parsed.format_ok


def test_non_text_never_raises() -> None:
    assert not parse_answer(None).format_ok  # type: ignore[arg-type]
    assert not parse_answer(b"<think></think>").format_ok  # type: ignore[arg-type]


def test_unicode_and_quotes_survive() -> None:
    text = "日本語 'single' \"double\" back\\slash"
    assert reparse(UnifiedAction("type", None, text)).input_text == text


# --- render / parse round trip -------------------------------------------------------------------

EVERY_ACTION = [
    UnifiedAction("click", (123, 300)),
    UnifiedAction("type", None, "shanghai shopping mall"),
    UnifiedAction("type", (5, 6), 'it\'s "quoted"\nnext line\x00'),
    UnifiedAction("select", (40, 50), "Texas"),
    UnifiedAction("select", None, "Texas"),
    UnifiedAction("scroll", None, "down"),
    UnifiedAction("scroll", (640, 360), "left"),
    UnifiedAction("press", None, "enter"),
    UnifiedAction("press", None, "esc"),
    UnifiedAction("hotkey", None, "ctrl+shift+t"),
    UnifiedAction("open_app", None, "Google Chrome"),
    UnifiedAction("navigate_back"),
    UnifiedAction("navigate_home"),
    UnifiedAction("close"),
    UnifiedAction("wait"),
    UnifiedAction("wait", None, "2.5"),
    UnifiedAction("complete"),
]


def test_every_unified_action_is_covered() -> None:
    assert {a.action for a in EVERY_ACTION} == set(UNIFIED_ACTIONS)


@pytest.mark.parametrize("action", EVERY_ACTION, ids=lambda a: a.action)
def test_render_parse_round_trip(action: UnifiedAction) -> None:
    text = render_answer([action], think="The button is at the top.")
    parsed = parse_answer(text)
    assert parsed.format_ok, (text, parsed.error)
    assert parsed.actions == [action]


def test_render_uses_gui_r1_names_and_its_exact_text() -> None:
    assert render_answer([UnifiedAction("click", (123.4, 299.6))], think="t") == (
        "<think> t </think> <answer>[{'action': 'click', 'point': [123, 300], "
        "'input_text': 'no input text'}]</answer>"
    )
    assert render_answer([UnifiedAction("navigate_back")]) == (
        "<think> </think> <answer>[{'action': 'press_back', 'point': [-100, -100], "
        "'input_text': 'no input text'}]</answer>"
    )
    names = [render_answer([a]).split("'action': '")[1].split("'")[0] for a in EVERY_ACTION]
    assert {"press_home", "close/delete", "enter", "press"} <= set(names)


def test_render_refuses_what_would_not_parse() -> None:
    with pytest.raises(ValueError):
        render_answer([])
    with pytest.raises(ValueError):
        render_answer([UnifiedAction("complete")], think="a </think> b")


# --- the action type's own checks ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "point", "text"),
    [
        ("tap", None, ""),  # not canonical
        ("press_back", None, ""),  # an alias, not canonical
        ("click", None, ""),
        ("click", (-100, -100), ""),
        ("click", (float("inf"), 1), ""),
        ("complete", (1, 2), ""),
        ("type", None, ""),
        ("type", None, "no input text"),
        ("scroll", None, ""),
        ("press", None, ""),
        ("hotkey", None, "ctrl+"),
        ("hotkey", None, "+".join(["a"] * 9)),
        ("wait", None, "999"),
        ("type", None, "x" * 10_001),
    ],
)
def test_unified_action_validation(action: str, point: tuple[float, float] | None, text: str) -> None:
    with pytest.raises(ValueError):
        UnifiedAction(action, point, text)


def test_canonical_action() -> None:
    assert canonical_action("Press_Back", "no input text") == ("navigate_back", "")
    assert canonical_action("enter", "") == ("press", "enter")
    assert canonical_action("swipe", "left") == ("scroll", "right")
    with pytest.raises(ValueError):
        canonical_action("long_press")


# --- the prompt ----------------------------------------------------------------------------------


def test_prompt_high() -> None:
    text = gui_r1_prompt("Open the settings", "")
    assert text.startswith("You are GUI-R1, a reasoning GUI Agent Assistant. In this UI screenshot, I want")
    assert "the command 'Open the settings', with the action history being 'None'." in text
    assert (
        "(enumerate from ['complete', 'close/delete', 'press_home', 'click', 'press_back', 'type', 'select', "
        "'scroll', 'enter'])" in text
    )
    assert "input_text must be enum['up', 'left', 'right', 'down']" in text
    assert "<image>" not in text
    assert text.endswith("'input_text': enum['up', 'left', 'right', 'down']}]")


def test_prompt_low_and_marker() -> None:
    text = gui_r1_prompt("Tap OK", "Step 1: opened the app", "low", image_marker="<image>")
    assert "In this UI screenshot <image>, I want" in text
    assert "with the action history being 'Step 1: opened the app'" in text
    assert "(enumerate from ['click'])" in text
    assert "scroll" not in text and "type" not in text
    with pytest.raises(ValueError):
        gui_r1_prompt("x", "", "medium")


# --- to and from typed desktop actions -----------------------------------------------------------


@pytest.mark.parametrize(
    ("u", "typed"),
    [
        (UnifiedAction("click", (100, 200)), [Click(x=150, y=300)]),  # x1.5
        (
            UnifiedAction("click", (1279.9, 719.9)),
            [Click(x=1919, y=1079)],
        ),  # 1919.85 rounds off screen, clamped
        (UnifiedAction("click", (-50, 5000)), [Click(x=0, y=1079)]),
        (UnifiedAction("type", None, "hi"), [TypeText(text="hi")]),
        (UnifiedAction("type", (10, 10), "hi"), [Click(x=15, y=15), TypeText(text="hi")]),
        (UnifiedAction("select", None, "Texas"), [TypeText(text="Texas")]),
        (
            UnifiedAction("select", (10, 20), "Texas"),
            [Click(x=15, y=30), TypeText(text="Texas"), Hotkey(keys=["enter"])],
        ),
        (UnifiedAction("scroll", None, "up"), [Scroll(amount=5)]),
        (UnifiedAction("scroll", None, "down"), [Scroll(amount=-5)]),
        (UnifiedAction("scroll", None, "right"), [Scroll(amount=5, horizontal=True)]),
        (UnifiedAction("scroll", (2, 4), "left"), [Scroll(amount=-5, horizontal=True, x=3, y=6)]),
        (UnifiedAction("press", None, "enter"), [Hotkey(keys=["enter"])]),
        (UnifiedAction("hotkey", None, "Ctrl+C"), [Hotkey(keys=["ctrl", "c"])]),
        (UnifiedAction("hotkey", None, "ctrl++"), [Hotkey(keys=["ctrl", "+"])]),
        (UnifiedAction("navigate_back"), [Hotkey(keys=["alt", "left"])]),
        (UnifiedAction("navigate_home"), [Hotkey(keys=["win"])]),
        (UnifiedAction("wait"), [Wait(seconds=1.0)]),
        (UnifiedAction("wait", None, "3"), [Wait(seconds=3.0)]),
        (UnifiedAction("complete"), [Done()]),
    ],
)
def test_to_typed(u: UnifiedAction, typed: list) -> None:
    assert to_typed(u, image_size=IMAGE, screen=SCREEN) == typed


@pytest.mark.parametrize("u", [UnifiedAction("open_app", None, "Chrome"), UnifiedAction("close")])
def test_to_typed_refuses_what_a_desktop_cannot_do(u: UnifiedAction) -> None:
    with pytest.raises(ValueError, match="desktop"):
        to_typed(u, image_size=IMAGE, screen=SCREEN)


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        to_typed(UnifiedAction("click", (1, 1)), image_size=(0, 720), screen=SCREEN)


@pytest.mark.parametrize(
    ("typed", "u"),
    [
        (Click(x=150, y=300), UnifiedAction("click", (100, 200))),
        (TypeText(text="hello"), UnifiedAction("type", None, "hello")),
        (Scroll(amount=3), UnifiedAction("scroll", None, "up")),
        (Scroll(amount=-3, x=30, y=60), UnifiedAction("scroll", (20, 40), "down")),
        (Scroll(amount=2, horizontal=True), UnifiedAction("scroll", None, "right")),
        (Scroll(amount=-2, horizontal=True), UnifiedAction("scroll", None, "left")),
        (Hotkey(keys=["enter"]), UnifiedAction("press", None, "enter")),
        (Hotkey(keys=["ctrl", "c"]), UnifiedAction("hotkey", None, "ctrl+c")),
        (Wait(seconds=2.5), UnifiedAction("wait", None, "2.5")),
        (Done(), UnifiedAction("complete")),
    ],
)
def test_from_typed(typed: object, u: UnifiedAction) -> None:
    assert from_typed(typed, image_size=IMAGE, screen=SCREEN) == u  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "typed",
    [
        MoveTo(x=1, y=2),
        Drag(x=1, y=2, to_x=3, to_y=4),
        DragTo(to_x=3, to_y=4),
        Fail(),
        Click(x=1, y=2, button="right"),
        Click(x=1, y=2, clicks=2),
        Scroll(amount=0),
    ],
)
def test_from_typed_refuses_unmappable(typed: object) -> None:
    with pytest.raises(ValueError, match=type(typed).__name__):
        from_typed(typed, image_size=IMAGE, screen=SCREEN)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "typed",
    [
        Click(x=0, y=0),
        Click(x=1001, y=999),
        Click(x=1919, y=1079),
        Scroll(amount=-7, x=1234, y=777),
        TypeText(text="x"),
        Hotkey(keys=["alt", "f4"]),
        Hotkey(keys=["ctrl", "+"]),
        Wait(seconds=0.5),
        Done(),
    ],
)
def test_typed_round_trip_through_the_answer_text(typed: object) -> None:
    # typed -> unified -> GUI-R1 text (integer image pixels) -> unified -> typed: within 1 screen pixel.
    u = from_typed(typed, image_size=IMAGE, screen=SCREEN)  # type: ignore[arg-type]
    (back,) = to_typed(reparse(u), image_size=IMAGE, screen=SCREEN)
    if isinstance(typed, Click | Scroll) and typed.x is not None:
        assert type(back) is type(typed)
        assert abs(back.x - typed.x) <= 1 and abs(back.y - typed.y) <= 1  # type: ignore[union-attr]
        if isinstance(typed, Scroll):
            assert back.amount == -5  # the direction survives, the magnitude is GUI-R1's one scroll
    elif isinstance(typed, Wait | Done | TypeText | Hotkey):
        assert back == typed
