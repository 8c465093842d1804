"""The judge's prompt: a template (built in, or a TOML file) filled with one step of an episode.

A template is a system text and a user text with placeholders. Only six exact tokens are placeholders:
`{instruction}`, `{previous_actions}`, `{response}`, `{history}`, `{before}`, `{after}`, each at most
once; `{response}`, `{before}` and `{after}` are required. Every other brace is literal text, so the
template can ask for `\\boxed{1}`. Values are inserted as they are and never scanned again: a policy
response that writes `{after}` or `\\boxed{1}` stays text and cannot add an image or change the question.

Every score records its template's `version` (name and a hash of its text), so a study can tell which
judge prompt produced it.
"""

from __future__ import annotations

import hashlib
import io
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from guirl.agent.imaging import smart_resize
from guirl.agent.prompt import VISION_TOKENS
from guirl.errors import InputError
from guirl.messages.types import ChatMessage, ImagePart, TextPart

__all__ = ["BUILTIN_TEMPLATES", "JudgePrompt", "JudgeTemplate", "build_judge_prompt", "load_template"]

PLACEHOLDERS = ("instruction", "previous_actions", "response", "history", "before", "after")
REQUIRED = ("response", "before", "after")
_PLACEHOLDER = re.compile(r"\{(instruction|previous_actions|response|history|before|after)\}")
_IDENTIFIER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
"""A token that looks like a placeholder (`{foo}`); `\\boxed{}`, `\\boxed{1}` and `{-1}` do not."""
_VISION = re.compile("|".join(re.escape(t) for t in VISION_TOKENS))
CUT_MARKER = "[...]"
"""Where a too-long text was cut."""

# TOML basic strings ("""): a backslash at a line's end joins the lines, and `\\boxed` is `\boxed`.
_V1 = r'''
name = "guirl-prm-v1"
system = """\
You evaluate the latest step of an agent that operates a graphical user interface. You are given: \
1) the history of the agent's interaction with the environment, 2) the objective the agent pursues, \
and 3) the agent's latest step, which is the one to evaluate."""
user = """\
Previous actions:
{previous_actions}

{history}Agent's current observation:
{before}
Objective: {instruction}

Agent's latest step (reasoning and action):
{response}

Next observation after executing this action:
{after}
Score the latest step +1 only if ALL of the following hold:
- The step is clearly relevant to the objective.
- The action can be executed and is coherent with the next observation.
- The next observation shows concrete progress toward the objective (the step is not a no-op).

Otherwise score it -1: for instance when the step is wrong, irrelevant or impossible, has no visible \
effect, undoes earlier progress, contradicts the next observation, or describes things that are not there.

Think carefully, then give your reasoning and put the final score in \\boxed{}: \\boxed{1} or \\boxed{-1}."""
'''

BUILTIN_TEMPLATES: dict[str, str] = {"guirl-prm-v1": _V1}
"""Built-in judge templates: name -> TOML source, in the format a template file has."""
_ALIASES = {"v1": "guirl-prm-v1"}
_KEYS = ("name", "system", "user")


@dataclass(frozen=True)
class JudgeTemplate:
    """A judge prompt template; construction checks its placeholders (ValueError) and sets `version`."""

    name: str
    system: str
    user: str
    """The user message text, with placeholders."""
    version: str = field(init=False)
    """`name@hash` of the text: recorded with every score (computed here, so it cannot disagree)."""

    def __post_init__(self) -> None:
        _check_template(self.name, self.system, self.user)
        digest = hashlib.sha256(f"{self.system}\0{self.user}".encode()).hexdigest()[:12]
        object.__setattr__(self, "version", f"{self.name}@{digest}")


def _check_template(name: str, system: str, user: str) -> None:
    if not name or "@" in name or not name.isprintable():
        raise ValueError(f"`name` {name!r} must be non-empty, printable and without '@'")
    unknown = sorted({m for m in _IDENTIFIER.findall(user) if m not in PLACEHOLDERS})
    if unknown:
        raise ValueError(
            f"`user` has unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; "
            f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
        )
    if _VISION.search(system) or _VISION.search(user):
        raise ValueError(f"the template contains a vision token (one of {list(VISION_TOKENS)})")
    in_system = sorted(set(_PLACEHOLDER.findall(system)))
    if in_system:  # it would stay literal there, which is never what the author meant
        raise ValueError(f"`system` has placeholder(s) {in_system}: they are filled only in `user`")
    used = _PLACEHOLDER.findall(user)
    for key in PLACEHOLDERS:
        if used.count(key) > 1:
            raise ValueError(f"`user` uses {{{key}}} {used.count(key)} times (at most once)")
    missing = [key for key in REQUIRED if key not in used]
    if missing:
        raise ValueError(f"`user` lacks required placeholder(s) {', '.join('{' + k + '}' for k in missing)}")


