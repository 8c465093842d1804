"""The policy's prompt: Qwen3-VL's `computer_use` tool prompt, the screenshot history, a token budget.

Layout (that of OpenClaw-RL's GUI-RL, which is OSWorld's Qwen3-VL agent's):

    system     tools prompt (the `computer_use` schema and the response format)
    user       [screenshot of step i]            } for the last `history_images` past steps
    assistant  response of step i                }
    user       [current screenshot] + instruction and "Previous actions: Step 1: ... Step n: ..."

Every past step is listed by its action line; the newest ones are also shown as image + response turns.

`PromptConfig.style = "gui-rl"` reproduces the system turn and history text of OpenClaw-RL's GUI-RL agent
(`gui-rl/agents/qwen3vl_agent.py`), for evaluating checkpoints it trained: its tool-note wording, the tools
block a second time (passed as `tools=` to the chat template, as GUI-RL does), past responses with their
decoded stop token (`gui_rl_step`), its action-line rule (`gui_rl_action_line`) and "Execute the tool
call", and no token budget. tests/contract/test_gui_rl_prompt.py compares the result with GUI-RL's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from guirl.agent.imaging import image_size, image_tokens, resize_image, smart_resize
from guirl.messages.types import ChatMessage, ImagePart, TextPart

Coordinates = Literal["relative", "absolute"]
PromptStyle = Literal["guirl", "gui-rl"]

MESSAGE_OVERHEAD_TOKENS = 8
"""Chat-template tokens around each turn (`<|im_start|>role\\n` ... `<|im_end|>\\n`), rounded up."""
IMAGE_OVERHEAD_TOKENS = 2
"""`<|vision_start|>` and `<|vision_end|>` around each image's pad tokens."""
NO_ACTION_LINE = "Execute action"
"""What the history says for a step whose response had no `Action:` line. (GUI-RL records these words only
for a response it cannot execute, which ends its episode; its prompts say `GUI_RL_NO_ACTION_LINE`.)"""
GUI_RL_NO_ACTION_LINE = "Execute the tool call"
"""GUI-RL's history entry for an executed step without an `Action:` line (its `parse_response`)."""
GUI_RL_STOP_TEXT = "<|im_end|>"
"""The stop token as GUI-RL's recorded responses end when the engine stopped on it: GUI-RL keeps
`tokenizer.decode(output_ids)`, which holds the EOS SGLang appends (Qwen3-VL's chat checkpoints end a turn
with `<|im_end|>`; one that ended on `<|endoftext|>` would show that instead)."""
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
"""Special-token text a past response may hold (engines decode responses with special tokens kept) but a
prompt must not: the chat template parses it as the token, and a stray `<|image_pad|>` no longer matches
the images, so the engine aborts the request (an environment error for what the policy wrote)."""


class PromptTooLong(ValueError):
    """Even without history images the prompt exceeds the token budget."""

    def __init__(self, est: int, budget: int) -> None:
        super().__init__(f"prompt needs ~{est} tokens with no history images, budget is {budget}")
        self.est = est
        self.budget = budget


@dataclass
class PromptConfig:
    """How prompts are built (the fields of `guirl.config.schema.AgentConfig` of the same names)."""

    coordinates: Coordinates = "relative"
    style: PromptStyle = "guirl"
    history_images: int = 2
    max_prompt_tokens: int = 32768
    image_factor: int = 32
    min_pixels: int = 3136
    max_pixels: int = 16 * 16 * 4 * 12800

    @classmethod
    def from_config(cls, agent_cfg: Any) -> PromptConfig:
        """From any object with these attribute names (an `AgentConfig`)."""
        return cls(
            coordinates=agent_cfg.coordinates,
            style=agent_cfg.prompt_style,
            history_images=agent_cfg.history_images,
            max_prompt_tokens=agent_cfg.max_prompt_tokens,
            image_factor=agent_cfg.image_factor,
            min_pixels=agent_cfg.min_pixels,
            max_pixels=agent_cfg.max_pixels,
        )


@dataclass
class StepRecord:
    """One past step: the screenshot the policy saw, its full response, and its action summary."""

    screenshot: bytes
    """PNG as the VM returned it (resized when a prompt is built)."""
    response: str
    action_line: str
    """The `Action: ...` summary of the response (with or without the prefix), or "" if it had none."""
    # ((width, height), PNG): a step is in up to `history_images` prompts; resize it once.
    _resized: tuple[tuple[int, int], bytes] | None = field(
        default=None, init=False, repr=False, compare=False
    )


