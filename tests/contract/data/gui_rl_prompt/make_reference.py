"""Write GUI-RL's rendered policy prompt for each case of cases.json, with GUI-RL's own code.

Not run by the tests (they read the files it wrote); README.md says how these were made. It plays each case
through OpenClaw-RL's `Qwen3VLAgentLocal` as `gui-rl/generate_with_gui.py` drives it (build the messages,
parse the response, record the turn; a step without executable actions would end GUI-RL's episode, so none
may be in a case), then renders the next step's messages as its `generate_with_sglang` does:
`apply_chat_template(messages, tokenize=False, add_generation_prompt=True, tools=[tool_spec])`, here with
transformers' `render_jinja_template` (what `apply_chat_template` calls) and Qwen3-VL-Thinking's template.

    python make_reference.py --gui-rl OPENCLAW_RL/gui-rl --llm-family xinference/model/llm/llm_family.json

Needs transformers (4.57.1, OpenClaw-RL's pin), Jinja2 and Pillow; not guirl. The `slime.*` modules the agent
imports are stubbed: nothing used here touches them.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE_ENTRY = "Qwen3-VL-Thinking"


def _stub_slime() -> None:
    names = {
        "slime.rollout.sglang_rollout": {"GenerateState": type("GenerateState", (), {})},
        "slime.utils.http_utils": {"post": None},
        "slime.utils.mask_utils": {"MultiTurnLossMaskGenerator": type("MultiTurnLossMaskGenerator", (), {})},
        "slime.utils.processing_utils": {
            "encode_image_for_rollout_engine": None,
            "process_vision_info": None,
        },
    }
    for name in ["slime", "slime.rollout", "slime.utils", *names]:
        module = types.ModuleType(name)
        module.__dict__.update(names.get(name, {}))
        sys.modules[name] = module


def _png(size: list[int], color: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", tuple(size), color).save(buf, format="PNG")
    return buf.getvalue()


def render_case(case: dict, template: str) -> str:
    from agents.qwen3vl_agent import Qwen3VLAgentLocal
    from transformers.utils.chat_template_utils import render_jinja_template

    agent = Qwen3VLAgentLocal(max_image_history_length=3, coordinate_type=case["coordinate_type"])
    agent.reset(logging.getLogger("gui-rl"))
    width, height = case["screen"]
    for step in case["steps"]:
        shot = _png(case["screen"], step["color"])
        ctx = agent.build_policy_messages(case["instruction"], {"screenshot": shot})
        response = step["decoded"]
        action, actions, _ = agent.parse_response(
            response, width, height, ctx["processed_width"], ctx["processed_height"]
        )
        if not actions or actions[0] == "":
            raise SystemExit(f"GUI-RL would end the episode at {response!r}: no executable action")
        agent.record_policy_turn(
            action_text=action or "Execute action", response=response, screenshot_bytes=shot
        )
    ctx = agent.build_policy_messages(
        case["instruction"], {"screenshot": _png(case["screen"], case["current_color"])}
    )
    print(f"{case['coordinate_type']}: previous actions {agent.actions}", file=sys.stderr)
    rendered, _ = render_jinja_template(
        conversations=[ctx["messages"]],
        tools=[ctx["tool_spec"]],
        chat_template=template,
        add_generation_prompt=True,
    )
    return rendered[0] if isinstance(rendered, list) else rendered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--gui-rl", required=True, type=Path, help="the gui-rl/ folder of an OpenClaw-RL checkout"
    )
    parser.add_argument("--llm-family", required=True, type=Path, help="Xinference's llm_family.json")
    args = parser.parse_args()
    _stub_slime()
    sys.path.insert(0, str(args.gui_rl))
    family = json.loads(args.llm_family.read_text())
    (template,) = [entry["chat_template"] for entry in family if entry.get("model_name") == TEMPLATE_ENTRY]
    cases = json.loads((HERE / "cases.json").read_text())["cases"]
    for name, case in cases.items():
        text = render_case(case, template)
        (HERE / f"{name}.txt").write_text(text, encoding="utf-8")
        print(f"{name}.txt: {len(text)} characters", file=sys.stderr)


if __name__ == "__main__":
    main()