def load_template(spec: str | Path) -> JudgeTemplate:
    """A built-in template by name (`guirl-prm-v1`, alias `v1`), else the TOML file at path `spec`, with
    string keys `system` and `user` and an optional `name` (default: the file's stem).

    InputError naming the file and the problem: unreadable, not TOML, a key missing, unknown or not a
    string, an unknown, missing or repeated placeholder."""
    key = _ALIASES.get(str(spec), str(spec))
    if key in BUILTIN_TEMPLATES:
        return _from_toml(BUILTIN_TEMPLATES[key], origin=f"built-in template {key!r}", default_name=key)
    path = Path(spec)
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            f"{path}: no such judge template file (built-in templates: "
            f"{', '.join([*BUILTIN_TEMPLATES, *_ALIASES])})"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read judge template: {exc}") from None
    return _from_toml(source, origin=str(path), default_name=path.stem)


def _from_toml(source: str, *, origin: str, default_name: str) -> JudgeTemplate:
    try:
        doc = tomllib.loads(source)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{origin}: not valid TOML: {exc}") from None
    extra = sorted(set(doc) - set(_KEYS))
    if extra:  # a misspelt key would otherwise be ignored without a word
        raise InputError(f"{origin}: unknown key(s) {extra}; a judge template has {list(_KEYS)}")
    doc.setdefault("name", default_name)
    for k in _KEYS:
        if k not in doc:
            raise InputError(f"{origin}: missing key `{k}` (a string)")
        if not isinstance(doc[k], str):
            raise InputError(f"{origin}: key `{k}` must be a string, got {type(doc[k]).__name__}")
    try:
        return JudgeTemplate(name=doc["name"], system=doc["system"], user=doc["user"])
    except ValueError as exc:
        raise InputError(f"{origin}: {exc}") from None


@dataclass(frozen=True)
class JudgePrompt:
    """A built judge prompt: `ImagePart(index=i)` in `messages` refers to `images[i]`."""

    messages: list[ChatMessage]
    """[system, user]."""
    images: list[bytes]
    """PNGs, resized for the judge's vision encoder."""
    image_sizes: list[tuple[int, int]]
    """(width, height) of each image after resizing."""


_CONTROL = re.compile(r"<\|[A-Za-z0-9_]{1,64}\|>")
"""Qwen's special-token spellings (`<|im_end|>`, `<|im_start|>`, `<|image_pad|>`, ...)."""


def _clean(text: str) -> str:
    # A chat template parses special-token text as the token. A stray `<|image_pad|>` would no longer match
    # the images and the engine would abort the request; an `<|im_end|><|im_start|>assistant` in a policy
    # response would end the judge's user turn and could put words in its mouth (a policy trained on the
    # judge's scores is rewarded for finding that). A space, not "", takes each one's place, so
    # "<|image<|image_pad|>_pad|>" cannot close up into a new token.
    return _CONTROL.sub(" ", text)


def _head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + CUT_MARKER


def _tail(text: str, limit: int) -> str:
    # The action is at the end of a response: keep that, cut the reasoning before it.
    return text if len(text) <= limit else CUT_MARKER + text[len(text) - limit :]