@dataclass
class Prompt:
    """A built prompt: `ImagePart(index=i)` in `messages` refers to `images[i]`."""

    messages: list[ChatMessage]
    images: list[bytes]
    """Smart-resized PNGs."""
    image_sizes: list[tuple[int, int]]
    """(width, height) of each image after resizing."""
    est_tokens: int
    dropped_images: int
    """History images left out to fit the token budget."""


# The tool description as Qwen's computer_use cookbook and OpenClaw-RL's GUI-RL word it (the model was
# tuned on it).
_DESCRIPTION_HEAD = [
    "Use a mouse and keyboard to interact with a computer, and take screenshots.",
    "* This is an interface to a desktop GUI. You do not have access to a terminal or applications menu. "
    "You must click on desktop icons to start applications.",
    "* Some applications may take time to start or process actions, so you may need to wait and take "
    "successive screenshots to see the results of your actions.",
]
_DESCRIPTION_TAIL = [
    "* Whenever you intend to move the cursor to click on an element like an icon, you should consult a "
    "screenshot to determine the coordinates of the element before moving the cursor.",
    "* If you tried clicking on a program or link but it failed to load even after waiting, try adjusting "
    "your cursor position so that the tip of the cursor visually falls on the element that you want to "
    "click.",
    "* Make sure to click any buttons, links, icons, etc with the cursor tip in the center of the element. "
    "Don't click boxes on their edges unless asked.",
]
_AT = "at a specified (x, y) pixel coordinate on the screen."
_ACTIONS = {
    "key": "Performs key down presses on the arguments passed in order, then performs key releases in "
    "reverse order.",
    "type": "Type a string of text on the keyboard.",
    "mouse_move": "Move the cursor to a specified (x, y) pixel coordinate on the screen.",
    "left_click": "Click the left mouse button " + _AT,
    "left_click_drag": "Click and drag the cursor to a specified (x, y) pixel coordinate on the screen.",
    "right_click": "Click the right mouse button " + _AT,
    "middle_click": "Click the middle mouse button " + _AT,
    "double_click": "Double-click the left mouse button " + _AT,
    # The cookbook's "(simulated as double-click ...)" and "(mapped to regular scroll)" notes are dropped:
    # here both are executed as what they say.
    "triple_click": "Triple-click the left mouse button " + _AT,
    "scroll": "Performs a scroll of the mouse scroll wheel.",
    "hscroll": "Performs a horizontal scroll.",
    "wait": "Wait specified seconds for the change to happen.",
    "terminate": "Terminate the current task and report its completion status.",
}
# GUI-RL's wording of the two notes (its `get_tool_spec`), and the indentation its triple-quoted action
# description ends with: a checkpoint it trained saw these bytes.
_GUI_RL_ACTIONS = _ACTIONS | {
    "triple_click": "Triple-click the left mouse button at a specified (x, y) pixel coordinate on the screen "
    "(simulated as double-click since it's the closest action).",
    "hscroll": "Performs a horizontal scroll (mapped to regular scroll).",
}
_GUI_RL_DESCRIPTION_END = "\n        "
_TOOLS_HEAD = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_TAIL = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
"""Qwen's `# Tools` block around the schema: what its chat templates write for `tools=`, and what the
system prompt states itself."""
_RESPONSE_FORMAT = """# Response format

Response format for every step:
1) Action: a short imperative describing what to do in the UI.
2) A single <tool_call>...</tool_call> block containing only the JSON: \
{"name": <function-name>, "arguments": <args-json-object>}.

Rules:
- Output exactly in the order: Action, <tool_call>.
- Be brief: one sentence for Action.
- Do not output anything else outside those parts.
- If finishing, use action=terminate in the tool call."""


