"""An engine that plays back scripts: the whole loop (prompt, parse, act, score) without a model.

`<script_dir>/<task_id>.jsonl` holds one line per step, either a typed action as `load_solution` reads
them (`{"type": "click", "x": 10, "y": 20}`) or a recorded response (`{"response": "Action: ...\\n
<tool_call>...</tool_call>"}`, e.g. a trajectory's lines). Step n is answered with line n rendered as
the model would write it (Qwen3-VL's computer-use tool call, or GUI-R1's answer with
`response_format="gui_r1"`); past the end, with `terminate success` (GUI-R1: `complete`).

With `tokens`, results carry token ids and log-probs as a model's engine reports them, so a train run with a
simulated learner (`guirl.learner.simulated`) runs on scripts: the response's UTF-8 bytes are its ids
(log-prob 0 each: the script is certain); the prompt's ids are one per 4 bytes of its text (about what a BPE
tokenizer gives for English), with each image as Qwen3-VL's count of its tokens (`IMAGE_TOKEN` repeated), so
a trajectory weighs about what a real one does.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import msgspec

from guirl.agent.actions import AnyAction, Done
from guirl.agent.imaging import image_size, image_tokens, smart_resize
from guirl.agent.parse import Coordinates
from guirl.agent.render import render_response
from guirl.agent.unified import from_typed, render_answer
from guirl.inference.base import EngineError, GenRequest, GenResult, stamp, took_weights
from guirl.messages.types import ImagePart
from guirl.messages.weights import WeightSource

_TASK_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")
ScriptLine = AnyAction | str
"""A typed action to render, or a verbatim response."""
IMAGE_TOKEN = 256
"""The id an image's tokens take in a scripted prompt (bytes are 0-255)."""


class ScriptedEngine:
    """Answers each request from its task's script (see the module docstring); no weights."""

    max_inflight = 0  # static batches (Engine.max_inflight)

    def __init__(
        self,
        name: str,
        script_dir: str | Path,
        *,
        screen: tuple[int, int],
        coordinates: Coordinates = "relative",
        response_format: str = "computer_use",
        latency_s: float = 0.0,
        latency_jitter: float = 0.0,
        max_batch: int = 8,
        tokens: bool = False,
    ) -> None:
        self.name = name
        self.policy_version = -1
        self.max_batch = max_batch
        self.supports_tokens = tokens
        self.script_dir = Path(script_dir)
        self.screen = screen
        self.coordinates: Coordinates = coordinates
        if response_format not in ("computer_use", "gui_r1"):
            raise ValueError(f"response_format {response_format!r}: computer_use or gui_r1")
        self.response_format = response_format
        self.latency_s = latency_s
        if not 0 <= latency_jitter <= 1:
            raise ValueError(f"latency_jitter {latency_jitter}: a fraction of latency_s, 0 to 1")
        self.latency_jitter = latency_jitter
        self._rng = random.Random(name)
        self._scripts: dict[str, list[ScriptLine]] = {}

    async def start(self) -> None:
        """Nothing to load: scripts are read on first use."""

    async def generate(self, batch: list[GenRequest]) -> list[GenResult]:
        """The scripted response of each request's (task, step), after one simulated generation delay
        (`latency_s`, give or take `latency_jitter` of it)."""
        started = time.monotonic()
        # a bad request fails the batch before the wait
        texts = [self._answer(request) for request in batch]
        prompts = [_prompt_ids(request) for request in batch] if self.supports_tokens else []
        if self.latency_s > 0:
            jitter = self.latency_jitter * self._rng.uniform(-1, 1)
            await asyncio.sleep(self.latency_s * (1 + jitter))
        results = [GenResult(text=text, finish_reason="stop") for text in texts]
        for result, prompt in zip(results, prompts):  # with `tokens`
            result.prompt_ids = prompt
            result.response_ids = list(result.text.encode())
            result.logprobs = [0.0] * len(result.response_ids)
        return stamp(results, self, started)

    async def health(self) -> bool:
        """Always able to serve."""
        return True

    async def update_weights(
        self, version: int, source: WeightSource, *, epoch: int = 0, rank: int = 1
    ) -> None:
        """Record the version (there are no weights)."""
        took_weights(self, version, epoch)

    async def close(self) -> None:
        """Nothing to release."""

    def _answer(self, request: GenRequest) -> str:
        script = self._script(request.task_id)
        line: ScriptLine = script[request.step] if 0 <= request.step < len(script) else Done()
        if isinstance(line, str):
            return line
        seen = None
        if self.coordinates == "absolute" or self.response_format == "gui_r1":
            seen = image_size(request.images[-1]) if request.images else self.screen
        try:
            if self.response_format == "gui_r1":  # GUI-R1's answer, its points in the image's pixels
                return render_answer([from_typed(line, image_size=seen, screen=self.screen)])
            return render_response([line], screen=self.screen, coordinates=self.coordinates, image_size=seen)
        except ValueError as exc:
            raise EngineError(f"{request.task_id} step {request.step}: {exc}", retryable=False) from None

    def _script(self, task_id: str) -> list[ScriptLine]:
        if task_id not in self._scripts:
            # The id names a file: refuse anything that could leave `script_dir`.
            if not _TASK_ID.fullmatch(task_id) or set(task_id) == {"."}:
                raise EngineError(f"task id {task_id!r} cannot name a script", retryable=False)
            path = self.script_dir / f"{task_id}.jsonl"
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise EngineError(f"no script for task {task_id!r}: {exc}", retryable=False) from None
            self._scripts[task_id] = _parse_script(path, text)
        return self._scripts[task_id]


