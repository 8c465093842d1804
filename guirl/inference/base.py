"""The one interface every inference engine implements, shaped after SGLang's `/generate`.

A request is a chat prompt (text and images) or exact prompt token ids with images alongside, plus
sampling settings; a result carries the exact prompt ids the engine used, the response ids, one
behaviour log-prob per response token, and the finish reason. Engines that cannot return tokens (an
OpenAI-compatible endpoint) leave the token fields `None` and say so with `supports_tokens = False`:
such an engine is for evaluation only.

Weights: an engine has a `policy_version` (the learner's version of the weights it serves; -1 for the
checkpoint it started from) and a `policy_epoch` (the learner lineage that version belongs to, 0 at start;
see `WeightsPublished.epoch`). `update_weights` takes them from where the learner says
(`guirl.messages.weights.WeightSource`): files on disk, or SGLang's weight-group pattern (the learner's
rank 0 and the engines join a process group and the learner broadcasts tensors into it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from guirl.messages.types import ChatMessage, SamplingParams
from guirl.messages.weights import WeightSource

FinishReason = Literal["stop", "length", "abort"]


class EngineError(RuntimeError):
    """An engine could not serve a batch. `retryable`: the same request may succeed on another engine
    (the engine died or is overloaded); otherwise the request itself is bad (too long, malformed)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class EngineDead(EngineError):
    """The engine stopped answering (process gone, server down): route around it."""


@dataclass
class GenRequest:
    """One prompt to complete. Exactly one of `messages` or `prompt_ids` is used (`prompt_ids` wins)."""

    messages: list[ChatMessage] = field(default_factory=list)
    images: list[bytes] = field(default_factory=list)
    """Encoded images (PNG/JPEG); `ImagePart(index=i)` in `messages` refers to `images[i]`."""
    prompt_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_logprobs: bool = True
    request_id: str = ""
    task_id: str = ""
    """The task being played (the scripted engine answers per task; others ignore it)."""
    step: int = 0
    """The step of the episode this request is for."""
    episode_id: str = ""
    """The episode this request is for (the scripted judge answers per episode and step)."""
    rendered: Any = None
    """The model inputs already prepared (a `RenderedPrompt`: ids, pixel values, image grid), for an engine
    that takes them as given (the hf engine; the SGLang stand-in hands it SGLang's own processing)."""


@dataclass
class GenResult:
    """The engine's answer to one `GenRequest`."""

    text: str
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    logprobs: list[float] | None = None
    """Behaviour log-prob of each response token under the sampling distribution that drew it."""
    finish_reason: FinishReason = "stop"
    policy_version: int = -1
    policy_epoch: int = 0
    engine: str = ""
    latency_s: float = 0.0
    error: str = ""
    """Why the engine aborted this request (`finish_reason == "abort"`): a bad request, not a policy act."""


@runtime_checkable
class Engine(Protocol):
    """An inference engine instance behind the broker."""

    name: str
    policy_version: int
    supports_tokens: bool
    max_batch: int
    """Most requests this engine takes in one `generate` call (1 = no batching)."""
    max_inflight: int
    """Requests this engine serves at once when it batches continuously by itself (an SGLang server, an
    OpenAI-compatible endpoint): the broker sends each request alone as soon as one of these slots frees,
    with no batch barrier. 0: it batches statically, and the broker keeps one `generate` call of up to
    `max_batch` requests in flight."""

    async def start(self) -> None:
        """Load the model or connect to the server; raise `EngineError` when it cannot serve."""

    async def generate(self, batch: list[GenRequest]) -> list[GenResult]:
        """Complete every request of `batch` (in order). Raises `EngineError` for the whole batch."""

    async def health(self) -> bool:
        """True when the engine can serve (cheap; called on a period by the broker)."""

    async def update_weights(
        self, version: int, source: WeightSource, *, epoch: int = 0, rank: int = 1
    ) -> None:
        """Take the weights of `version` (of the learner's lineage `epoch`) from `source`: files on disk, or
        a broadcast over the learner's weight group, in which this engine's first rank is `rank` (the broker
        assigns them: 1 plus the ranks of the engines before it)."""

    async def close(self) -> None:
        """Release the model or the connection."""


def took_weights(engine: Any, version: int, epoch: int) -> None:
    """Record that `engine` serves the weights of `version` (of the learner's lineage `epoch`) now: every
    engine calls it once its update has landed, and nowhere else."""
    engine.policy_version = version
    engine.policy_epoch = epoch
    engine.weights_intact = True


def weights_intact(engine: Any) -> bool:
    """False while an engine holds a mix of two versions' weights: an update that writes the live weights
    in pieces (SGLang's buckets) failed or was abandoned half-way. Such an engine serves nothing (its
    samples would be labelled with a version they were not played by) until an update lands whole."""
    return getattr(engine, "weights_intact", True)


def stamp(results: list[GenResult], engine: Engine, started: float) -> list[GenResult]:
    """Tag results with the engine that made them, its policy version and the batch latency."""
    latency = time.monotonic() - started
    for r in results:
        r.engine = engine.name
        r.policy_version = engine.policy_version
        r.policy_epoch = getattr(engine, "policy_epoch", 0)
        r.latency_s = latency
    return results


T = TypeVar("T")


async def gather_requests(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Run one awaitable per request of a batch at once; their results in order. One that fails with an
    `EngineError` fails the batch (the others are cancelled) with that error — an `EngineDead` first, as it
    says the most about the engine; anything else is a bug and propagates whole."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(c) for c in calls]  # type: ignore[arg-type]
    except ExceptionGroup as group:
        errors = [e for e in group.exceptions if isinstance(e, EngineError)]
        if len(errors) < len(group.exceptions):
            raise  # a bug, not an engine fault: let it show whole
        raise next((e for e in errors if isinstance(e, EngineDead)), errors[0]) from None
    return [t.result() for t in tasks]