def tool_spec(
    width: int, height: int, coordinates: Coordinates, style: PromptStyle = "guirl"
) -> dict[str, Any]:
    """The `computer_use` function schema (also what a chat template's `tools=` takes), worded as `style`
    says."""
    if style not in ("guirl", "gui-rl"):
        raise ValueError(f"style must be 'guirl' or 'gui-rl', got {style!r}")
    if coordinates == "relative":
        width, height = 1000, 1000  # a 0-999 grid over the screen, whatever its size
    elif coordinates != "absolute":
        raise ValueError(f"coordinates must be 'relative' or 'absolute', got {coordinates!r}")
    description = [*_DESCRIPTION_HEAD, f"* The screen's resolution is {width}x{height}.", *_DESCRIPTION_TAIL]
    notes = _GUI_RL_ACTIONS if style == "gui-rl" else _ACTIONS
    end = _GUI_RL_DESCRIPTION_END if style == "gui-rl" else "\n"
    actions = "\n" + "\n".join(f"* `{name}`: {text}" for name, text in notes.items()) + end
    return {
        "type": "function",
        "function": {
            "name_for_human": "computer_use",
            "name": "computer_use",
            "description": "\n".join(description),
            "parameters": {
                "properties": {
                    "action": {"description": actions, "enum": list(_ACTIONS), "type": "string"},
                    "keys": {"description": "Required only by `action=key`.", "type": "array"},
                    "text": {"description": "Required only by `action=type`.", "type": "string"},
                    "coordinate": {"description": "The x,y coordinates for mouse actions.", "type": "array"},
                    "pixels": {"description": "The amount of scrolling.", "type": "number"},
                    "time": {"description": "The seconds to wait.", "type": "number"},
                    "status": {
                        "description": "The status of the task.",
                        "type": "string",
                        "enum": ["success", "failure"],
                    },
                },
                "required": ["action"],
                "type": "object",
            },
            "args_format": "Format the arguments as a JSON object.",
        },
    }


def system_prompt(width: int, height: int, coordinates: Coordinates, style: PromptStyle = "guirl") -> str:
    """The system prompt: the tool schema in Qwen's `# Tools` block, then the response format.

    `width` x `height` is the resized screenshot's size, stated as the screen resolution in `absolute`
    mode (the model answers in pixels of the image it saw); `relative` mode states 1000x1000."""
    spec = json.dumps(tool_spec(width, height, coordinates, style))
    return _TOOLS_HEAD + spec + _TOOLS_TAIL + "\n\n" + _RESPONSE_FORMAT


def instruction_text(instruction: str, action_lines: list[str], style: PromptStyle = "guirl") -> str:
    """The final user turn's text: the task and every previous step's action line (in `gui-rl` style, the
    line as `gui_rl_action_line` extracted it)."""
    if style == "gui-rl":
        entries = [line or GUI_RL_NO_ACTION_LINE for line in action_lines]
    else:
        entries = [_summary(line) for line in action_lines]
    steps = "\n".join(f"Step {i}: {entry}" for i, entry in enumerate(entries, 1))
    return (
        "Please generate the next move according to the UI screenshot, instruction and previous actions.\n\n"
        f"Instruction: {instruction}\n\n"
        f"Previous actions:\n{steps or 'None'}"
    )


def _summary(action_line: str) -> str:
    line = action_line.strip()
    if line[:7].lower() == "action:":
        line = line[7:].strip()
    return line or NO_ACTION_LINE


def gui_rl_action_line(response: str) -> str:
    """A step's history entry by GUI-RL's rule (its `parse_response`): the text after the first colon of the
    first line of the whole response (reasoning and tool-call lines included) that, stripped, starts with
    `action:` in any case; stripped. A line whose entry is empty does not count. "" when there is none."""
    for raw in response.split("\n"):
        line = raw.strip()
        if line.lower().startswith("action:"):
            entry = line.split(":", 1)[-1].strip()
            if entry:
                return entry
    return ""


def gui_rl_step(screenshot: bytes, text: str, finish_reason: str) -> StepRecord:
    """A past step as GUI-RL records it: the response with its decoded stop token when the engine stopped on
    one (`GUI_RL_STOP_TEXT`; the chat template then closes the turn after it), and its action line by
    `gui_rl_action_line`. `text` is the engine's text (without the stop token, as guirl's engines give it).
    The env worker asks for no stop strings, so `stop` means the model's own end of turn."""
    response = text + GUI_RL_STOP_TEXT if finish_reason == "stop" else text
    return StepRecord(screenshot, response, gui_rl_action_line(response))


def past_response(text: str) -> str:
    """A past response as the history shows it: verbatim, less the vision tokens (`VISION_TOKENS`)."""
    for token in VISION_TOKENS:
        text = text.replace(token, "")
    return text


def _byte_len(text: str) -> int:
    # Each byte-level BPE token covers at least one byte, so this never underestimates.
    return len(text.encode("utf-8", "surrogatepass"))


