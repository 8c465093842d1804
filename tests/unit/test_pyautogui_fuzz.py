"""`to_pyautogui` under hostile values: the program is always the intended call with literal arguments.

A VM that only offers OSWorld's `/execute` runs this text as Python, so any way for a value to leave its
literal would be code execution on the VM. Each generated program is the fixed prelude (no value of the
action in it) followed by calls checked on their syntax tree.
"""

from __future__ import annotations

import ast
import random

import pytest

from guirl.agent.actions import (
    PYAUTOGUI_PRELUDE,
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
    to_pyautogui,
)

# the calls a program may make after the prelude: pyautogui's, time.sleep, and the prelude's checked helpers
HELPERS = {"_on_screen", "_hotkey", "_write"}

HOSTILE = [
    "'",
    '"',
    "\\",
    "'''",
    '"""',
    "\n",
    "\r",
    "\x00",
    "\x1b",
    "\t",
    "\u2028",
    "\ud800",  # a lone surrogate
    "é",
    "你",
    "🎉",
    "\\'",
    "\\\n",
    "'); import os; os.system('id'); ('",
    '"); __import__("os"); ("',
    "{x}",
    "%s",
    "#",
    ")",
    "(",
    ";",
    "\\x27",
    "\\u0027",
    "\\N{APOSTROPHE}",
    "f'{1}'",
    "a",
    " ",
]


def _random_text(rng: random.Random, max_pieces: int = 12) -> str:
    pieces = [rng.choice(HOSTILE) for _ in range(rng.randint(0, max_pieces))]
    pieces += [chr(rng.randrange(0x110000)) for _ in range(rng.randint(0, 3))]  # any code point
    rng.shuffle(pieces)
    return "".join(pieces)


def _calls(program: str) -> list[ast.Call]:
    """The program's calls after the prelude, checking every statement is a bare call of `pyautogui.<fn>`,
    `time.sleep` or a prelude helper, with constant arguments (or `pass`)."""
    assert program.startswith(PYAUTOGUI_PRELUDE), program
    tree = ast.parse(program[len(PYAUTOGUI_PRELUDE) :])
    calls = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Pass):
            continue
        assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call), program
        call = stmt.value
        func = call.func
        if isinstance(func, ast.Name):
            assert func.id in HELPERS, program
        else:
            assert isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name), program
            assert (func.value.id, func.attr) in {("time", "sleep")} or func.value.id == "pyautogui", program
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            assert _constant(arg), program
        calls.append(call)
    # Nothing but these calls' own names anywhere in the tree.
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert names <= {"pyautogui", "time"} | HELPERS, program
    return calls


def _constant(node: ast.expr) -> bool:
    # A negative number is a unary minus on a constant.
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant)


def test_typed_text_stays_one_literal():
    rng = random.Random(1234)
    for _ in range(3000):
        text = _random_text(rng)
        (call,) = _calls(to_pyautogui(TypeText(text=text)))
        assert ast.unparse(call.func) == "_write"
        assert len(call.args) == 1 and isinstance(call.args[0], ast.Constant)
        assert call.args[0].value == text
        assert not call.keywords


def test_hotkey_names_stay_literals():
    rng = random.Random(99)
    for _ in range(1500):
        keys = [_random_text(rng, 4)[:32] or "a" for _ in range(rng.randint(1, 8))]
        (call,) = _calls(to_pyautogui(Hotkey(keys=keys)))
        assert ast.unparse(call.func) == "_hotkey"
        assert [a.value for a in call.args] == keys  # type: ignore[attr-defined]
        assert not call.keywords


def _random_action(rng: random.Random) -> AnyAction:
    c = lambda: rng.choice([0, 1, 65535, rng.randrange(65536)])  # noqa: E731
    button = rng.choice(["left", "right", "middle"])
    return rng.choice(
        [
            Click(x=c(), y=c(), button=button, clicks=rng.randint(1, 3)),
            MoveTo(x=c(), y=c()),
            Drag(x=c(), y=c(), to_x=c(), to_y=c(), button=button),
            DragTo(to_x=c(), to_y=c(), button=button),
            Scroll(amount=rng.randint(-100, 100), horizontal=rng.random() < 0.5),
            Scroll(amount=rng.randint(-100, 100), horizontal=rng.random() < 0.5, x=c(), y=c()),
            Wait(seconds=rng.choice([0.0, 60.0, 1e-300, rng.uniform(0, 60)])),
            Done(),
            Fail(),
        ]
    )


def test_every_action_type_is_constant_calls():
    rng = random.Random(5)
    seen = set()
    for _ in range(2000):
        action = _random_action(rng)
        calls = _calls(to_pyautogui(action))
        seen.add(type(action))
        if isinstance(action, Wait):
            (call,) = calls
            assert ast.unparse(call.func) == "time.sleep" and call.args[0].value == action.seconds  # type: ignore[attr-defined]
        elif isinstance(action, Done | Fail):
            assert calls == []
        else:
            funcs = [ast.unparse(call.func) for call in calls]
            assert all(f.startswith("pyautogui.") or f == "_on_screen" for f in funcs)
            # every point is checked against the screen before any pyautogui call uses it
            if any(getattr(action, k, None) is not None for k in ("x", "to_x")):
                assert funcs[0] == "_on_screen"
    assert len(seen) == 8


@pytest.mark.parametrize(
    "action",
    [
        # Structs built in Python are not validated: to_pyautogui must not trust their field types.
        Click(x="1); __import__('os').system('id'); (1", y=1),  # type: ignore[arg-type]
        Click(x=1, y=1, button="left'); import os; ('"),  # type: ignore[arg-type]  (still a literal: ok)
        Scroll(amount="1); import os; (1"),  # type: ignore[arg-type]
        Wait(seconds=float("nan")),
        Wait(seconds=float("inf")),
        Wait(seconds="1); import os; (1"),  # type: ignore[arg-type]
        TypeText(text=b"bytes"),  # type: ignore[arg-type]
        Hotkey(keys=[1]),  # type: ignore[list-item]
    ],
)
def test_unvalidated_structs_are_refused_or_literal(action):
    try:
        program = to_pyautogui(action)
    except TypeError:
        return
    _calls(program)


def test_subclass_reprs_are_ignored():
    class Evil(str):
        def __repr__(self) -> str:
            return "__import__('os').system('id')"

    class EvilInt(int):
        def __repr__(self) -> str:
            return "__import__('os')"

        __str__ = __repr__

    _calls(to_pyautogui(TypeText(text=Evil("hi"))))
    _calls(to_pyautogui(MoveTo(x=EvilInt(3), y=4)))
