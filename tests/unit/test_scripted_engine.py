"""The scripted engine: typed-action and recorded-response scripts, the end of a script, bad task ids."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from guirl.agent.actions import Click, Done, DragTo, Fail, Hotkey, MoveTo, TypeText
from guirl.agent.parse import parse_response
from guirl.inference.base import Engine, EngineError, GenRequest
from guirl.inference.scripted import ScriptedEngine
from guirl.messages.weights import WeightsFromDisk
from tests.helpers import run

SCREEN = (1920, 1080)
RECORDED = (
    "Action: open the menu\n<tool_call>\n"
    '{"name": "computer_use", "arguments": {"action": "key", "keys": ["alt"]}}\n</tool_call>'
)


@pytest.fixture
def script_dir(tmp_path: Path) -> Path:
    (tmp_path / "typed.jsonl").write_text(
        "# a solution file\n"
        '{"type": "click", "x": 960, "y": 540}\n'
        "\n"
        '{"type": "type", "text": "hello \\"world\\"\\n"}\n'
        '{"type": "fail"}\n'
    )
    recorded = [
        {"step_num": 1, "response": RECORDED, "action": "pyautogui.press('alt')"},
        {"step_num": 2, "response": "free text, not a tool call"},
        {"step_num": 2, "response": "free text, not a tool call"},  # a second action of the same step
    ]
    (tmp_path / "recorded.jsonl").write_text("\n".join(json.dumps(r) for r in recorded) + "\n")
    (tmp_path / "plain.jsonl").write_text(
        json.dumps({"response": "a"}) + "\n" + json.dumps({"response": "a"})
    )
    (tmp_path / "broken.jsonl").write_text('{"type": "click", "x": -1, "y": 0}\n')
    return tmp_path


def _png(size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size).save(buf, format="PNG")
    return buf.getvalue()


def _texts(engine: ScriptedEngine, *requests: GenRequest) -> list[str]:
    return [r.text for r in run(engine.generate(list(requests)))]


def _actions(text: str, **kw: object) -> list:
    return parse_response(text, screen=SCREEN, coordinates="relative", **kw).actions  # type: ignore[arg-type]


def test_typed_script_then_terminate(script_dir):
    engine = ScriptedEngine("scripted-0", script_dir, screen=SCREEN)
    assert isinstance(engine, Engine) and not engine.supports_tokens and engine.policy_version == -1
    texts = _texts(engine, *(GenRequest(task_id="typed", step=i) for i in range(5)))
    assert texts[0].startswith("Action: ")
    (click,) = _actions(texts[0])
    assert isinstance(click, Click) and abs(click.x - 960) <= 1 and abs(click.y - 540) <= 1
    assert _actions(texts[1]) == [TypeText(text='hello "world"\n')]
    assert _actions(texts[2]) == [Fail()]
    assert _actions(texts[3]) == [Done()] and _actions(texts[4]) == [Done()]  # past the end


def test_recorded_responses_are_verbatim(script_dir):
    engine = ScriptedEngine("scripted-0", script_dir, screen=SCREEN)
    texts = _texts(engine, *(GenRequest(task_id="recorded", step=i) for i in range(3)))
    assert texts[0] == RECORDED and _actions(texts[0]) == [Hotkey(keys=["alt"])]
    assert texts[1] == "free text, not a tool call"  # the repeated step_num line was folded
    assert _actions(texts[2]) == [Done()]
    # Without step numbers, equal lines are separate steps.
    assert _texts(engine, GenRequest(task_id="plain", step=1)) == ["a"]


def test_absolute_coordinates_use_the_last_image(script_dir):
    engine = ScriptedEngine("s", script_dir, screen=SCREEN, coordinates="absolute")
    request = GenRequest(task_id="typed", step=0, images=[_png((64, 64)), _png((960, 540))])
    (text,) = _texts(engine, request)
    assert '"coordinate": [480, 270]' in text
    parsed = parse_response(text, screen=SCREEN, coordinates="absolute", image_size=(960, 540))
    assert parsed.actions == [Click(x=960, y=540)]


def test_batch_results_in_order_and_stamped(script_dir):
    engine = ScriptedEngine("scripted-1", script_dir, screen=SCREEN, latency_s=0.01, max_batch=4)
    batch = [
        GenRequest(task_id=t, step=s)
        for t, s in [("recorded", 0), ("typed", 2), ("typed", 9), ("recorded", 0)]
    ]
    results = run(engine.generate(batch))
    assert [r.text for r in results][0] == results[3].text == RECORDED
    assert _actions(results[1].text) == [Fail()] and _actions(results[2].text) == [Done()]
    assert all(r.finish_reason == "stop" and r.engine == "scripted-1" for r in results)
    # One simulated delay for the whole batch (uvloop's millisecond timers may wake a little early).
    assert all(r.latency_s >= 0.008 and r.response_ids is None for r in results)
    run(engine.update_weights(7, WeightsFromDisk(path="")))
    assert run(engine.generate([GenRequest(task_id="typed")]))[0].policy_version == 7
    assert run(engine.health())


@pytest.mark.parametrize(
    "task_id", ["../typed", "..", ".", "a/b", "/etc/passwd", "typed\x00", "", "x" * 201, "tÿped"]
)
def test_bad_task_ids_are_refused(script_dir, task_id):
    engine = ScriptedEngine("s", script_dir, screen=SCREEN)
    with pytest.raises(EngineError) as info:
        run(engine.generate([GenRequest(task_id=task_id)]))
    assert not info.value.retryable


def test_missing_and_broken_scripts(script_dir):
    engine = ScriptedEngine("s", script_dir, screen=SCREEN)
    for task_id in ("nonexistent", "broken"):
        with pytest.raises(EngineError) as info:
            run(engine.generate([GenRequest(task_id="typed"), GenRequest(task_id=task_id)]))
        assert not info.value.retryable
    (script_dir / "junk.jsonl").write_text('{"neither": 1}\n')
    with pytest.raises(EngineError):
        run(engine.generate([GenRequest(task_id="junk")]))


def test_scripts_are_cached(script_dir):
    engine = ScriptedEngine("s", script_dir, screen=SCREEN)
    first = _texts(engine, GenRequest(task_id="typed", step=1))
    (script_dir / "typed.jsonl").unlink()
    assert _texts(engine, GenRequest(task_id="typed", step=1)) == first
    assert _actions(first[0]) == [TypeText(text='hello "world"\n')]


def test_a_drag_renders_as_move_then_drag(tmp_path):
    (tmp_path / "drag.jsonl").write_text('{"type": "drag", "x": 0, "y": 0, "to_x": 1918, "to_y": 1079}\n')
    (text,) = _texts(ScriptedEngine("s", tmp_path, screen=SCREEN), GenRequest(task_id="drag"))
    assert _actions(text) == [MoveTo(x=0, y=0), DragTo(to_x=1918, to_y=1079)]  # on the grid: exact


def test_gui_r1_answers_in_the_seen_images_pixels(script_dir):
    """With `response_format="gui_r1"` a typed line is GUI-R1's answer, its point in the pixels of the
    image the policy saw; it reads back (through GUI-R1's parser and the desktop mapping) as the line itself;
    past the end: `complete`. A typed action GUI-R1 has no answer for is a non-retryable error."""
    from guirl.agent.unified import parse_answer, to_typed

    engine = ScriptedEngine("s", script_dir, screen=SCREEN, response_format="gui_r1")
    seen = (480, 270)
    texts = _texts(
        engine,
        *(GenRequest(task_id="typed", step=i, images=[_png(seen)]) for i in range(2)),
        GenRequest(task_id="typed", step=3, images=[_png(seen)]),
    )
    answers = [parse_answer(t).actions for t in texts]
    assert answers[0][0].action == "click" and answers[0][0].point == (240, 135)
    assert to_typed(answers[0][0], image_size=seen, screen=SCREEN) == [Click(x=960, y=540)]
    assert to_typed(answers[1][0], image_size=seen, screen=SCREEN) == [TypeText(text='hello "world"\n')]
    assert answers[2][0].action == "complete"
    with pytest.raises(EngineError, match="step 2") as err:  # `fail` has no GUI-R1 answer
        _texts(engine, GenRequest(task_id="typed", step=2, images=[_png(seen)]))
    assert not err.value.retryable
    with pytest.raises(ValueError, match="response_format"):
        ScriptedEngine("s", script_dir, screen=SCREEN, response_format="json")


def test_tokens_are_the_texts_bytes_and_each_images_qwen3_vl_count(script_dir):
    """Token ids for a train run with a simulated learner: the response's bytes, log-prob 0 each; the prompt's
    text at one id per 4 bytes, each image as Qwen3-VL's token count; a bad image fails the request."""
    from guirl.inference.scripted import IMAGE_TOKEN
    from guirl.messages.types import ChatMessage, ImagePart, TextPart

    engine = ScriptedEngine("s", script_dir, screen=SCREEN, tokens=True)
    assert engine.supports_tokens and not ScriptedEngine("t", script_dir, screen=SCREEN).supports_tokens
    messages = [
        ChatMessage(role="system", parts=[TextPart(text="sys")], tools=['{"a": 1}']),
        ChatMessage(role="user", parts=[ImagePart(index=0), TextPart(text="é?"), ImagePart(index=1)]),
    ]
    # 1280x800 and 1920x1080 rounded to 32-pixel cells: 40 x 25 and 60 x 34 image tokens
    request = GenRequest(messages=messages, images=[_png((1280, 800)), _png(SCREEN)], task_id="typed")
    (result,) = run(engine.generate([request]))
    assert result.prompt_ids == [  # one id per 4 bytes of text, about a BPE tokenizer's rate
        *b'{"a": 1}'[::4],
        *b"sys"[::4],
        *[IMAGE_TOKEN] * (40 * 25),
        *"é?".encode()[::4],
        *[IMAGE_TOKEN] * (60 * 34),
    ]
    assert result.response_ids == list(result.text.encode()) and result.logprobs == [0.0] * len(
        result.text.encode()
    )
    (given,) = run(engine.generate([GenRequest(prompt_ids=[5, 6], task_id="typed")]))
    assert given.prompt_ids == [5, 6]
    for images, said in [([], "image 0 of 0"), ([b"\x89PNG not really"], "image 0:")]:
        parts = [ImagePart(index=0)]
        bad = GenRequest(messages=[ChatMessage(role="user", parts=parts)], images=images, task_id="typed")
        with pytest.raises(EngineError, match=said):
            run(engine.generate([bad]))