def _prompt_ids(request: GenRequest) -> list[int]:
    """A scripted prompt's ids (see the module docstring): given ids as they are, else one per 4 bytes of
    each text part and each image's Qwen3-VL token count (read from its header)."""
    if request.prompt_ids is not None:
        return list(request.prompt_ids)
    ids: list[int] = []
    for message in request.messages:
        for tool in message.tools:  # the template writes the tools' schemas into the prompt
            ids += tool.encode()[::4]
        for part in message.parts:
            if not isinstance(part, ImagePart):
                ids += part.text.encode()[::4]
                continue
            if not 0 <= part.index < len(request.images):
                raise EngineError(f"image {part.index} of {len(request.images)}", retryable=False)
            try:
                w, h = image_size(request.images[part.index])
                ids += [IMAGE_TOKEN] * image_tokens(*smart_resize(h, w))
            except (OSError, ValueError) as exc:  # not an image Pillow reads, or no size it can take
                raise EngineError(f"image {part.index}: {exc}", retryable=False) from None
    return ids


def _parse_script(path: Path, text: str) -> list[ScriptLine]:
    lines: list[ScriptLine] = []
    last_step: Any = None
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise EngineError(f"{path}:{n}: not JSON: {exc}", retryable=False) from None
        if not isinstance(obj, dict) or not ("type" in obj or isinstance(obj.get("response"), str)):
            raise EngineError(f"{path}:{n}: neither a typed action nor a response line", retryable=False)
        if "type" in obj:
            try:
                lines.append(msgspec.json.decode(raw, type=AnyAction))  # as `load_solution` reads it
            except msgspec.ValidationError as exc:
                raise EngineError(f"{path}:{n}: not a typed action: {exc}", retryable=False) from None
            continue
        # A trajectory writes one line per executed action, repeating the step's response: keep one.
        step = obj.get("step_num", obj.get("step"))
        if step is None or step != last_step:
            lines.append(obj["response"])
        last_step = step
    return lines


def scripted_verdict(episode_id: str, step: int, invalid_every: int = 0) -> int | None:
    """The scripted judge's verdict on a step: +1 or -1 from a stable hash of (episode, step), or None (an
    answer without a score) for every `invalid_every`-th hash. Tests compute the expected scores with it."""
    import hashlib

    h = int.from_bytes(hashlib.sha256(f"{episode_id}:{step}".encode()).digest()[:8], "big")
    if invalid_every and h % invalid_every == 0:
        return None
    return 1 if (h >> 16) % 2 == 0 else -1


class ScriptedJudgeEngine:
    """A PRM judge without a model: answers each judge request with `scripted_verdict` of its episode and
    step, as a judge would write it (reasoning, then `\\boxed{...}`), after `latency_s` per call."""

    supports_tokens = False
    max_inflight = 0  # static batches (Engine.max_inflight)

    def __init__(
        self, name: str, *, latency_s: float = 0.0, invalid_every: int = 0, max_batch: int = 8
    ) -> None:
        self.name = name
        self.policy_version = -1
        self.max_batch = max_batch
        self.latency_s = latency_s
        self.invalid_every = invalid_every

    async def start(self) -> None:
        """Nothing to load."""

    async def generate(self, batch: list[GenRequest]) -> list[GenResult]:
        """Each request's verdict, after one fixed delay per call."""
        started = time.monotonic()
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        results = []
        for r in batch:
            verdict = scripted_verdict(r.episode_id, r.step, self.invalid_every)
            text = (
                "The next observation is unreadable to me, so I give no score."
                if verdict is None
                else f"Judging step {r.step} of {r.episode_id}: the verdict is \\boxed{{{verdict}}}"
            )
            results.append(GenResult(text=text, finish_reason="stop"))
        return stamp(results, self, started)

    async def health(self) -> bool:
        """Always able to serve."""
        return True

    async def update_weights(
        self, version: int, source: WeightSource, *, epoch: int = 0, rank: int = 1
    ) -> None:
        """A judge is not trained."""

    async def close(self) -> None:
        """Nothing to release."""
