"""The policy prompt: layout, history truncation, the token budget, coordinate modes."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image

from guirl.agent.imaging import image_size
from guirl.agent.prompt import (
    IMAGE_OVERHEAD_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    Prompt,
    PromptConfig,
    PromptTooLong,
    StepRecord,
    build_prompt,
    gui_rl_action_line,
    gui_rl_step,
    keep_resized,
    system_prompt,
)
from guirl.config.schema import AgentConfig
from guirl.messages.types import ImagePart, TextPart

SCREEN = (320, 200)
RESIZED = (320, 192)  # smart_resize(200, 320, 32): 200/32 = 6.25 -> 6 -> 192; 320 stays
IMAGE_TOKENS = (192 // 32) * (320 // 32)  # 60


def _png(shade: int, size: tuple[int, int] = SCREEN) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (shade, shade, shade)).save(buf, format="PNG")
    return buf.getvalue()


def _history(n: int) -> list[StepRecord]:
    return [
        StepRecord(
            screenshot=_png(10 * i),
            response=f"Action: step {i}\n<tool_call>{{}}</tool_call>",
            action_line=f"step {i}",
        )
        for i in range(1, n + 1)
    ]


def _build(history: list[StepRecord], **cfg: object) -> Prompt:
    return build_prompt("Open the file", history, _png(250), screen=SCREEN, cfg=PromptConfig(**cfg))  # type: ignore[arg-type]


def _shade(png: bytes) -> int:
    with Image.open(io.BytesIO(png)) as img:
        return img.convert("L").getpixel((5, 5))


def test_first_step_layout():
    p = _build([])
    assert [m.role for m in p.messages] == ["system", "user"]
    system = p.messages[0].parts[0]
    assert isinstance(system, TextPart) and system.text.startswith("# Tools\n")
    image, text = p.messages[1].parts
    assert image == ImagePart(0) and isinstance(text, TextPart)
    assert "Instruction: Open the file" in text.text
    assert text.text.endswith("Previous actions:\nNone")
    assert len(p.images) == 1 and p.image_sizes == [RESIZED]
    assert image_size(p.images[0]) == RESIZED
    assert p.dropped_images == 0


def test_history_keeps_the_last_images_and_lists_every_step():
    p = _build(_history(5), history_images=3)
    roles = [m.role for m in p.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    # Steps 3..5 are shown as image + response turns, in order, with their own screenshots.
    responses = [m.parts[0].text for m in p.messages if m.role == "assistant"]  # type: ignore[union-attr]
    assert [r.splitlines()[0] for r in responses] == ["Action: step 3", "Action: step 4", "Action: step 5"]
    image_refs = [part.index for m in p.messages for part in m.parts if isinstance(part, ImagePart)]
    assert image_refs == [0, 1, 2, 3]
    assert [_shade(img) for img in p.images] == [30, 40, 50, 250]
    # Every step is in the text, steps 1 and 2 only there.
    final = p.messages[-1].parts[-1].text  # type: ignore[union-attr]
    assert "Previous actions:\n" + "\n".join(f"Step {i}: step {i}" for i in range(1, 6)) in final


def test_no_history_images():
    p = _build(_history(5), history_images=0)
    assert [m.role for m in p.messages] == ["system", "user"]
    assert len(p.images) == 1 and _shade(p.images[0]) == 250
    assert "Step 5: step 5" in p.messages[-1].parts[-1].text  # type: ignore[union-attr]


def test_action_line_prefix_and_missing_line():
    history = [
        StepRecord(screenshot=_png(1), response="r1", action_line="Action: click OK"),
        StepRecord(screenshot=_png(2), response="r2", action_line=""),
    ]
    text = _build(history).messages[-1].parts[-1].text  # type: ignore[union-attr]
    assert "Step 1: click OK\nStep 2: Execute action" in text


def test_estimate_counts_text_images_and_turns():
    history = _history(2)
    p = build_prompt("x", history, _png(0), screen=SCREEN, cfg=PromptConfig(), count_tokens=lambda s: 0)
    per_image = IMAGE_TOKENS + IMAGE_OVERHEAD_TOKENS
    assert len(p.images) == 3  # fewer past steps than history_images: all of them shown
    assert p.est_tokens == 3 * per_image + 6 * MESSAGE_OVERHEAD_TOKENS
    default = _build(history)
    text_bytes = sum(
        len(part.text.encode()) for m in default.messages for part in m.parts if isinstance(part, TextPart)
    )
    assert default.est_tokens == text_bytes + 3 * per_image + 6 * MESSAGE_OVERHEAD_TOKENS


def test_budget_drops_oldest_images_first():
    history = _history(5)
    full = _build(history, history_images=3)
    step_cost = full.est_tokens - _build(history, history_images=2).est_tokens
    p = _build(history, history_images=3, max_prompt_tokens=full.est_tokens - 1)
    assert p.dropped_images == 1 and len(p.images) == 3
    assert [_shade(img) for img in p.images] == [40, 50, 250]
    assert p.est_tokens == full.est_tokens - step_cost <= full.est_tokens - 1
    # Just the current screenshot left: the budget of the imageless prompt is enough.
    bare = _build(history, history_images=0)
    p = _build(history, history_images=3, max_prompt_tokens=bare.est_tokens)
    assert p.dropped_images == 3 and len(p.images) == 1 and _shade(p.images[0]) == 250
    assert [m.role for m in p.messages] == ["system", "user"]
    assert p.est_tokens == bare.est_tokens


def test_prompt_too_long_when_even_the_current_image_does_not_fit():
    bare = _build(_history(3), history_images=0)
    with pytest.raises(PromptTooLong) as info:
        _build(_history(3), history_images=3, max_prompt_tokens=bare.est_tokens - 1)
    assert isinstance(info.value, ValueError)
    assert info.value.est == bare.est_tokens and info.value.budget == bare.est_tokens - 1


def test_coordinate_modes_in_the_system_prompt():
    relative = _build([]).messages[0].parts[0].text  # type: ignore[union-attr]
    absolute = _build([], coordinates="absolute").messages[0].parts[0].text  # type: ignore[union-attr]
    assert "The screen's resolution is 1000x1000." in relative
    assert "The screen's resolution is 320x192." in absolute  # the resized image, not the screen
    assert system_prompt(1, 1, "relative") == system_prompt(1920, 1080, "relative")
    with pytest.raises(ValueError):
        system_prompt(1, 1, "pixels")  # type: ignore[arg-type]


def test_system_prompt_schema():
    text = system_prompt(640, 384, "absolute")
    tools = json.loads(text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0])
    fn = tools["function"]
    assert fn["name"] == "computer_use"
    actions = fn["parameters"]["properties"]["action"]["enum"]
    assert actions == [
        "key", "type", "mouse_move", "left_click", "left_click_drag", "right_click", "middle_click",
        "double_click", "triple_click", "scroll", "hscroll", "wait", "terminate",
    ]  # fmt: skip
    assert set(fn["parameters"]["properties"]) == {
        "action",
        "keys",
        "text",
        "coordinate",
        "pixels",
        "time",
        "status",
    }
    assert fn["parameters"]["properties"]["status"]["enum"] == ["success", "failure"]
    assert "* The screen's resolution is 640x384." in fn["description"]
    assert text.rstrip().endswith("If finishing, use action=terminate in the tool call.")


def test_step_images_are_resized_once():
    history = _history(2)
    a, b = _build(history), _build(history)
    assert a.images[0] is b.images[0]


def test_from_config():
    cfg = PromptConfig.from_config(AgentConfig(coordinates="absolute", history_images=1, max_pixels=10_000))
    assert cfg == PromptConfig(coordinates="absolute", history_images=1, max_pixels=10_000)


def test_vision_tokens_in_a_past_response_are_left_out():
    """Engines decode responses with their special tokens; a past response holding `<|image_pad|>` would
    make the next prompt's image-pad count wrong, so the engine would abort it (an environment error for
    what the policy wrote). The history shows the response without those tokens."""
    step = StepRecord(
        screenshot=_png(10),
        response='<|vision_start|><|image_pad|>Action: x\n<tool_call>{"a": "<|video_pad|>"}</tool_call>',
        action_line="x",
    )
    p = _build([step])
    shown = p.messages[2].parts[0]
    assert p.messages[2].role == "assistant" and isinstance(shown, TextPart)
    assert shown.text == 'Action: x\n<tool_call>{"a": ""}</tool_call>'
    assert step.response.startswith("<|vision_start|>")  # the record itself stays verbatim


# -- agent.prompt_style ---------------------------------------------------------------------------------
# Expected values here are written from GUI-RL's code as read (gui-rl/agents/qwen3vl_agent.py @ 0d034dd5:
# `get_tool_spec`, `parse_response`, `generate_with_gui.py`'s recording), never from guirl's functions;
# tests/contract/test_gui_rl_prompt.py compares whole prompts with the text GUI-RL's own code builds.


def _spec_of(system_text: str) -> dict:
    return json.loads(system_text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0])


def test_the_default_style_is_guirl_s_own():
    """Left at its default the prompt is as before the setting existed: one tools block (in the system text,
    none for the template), the notes without the cookbook's remarks, "Execute action"."""
    history = [StepRecord(screenshot=_png(1), response="r1", action_line="")]
    p = _build(history)
    system = p.messages[0]
    assert system.tools == [] and system.parts[0].text.count("<tools>\n") == 1  # type: ignore[union-attr]
    action = _spec_of(system.parts[0].text)["function"]["parameters"]["properties"]["action"]  # type: ignore[union-attr]
    assert action["description"].endswith("its completion status.\n")
    assert (
        "* `triple_click`: Triple-click the left mouse button at a specified (x, y) pixel coordinate on the "
        "screen.\n" in action["description"]
    )
    assert "* `hscroll`: Performs a horizontal scroll.\n" in action["description"]
    assert p.messages[-1].parts[-1].text.endswith("Step 1: Execute action")  # type: ignore[union-attr]
    assert PromptConfig().style == "guirl" and AgentConfig().prompt_style == "guirl"


