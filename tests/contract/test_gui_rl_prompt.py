"""`agent.prompt_style = "gui-rl"` against OpenClaw-RL's GUI-RL agent, whose checkpoints it is for.

For each case of data/gui_rl_prompt/cases.json (past steps' decoded responses and finish reasons, screen,
coordinate type), guirl builds the next step's prompt as an env worker does — the setting loaded as `--set`
gives it, each played step recorded by `gui_rl_step` — and renders it as guirl's engines do
(`ChatRenderer`) with the tiny Thinking checkpoint's chat template. The result must be, byte for byte, the
text GUI-RL's own agent built for the case with Qwen3-VL-Thinking's template (data/gui_rl_prompt/<case>.txt,
written by running GUI-RL; its README says how). Covered: a step without an `Action:` line, reasoning in
past responses (one with an `Action:` line of its own), responses that stopped on the end-of-turn token and
one cut at the length limit, GUI-RL's action-line rule, relative and absolute coordinates, the tools block
twice.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub

import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from guirl.agent.parse import parse_response
from guirl.agent.prompt import GUI_RL_STOP_TEXT, PromptConfig, build_prompt, gui_rl_step
from guirl.config import load_config
from tests.helpers import shared_tiny

DATA = Path(__file__).parent / "data" / "gui_rl_prompt"
CASES = json.loads((DATA / "cases.json").read_text())["cases"]


@pytest.fixture(scope="module")
def renderer(tmp_path_factory: pytest.TempPathFactory):
    from guirl.inference.chat import ChatRenderer

    ckpt = shared_tiny(tmp_path_factory, thinking=True)
    return ChatRenderer.load(ckpt)


def _png(size: list[int], color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size[0], size[1]), color).save(buf, format="PNG")
    return buf.getvalue()


def _engine_text(step: dict) -> str:
    """The response as guirl's engines return it: without the end-of-turn token the model stopped on."""
    decoded, stopped = step["decoded"], step["finish_reason"] == "stop"
    assert decoded.endswith(GUI_RL_STOP_TEXT) == stopped, step
    return decoded.removesuffix(GUI_RL_STOP_TEXT) if stopped else decoded


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_prompt_is_gui_rl_s_byte_for_byte(name: str, renderer) -> None:
    case = CASES[name]
    cfg = load_config(
        env={}, overrides=["agent.prompt_style=gui-rl", f"agent.coordinates={case['coordinate_type']}"]
    )
    screen = (case["screen"][0], case["screen"][1])
    history = []
    for step in case["steps"]:
        text = _engine_text(step)
        assert parse_response(text, screen=screen, coordinates=cfg.agent.coordinates).actions  # it is played
        history.append(gui_rl_step(_png(case["screen"], step["color"]), text, step["finish_reason"]))
    shot = _png(case["screen"], case["current_color"])
    prompt = build_prompt(
        case["instruction"], history, shot, screen=screen, cfg=PromptConfig.from_config(cfg.agent)
    )
    expected = (DATA / f"{name}.txt").read_bytes().decode("utf-8")
    assert renderer.template_text(prompt.messages) == expected
    # what the engine tokenizes: the same text, each image's pad expanded to its token count
    ids = renderer.render(prompt.messages, prompt.images).input_ids
    decoded = renderer.tokenizer.decode(ids, skip_special_tokens=False)
    assert re.sub(r"(<\|image_pad\|>)+", "<|image_pad|>", decoded) == expected
