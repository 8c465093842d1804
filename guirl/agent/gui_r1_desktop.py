"""A GUI-R1 policy on a desktop: GUI-R1's prompt and answer format in guirl's episode loop.

With `agent.response_format = "gui_r1"` an env worker asks the policy as GUI-R1 was trained — one
screenshot, the instruction, the history of earlier actions as text, the full ("high") action space (or,
with `agent.gui_r1_actions = "low"`, its click-only one) — and
reads the `<answer>` list as unified actions mapped onto typed desktop actions (`guirl/agent/unified.py`):
the same policy that learnt on mobile, web and desktop grounding rows then acts on a real desktop. An answer
without any usable action, or with one a desktop cannot do (open_app, close), is a policy failure
(`ParseError`), as an unparseable computer-use response is.
"""

from __future__ import annotations

from guirl.agent.actions import AnyAction, Done
from guirl.agent.imaging import image_tokens, resize_image
from guirl.agent.parse import ParsedResponse, ParseError
from guirl.agent.prompt import (
    IMAGE_OVERHEAD_TOKENS,
    Prompt,
    PromptConfig,
    PromptTooLong,
    StepRecord,
    _target_size,
)
from guirl.agent.unified import gui_r1_prompt, parse_answer, render_answer, to_typed
from guirl.messages.types import ChatMessage, ImagePart, TextPart


def history_text(history: list[StepRecord]) -> str:
    """The earlier steps as GUI-R1's history: their action lines, numbered."""
    return " ".join(f"Step {i}: {s.action_line}" for i, s in enumerate(history, 1) if s.action_line)


def build_gui_r1_prompt(
    instruction: str,
    history: list[StepRecord],
    screenshot: bytes,
    *,
    cfg: PromptConfig,
    actions: str = "high",
) -> Prompt:
    """The GUI-R1 prompt of the next step: the current screenshot (resized as the policy's images are) and
    GUI-R1's instruction text with the earlier actions, offering GUI-R1's full action space (`high`) or its
    click-only one (`low`)."""
    size = _target_size(screenshot, cfg)
    text = gui_r1_prompt(instruction, history_text(history), actions)
    est = image_tokens(size[1], size[0], cfg.image_factor) + IMAGE_OVERHEAD_TOKENS + len(text.encode())
    if est > cfg.max_prompt_tokens:
        raise PromptTooLong(est, cfg.max_prompt_tokens)
    return Prompt(
        messages=[ChatMessage(role="user", parts=[ImagePart(0), TextPart(text)])],
        images=[resize_image(screenshot, *size)],
        image_sizes=[size],
        est_tokens=est,
        dropped_images=0,
    )


def parse_gui_r1(
    text: str, *, screen: tuple[int, int], image_size: tuple[int, int], max_calls: int = 5
) -> ParsedResponse:
    """The typed actions of a GUI-R1 answer (ParseError when there is none a desktop can do)."""
    answer = parse_answer(text)
    if not answer.actions:
        raise ParseError("no_tool_call", f"no GUI-R1 action in the answer ({answer.error or 'empty'})", text)
    actions: list[AnyAction] = []
    used = answer.actions[:max_calls]
    for u in used:
        try:
            typed = [Done()] if u.action == "complete" else to_typed(u, image_size=image_size, screen=screen)
        except ValueError as exc:
            raise ParseError("bad_arguments", f"{u.action}: {exc}", text) from None
        actions.extend(typed)
    line = render_answer(used)
    start = line.find("<answer>")
    return ParsedResponse(
        action_line=line[start + len("<answer>") : line.rfind("</answer>")] if start >= 0 else line,
        actions=actions,
        calls=[{"action": u.action, "point": u.point, "input_text": u.input_text} for u in used],
        dropped_calls=len(answer.actions) - len(used),
    )