def test_gui_rl_style_system_turn():
    """GUI-RL's tool spec: its two notes, the 8 spaces its triple-quoted action description ends with; the
    same spec again for the chat template's own tools block (GUI-RL passes `tools=[spec]`)."""
    p = _build([], style="gui-rl", coordinates="absolute")
    system = p.messages[0]
    text = system.parts[0].text  # type: ignore[union-attr]
    assert text.count("<tools>\n") == 1 and text.endswith(
        "- If finishing, use action=terminate in the tool call."
    )
    (tool,) = system.tools
    assert json.loads(tool) == _spec_of(text)
    assert tool == text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]  # the same bytes, key order kept
    fn = json.loads(tool)["function"]
    description = fn["parameters"]["properties"]["action"]["description"]
    assert description.endswith(
        "* `terminate`: Terminate the current task and report its completion status.\n        "
    )
    assert (
        "* `triple_click`: Triple-click the left mouse button at a specified (x, y) pixel coordinate on the "
        "screen (simulated as double-click since it's the closest action).\n" in description
    )
    assert "* `hscroll`: Performs a horizontal scroll (mapped to regular scroll).\n" in description
    assert "* The screen's resolution is 320x192." in fn["description"]
    assert all(not m.tools for m in p.messages[1:])


@pytest.mark.parametrize(
    ("response", "entry"),
    [
        ("Action: Click OK.\n<tool_call>\n{}\n</tool_call>", "Click OK."),
        # the first matching line of the WHOLE response: reasoning lines count, mid-line mentions do not
        ("I see it. Action: maybe\n</think>\n\nAction: Click OK.", "Click OK."),
        ("Action: open the menu first\n</think>\n\nAction: Click OK.", "open the menu first"),
        # case-insensitive on the stripped line; the entry is stripped
        ("  aCtIoN:   Click OK.  \n", "Click OK."),
        ("ACTION: Press Enter\r\n<tool_call>", "Press Enter"),
        # split at the first colon only, nothing stripped a second time
        ("Action: Type: hello", "Type: hello"),
        ("Action: Action: Click", "Action: Click"),
        # an empty entry does not count: the scan goes on, into and past the tool call
        ("Action:\n<tool_call>\nAction: inside\n</tool_call>", "inside"),
        ("Action:   \n<tool_call>{}</tool_call>\nAction: after the call", "after the call"),
        ("Action: Click OK.<|im_end|>", "Click OK.<|im_end|>"),
        # not an action line for GUI-RL: markdown, a space before the colon, a full-width colon
        ("**Action:** Click OK.\n<tool_call>{}</tool_call>", ""),
        ("Action : Click OK.", ""),
        ("Action\uff1a Click OK.", ""),
        ("Action:", ""),
        ("<tool_call>{}</tool_call>", ""),
    ],
)
def test_gui_rl_action_line(response: str, entry: str):
    assert gui_rl_action_line(response) == entry