def _prepare_image(data: bytes, which: str, factor: int, max_pixels: int) -> tuple[bytes, tuple[int, int]]:
    """The image as the judge sees it (PNG, smart-resized) and its (width, height)."""
    try:
        img = Image.open(io.BytesIO(data))  # in memory: nothing to close
        img.load()  # open() is lazy: decode now so truncated data fails here, not in the judge's engine
    except Exception as exc:  # Pillow raises many types (OSError, SyntaxError, zlib.error, ...) for bad data
        raise ValueError(f"{which} image does not decode ({len(data)} bytes): {exc}") from exc
    size = _judge_size(*img.size, which, factor, max_pixels)
    if size == img.size and img.format == "PNG":
        return data, size
    # RGB and bicubic, as `guirl.agent.imaging.resize_image` (and Qwen's processor) make them.
    out = img.convert("RGB")
    if size != out.size:
        out = out.resize(size, Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    out.save(buf, format="PNG")
    return buf.getvalue(), size


def _judge_size(width: int, height: int, which: str, factor: int, max_pixels: int) -> tuple[int, int]:
    # smart_resize's min_pixels default (4 cells) assumes factor 32; keep it 4 cells, and never above the cap.
    min_pixels = min(4 * factor * factor, max_pixels)
    try:
        h, w = smart_resize(height, width, factor, min_pixels, max_pixels)
    except ValueError as exc:
        raise ValueError(f"{which} image ({width}x{height}): {exc}") from None
    if h <= 0 or w <= 0:  # smart_resize floors to 0 when max_pixels is below one factor x factor cell
        raise ValueError(f"{which} image ({width}x{height}): max_pixels={max_pixels} < {factor}x{factor}")
    return w, h


def build_judge_prompt(
    template: JudgeTemplate,
    *,
    instruction: str,
    previous_actions: Sequence[str],
    response: str,
    before: bytes,
    after: bytes,
    history: Sequence[tuple[bytes, str]] = (),
    max_pixels: int = 16 * 16 * 4 * 12800,
    factor: int = 32,
    max_text_chars: int = 20000,
) -> JudgePrompt:
    """The judge's prompt for one step: `before` and `after` are the screenshots around it, `response`
    the policy's full text, `previous_actions` the action lines of all earlier steps (oldest first).

    `history` holds (screenshot, action line) of the last earlier steps, oldest first, its last entry the
    step just before this one; they are shown as images where the template has `{history}` (else they are
    left out and every earlier step is listed in `{previous_actions}`). Instruction, response and action
    lines longer than `max_text_chars` are cut (the response keeps its end). ValueError names an image
    that does not decode."""
    if max_text_chars < 1 or factor < 1:
        raise ValueError(f"max_text_chars ({max_text_chars}) and factor ({factor}) must be positive")
    shown = list(history) if "{history}" in template.user else []
    if len(shown) > len(previous_actions):
        raise ValueError(f"{len(shown)} history images but only {len(previous_actions)} previous actions")
    listed = previous_actions[: len(previous_actions) - len(shown)]
    first_shown = len(listed) + 1  # step number of history[0]

    images: list[bytes] = []
    sizes: list[tuple[int, int]] = []
    parts: list[TextPart | ImagePart] = []

    def text(value: str) -> None:
        if not value:
            return
        if parts and isinstance(parts[-1], TextPart):
            parts[-1] = TextPart(parts[-1].text + value)
        else:
            parts.append(TextPart(value))

    def image(data: bytes, which: str) -> None:
        png, size = _prepare_image(data, which, factor, max_pixels)
        parts.append(ImagePart(len(images)))
        images.append(png)
        sizes.append(size)

    def action(line: str) -> str:
        return _head(_clean(line), max_text_chars)

    values = {
        "instruction": _head(_clean(instruction), max_text_chars),
        "response": _tail(_clean(response), max_text_chars),
        "previous_actions": "\n".join(f"Step {i}: {action(a)}" for i, a in enumerate(listed, 1)) or "None",
    }
    # Split on the placeholders once: the odd pieces are placeholder names, the even ones template text,
    # so nothing inserted is ever looked at again.
    for k, piece in enumerate(_PLACEHOLDER.split(template.user)):
        if k % 2 == 0:
            text(piece)
        elif piece == "before":
            image(before, "before")
        elif piece == "after":
            image(after, "after")
        elif piece == "history":
            for j, (png, line) in enumerate(shown):
                text("Image of environment:\n")
                image(png, f"history {j} (step {first_shown + j})")
                text(f"\nAction of agent:\nStep {first_shown + j}: {action(line)}\n")
        else:
            text(values[piece])
    messages = [
        ChatMessage(role="system", parts=[TextPart(template.system)]),
        ChatMessage(role="user", parts=parts),
    ]
    return JudgePrompt(messages=messages, images=images, image_sizes=sizes)