def _target_size(data: bytes, cfg: PromptConfig) -> tuple[int, int]:
    """(width, height) the image will have in the prompt (read from its header, nothing decoded)."""
    w, h = image_size(data)
    rh, rw = smart_resize(h, w, cfg.image_factor, cfg.min_pixels, cfg.max_pixels)
    return rw, rh


def _step_image(step: StepRecord, size: tuple[int, int]) -> bytes:
    if step._resized is None or step._resized[0] != size:
        step._resized = (size, resize_image(step.screenshot, *size))
    return step._resized[1]


def keep_resized(step: StepRecord, prompt: Prompt) -> None:
    """`step` showed `prompt`'s current screen: keep that screen as the prompt resized it, so that as history
    it is not decoded, resized and encoded again (at 1920x1080 that is most of an env worker's CPU)."""
    step._resized = (prompt.image_sizes[-1], prompt.images[-1])


def build_prompt(
    instruction: str,
    history: list[StepRecord],
    screenshot: bytes,
    *,
    screen: tuple[int, int],
    cfg: PromptConfig,
    count_tokens: Callable[[str], int] | None = None,
) -> Prompt:
    """The prompt for the next step, given the past steps (oldest first) and the current screenshot.

    `screen` is the VM's (width, height), which `parse_response` maps coordinates onto; the prompt itself
    depends only on the screenshots. History images are dropped oldest first until the estimate fits
    `cfg.max_prompt_tokens`; the current screenshot never is, and `PromptTooLong` says when even that is
    not enough. `count_tokens` defaults to the UTF-8 length, an upper bound for byte-level BPE.

    In `gui-rl` style (`cfg.style`) the system message also carries the tool schema for the chat template
    (`ChatMessage.tools`), the history entries are the steps' `gui_rl_action_line`s (make the records with
    `gui_rl_step`), and nothing is dropped for the budget: GUI-RL has none (an engine refuses a prompt past
    its context)."""
    count = count_tokens or _byte_len
    gui_rl = cfg.style == "gui-rl"
    current_size = _target_size(screenshot, cfg)
    system = system_prompt(*current_size, cfg.coordinates, cfg.style)
    tools = [json.dumps(tool_spec(*current_size, cfg.coordinates, cfg.style))] if gui_rl else []
    user_text = instruction_text(instruction, [s.action_line for s in history], cfg.style)

    def img_cost(size: tuple[int, int]) -> int:
        return image_tokens(size[1], size[0], cfg.image_factor) + IMAGE_OVERHEAD_TOKENS

    base = count(system) + count(user_text) + img_cost(current_size) + 2 * MESSAGE_OVERHEAD_TOKENS
    base += sum(count("\n\n" + _TOOLS_HEAD + spec + _TOOLS_TAIL) for spec in tools)  # the template's block
    shown = history[max(0, len(history) - cfg.history_images) :] if cfg.history_images > 0 else []
    turns = [(step, _target_size(step.screenshot, cfg)) for step in shown]
    responses = [past_response(step.response) for step, _ in turns]
    costs = [
        img_cost(size) + count(text) + 2 * MESSAGE_OVERHEAD_TOKENS
        for (_, size), text in zip(turns, responses)
    ]
    est, dropped = base + sum(costs), 0
    while est > cfg.max_prompt_tokens and dropped < len(turns) and not gui_rl:
        est -= costs[dropped]  # the step stays in "Previous actions" as its action line
        dropped += 1
    if est > cfg.max_prompt_tokens and not gui_rl:
        raise PromptTooLong(est, cfg.max_prompt_tokens)

    messages = [ChatMessage(role="system", parts=[TextPart(system)], tools=tools)]
    images: list[bytes] = []
    sizes: list[tuple[int, int]] = []
    for (step, size), text in zip(turns[dropped:], responses[dropped:]):
        messages.append(ChatMessage(role="user", parts=[ImagePart(len(images))]))
        messages.append(ChatMessage(role="assistant", parts=[TextPart(text)]))
        images.append(_step_image(step, size))
        sizes.append(size)
    messages.append(ChatMessage(role="user", parts=[ImagePart(len(images)), TextPart(user_text)]))
    images.append(resize_image(screenshot, *current_size))
    sizes.append(current_size)
    return Prompt(messages=messages, images=images, image_sizes=sizes, est_tokens=est, dropped_images=dropped)