def test_gui_rl_history_entries():
    """An entry is used as extracted (no second `Action:` strip); none: "Execute the tool call"."""
    history = [
        StepRecord(screenshot=_png(1), response="r1", action_line="Action: Click"),
        StepRecord(screenshot=_png(2), response="r2", action_line=""),
        StepRecord(screenshot=_png(3), response="r3", action_line="Press Enter"),
    ]
    text = _build(history, style="gui-rl").messages[-1].parts[-1].text  # type: ignore[union-attr]
    assert text.endswith(
        "Previous actions:\nStep 1: Action: Click\nStep 2: Execute the tool call\nStep 3: Press Enter"
    )


def test_gui_rl_step_keeps_the_stop_token():
    """GUI-RL records `decode(output_ids)`: the `<|im_end|>` the model stopped on stays in the response
    (so the template closes the history turn after it), and a response cut at max_new_tokens has none."""
    answer = "Thinking.\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    stopped = gui_rl_step(b"png", answer, "stop")
    cut = gui_rl_step(b"png", answer + "\nAction: late", "length")
    assert stopped.response == answer + "<|im_end|>" and stopped.action_line == ""
    assert cut.response == answer + "\nAction: late" and cut.action_line == "late"
    assert stopped.screenshot == b"png"
    p = _build([StepRecord(_png(1), stopped.response, stopped.action_line)], style="gui-rl")
    assert p.messages[2].parts[0].text.endswith("</tool_call><|im_end|>")  # type: ignore[union-attr]


def test_gui_rl_style_has_no_token_budget():
    """GUI-RL never drops history images for length: neither does its style here, whatever the budget;
    the estimate counts the template's second tools block."""
    history = _history(3)
    p = _build(history, style="gui-rl", max_prompt_tokens=1)
    assert p.dropped_images == 0 and len(p.images) == 3
    assert p.est_tokens > _build(history).est_tokens + len(p.messages[0].tools[0])
    with pytest.raises(PromptTooLong):
        _build(history, max_prompt_tokens=1)


def test_prompt_style_from_config():
    cfg = PromptConfig.from_config(AgentConfig(prompt_style="gui-rl"))
    assert cfg == PromptConfig(style="gui-rl")
    with pytest.raises(ValueError):
        system_prompt(1, 1, "relative", "gui_rl")  # type: ignore[arg-type]


def test_a_screen_resized_for_its_prompt_is_not_resized_again_as_history(monkeypatch):
    """The env worker keeps each step's screen as its prompt resized it (`keep_resized`): the next prompts
    show the same pixels without decoding, resizing and encoding it again."""
    import guirl.agent.prompt as prompt_module

    cfg = PromptConfig.from_config(AgentConfig(history_images=2))
    first = build_prompt("Do it.", [], _png(40), screen=SCREEN, cfg=cfg)
    past = StepRecord(screenshot=_png(40), response="Action: x", action_line="x")
    fresh = build_prompt("Do it.", [StepRecord(_png(40), "Action: x", "x")], _png(80), screen=SCREEN, cfg=cfg)
    keep_resized(past, first)
    calls = []
    real = prompt_module.resize_image
    monkeypatch.setattr(prompt_module, "resize_image", lambda *a: calls.append(a) or real(*a))
    second = build_prompt("Do it.", [past], _png(80), screen=SCREEN, cfg=cfg)
    assert len(calls) == 1  # the current screen only
    assert second.images[0] == first.images[-1] and second.image_sizes[0] == RESIZED
    assert (
        Image.open(io.BytesIO(second.images[0])).tobytes()
        == Image.open(io.BytesIO(fresh.images[0])).tobytes()
    )
