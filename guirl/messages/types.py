"""Every wire message guirl sends: frozen, tagged `msgspec.Struct`s.

Rules (msgspec schema evolution): new fields go last with defaults; never retype or rename a field;
a tag, once used, keeps its meaning. The tag (the body's `type` key) is the class name in snake case.
Screenshots and tensors are `Blob`s (trailing frames), never bytes inside the body.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from guirl.messages.blob import Blob
from guirl.messages.weights import (  # noqa: F401  (re-exported: part of this module's messages)
    SGLangBucket,
    WeightGroupSpec,
    WeightsFromBroadcast,
    WeightsFromDisk,
    WeightSource,
)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=_snake):
    """Base of every wire message."""


# --- payload parts (not messages themselves) ------------------------------------------------------


class Image(msgspec.Struct, frozen=True, kw_only=True):
    """An encoded image (a screenshot) carried as a blob."""

    data: Blob
    mime: str = "image/png"
    width: int = 0
    height: int = 0


MAX_DIMS = 8
"""Dimensions a tensor may have (a peer must not make a shape check cost quadratic time)."""
DType = Literal["uint8", "int32", "int64", "float16", "bfloat16", "float32"]
_ITEMSIZE = {"uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2, "float32": 4}
_FORMAT = {"uint8": "B", "int32": "i", "int64": "q", "float16": "e", "float32": "f"}


class Tensor(msgspec.Struct, frozen=True, kw_only=True):
    """A dense array (token ids, log-probs, weights) carried as a blob in native little-endian order."""

    dtype: DType
    shape: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=MAX_DIMS)]
    data: Blob

    def __post_init__(self) -> None:  # (Meta bounds apply on decode; this also guards direct construction)
        if len(self.shape) > MAX_DIMS:
            raise ValueError(f"a tensor has at most {MAX_DIMS} dimensions, got {len(self.shape)}")
        n, size = 1, len(self.data)
        for d in self.shape:
            if d < 0:
                raise ValueError(f"negative dimension in shape {self.shape}")
            n *= d
        if n * _ITEMSIZE[self.dtype] != size:
            raise ValueError(
                f"tensor of shape {self.shape} and dtype {self.dtype} needs {n * _ITEMSIZE[self.dtype]} "
                f"bytes, blob has {len(self.data)}"
            )

    @classmethod
    def from_list(cls, values: list[int] | list[float], dtype: DType = "int32") -> Tensor:
        """A 1-D tensor from Python numbers (no numpy needed)."""
        import array

        arr = array.array(_FORMAT[dtype], values)
        return cls(dtype=dtype, shape=[len(values)], data=Blob(arr.tobytes()))

    def tolist(self) -> list:
        """Flat list of the values (any shape)."""
        if self.dtype not in _FORMAT:
            raise TypeError(f"{self.dtype} has no Python view; convert with torch")
        return memoryview(self.data.data).cast("B").cast(_FORMAT[self.dtype]).tolist()


MAX_NEW_TOKENS = 65536
"""Most tokens one response may ask for (an engine also stops at its model's context)."""


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """Decoding settings of one policy request (bounds checked on decode: a peer cannot ask for NaN
    temperatures or a billion tokens)."""

    temperature: Annotated[float, Meta(ge=0, le=100)] = 1.0
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Meta(ge=-1)] = -1
    max_new_tokens: Annotated[int, Meta(ge=1, le=MAX_NEW_TOKENS)] = 512
    seed: int | None = None
    stop: Annotated[list[Annotated[str, Meta(min_length=1, max_length=256)]], Meta(max_length=16)] = []
    ignore_eos: bool = False
    """Generate `max_new_tokens` whatever the model says (benchmarks, as SGLang's `ignore_eos`)."""


class TextPart(msgspec.Struct, frozen=True, tag="text"):
    """Text inside a chat message."""

    text: str


class ImagePart(msgspec.Struct, frozen=True, tag="image"):
    """An image inside a chat message: an index into the request's `images`."""

    index: int


MAX_TOOLS = 16
"""Most function schemas one chat message may carry."""
MAX_TOOL_JSON = 65536
"""Longest JSON text of one function schema, in characters."""


# omit_defaults: a message without tools encodes exactly as it did before `tools` existed.
class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One turn of a chat prompt."""

    role: Literal["system", "user", "assistant", "tool"]
    parts: list[TextPart | ImagePart]
    tools: Annotated[list[Annotated[str, Meta(max_length=MAX_TOOL_JSON)]], Meta(max_length=MAX_TOOLS)] = []
    """Function schemas, each the JSON text of one object, that the chat template renders into this turn
    (`apply_chat_template(tools=...)`: Qwen's `# Tools` block in the system turn). Only a first, system
    message carries them. JSON text rather than a dict: its key order is what the template writes, and the
    message's depth stays bounded by its schema."""


# --- control: part of every channel ----------------------------------------------------------------


class Heartbeat(Message):
    """Liveness signal, sent by both ends of every connection each heartbeat interval."""

    inflight: int = 0
    incarnation: str = ""
    """Random id of the sending process: a change tells a client its peer restarted."""
    leaving: bool = False
    """Sent (best effort) by an actor shutting down, to its mailbox's peers and on its connections: a
    goodbye, not a death."""
    first_seen: str = ""
    """In a server's first heartbeat to a new peer: the id of the first message it got from that peer
    (messages the peer sent before that one never reached this incarnation)."""
    patience_s: Annotated[float, Meta(ge=0, le=7 * 86400)] = 0.0
    """The sender's progress deadline: judge its silence, while its connection is alive, only after this
    many seconds (0: the receiver's own `progress_timeout_s`)."""
    busy: Annotated[str, Meta(max_length=200)] = ""
    """Heavy work the sender is about to do or doing (`checkpoint`, `gather`, `load`): its event loop may
    be starved until it speaks again, and `patience_s` says for how long at most."""


class Shutdown(Message):
    """Ask an actor to stop: it stops accepting, drains in-flight work, then closes."""

    reason: str = ""


ErrorCode = Literal[
    "encode",
    "frames",
    "too_large",
    "too_deep",
    "decode",
    "schema",
    "unknown_type",
    "version",
    "overloaded",
    "unsupported",
    "handler",
    "timeout",
    "peer_dead",
    "shutting_down",
]


class ErrorReply(Message):
    """A request could not be served; `header.reply_to` names it when it could be decoded."""

    code: ErrorCode
    message: str
    retryable: bool = False


class StatsRequest(Message):
    """Ask an actor for its counters."""


class HoldGil(Message):
    """Fault injection, honoured only where `runtime.fault_injection` is on (tests, benchmarks): the actor
    holds the GIL for `seconds`, as a Python-heavy checkpoint save does, then answers its `StatsReply`."""

    seconds: Annotated[float, Meta(ge=0, le=3600)]


class StatsReply(Message):
    """An actor's counters (messages, drops by reason, peers, restarts)."""

    actor: str
    counters: dict[str, int]
    peers: list[str] = []


# --- diagnostics ---------------------------------------------------------------------------------


class Echo(Message):
    """Diagnostic request: the echo actor answers after `delay_s` with the text and (optionally) blobs."""

    text: str = ""
    blobs: list[Blob] = []
    delay_s: float = 0.0
    return_blobs: bool = True


class EchoReply(Message):
    """Answer to `Echo`: the text, the blobs when asked, and the size of each received blob."""

    text: str = ""
    blobs: list[Blob] = []
    sizes: list[int] = []


# --- coordinator channel ---------------------------------------------------------------------------


class Register(Message):
    """A worker joins the cluster (env workers scale independently)."""

    role: str
    name: str
    capacity: int = 1
    host: str = ""
    pid: int = 0


class Ack(Message):
    """Generic acknowledgement of a one-shot request."""

    ok: bool = True
    note: str = ""


class WorkRequest(Message):
    """A worker with free VMs asks for episodes (pull-based, so backpressure is natural)."""

    worker: str
    free_slots: int = 1


class EpisodeAssignment(Message):
    """One attempt of one task, as part of a GRPO group."""

    episode_id: str
    task_id: str
    task: dict[str, Any]
    group_id: str
    sample_index: int = 0
    attempt: int = 0
    max_steps: int = 15
    min_policy_version: int = 0
    seed: int = 0
    mode: Literal["train", "eval"] = "train"
    domain: str = ""
    temperature: float | None = None
    """Sampling temperature for this episode instead of the worker's (periodic evaluation: greedy)."""


class NoWork(Message):
    """Nothing to hand out now (staleness gate or schedule); ask again later."""

    retry_after_s: float = 1.0
    reason: str = ""


EpisodeStatus = Literal["completed", "retried", "aborted"]


class EpisodeEnded(Message):
    """The one end state of an episode id: completed (scored), retried elsewhere, or aborted."""

    episode_id: str
    status: EpisodeStatus
    reason: str = ""
    reward: float | None = None
    steps: int = 0
    env_error: str = ""
    task_id: str = ""
    domain: str = ""
    attempt: int = 0
    outcome: str = ""
    """How the episode ended: `done` / `fail` (the agent said so), `truncated` (step limit), `parse_error`
    (unparseable response: a policy failure), `env_error` (not the policy's doing)."""
    score: float | None = None
    """The evaluator's score in [0, 1] (None when not evaluated)."""
    seconds: float = 0.0
    worker: str = ""


# --- policy channel (EnvWorker / PRM -> InferenceBroker) -------------------------------------------


class PolicyRequest(Message):
    """Ask a model for one response. Token-in (`prompt_ids`) when given, else the chat `messages`."""

    episode_id: str
    step: int
    model: str = "policy"
    messages: list[ChatMessage] = []
    prompt_ids: Tensor | None = None
    images: list[Image] = []
    sampling: SamplingParams = SamplingParams()
    return_logprobs: bool = True
    task_id: str = ""
    """The task being played (the scripted backend answers per task)."""


class PolicyResponse(Message):
    """The engine's answer with exact token ids and behaviour log-probs for training."""

    text: str
    prompt_ids: Tensor | None = None
    response_ids: Tensor | None = None
    logprobs: Tensor | None = None
    finish_reason: Literal["stop", "length", "abort"] = "stop"
    policy_version: int = -1
    engine: str = ""
    latency_s: float = 0.0
    """Seconds from the broker's taking the request to its answer: `queue_s`, then the engine's time."""
    error: str = ""
    """Why the engine aborted the request (finish_reason `abort`): the request's fault, never the policy's."""
    queue_s: float = 0.0
    """Seconds the request waited in the broker's queue before an engine took it (part of `latency_s`)."""
    policy_epoch: int = 0
    """The learner's lineage the version belongs to (`WeightsPublished.epoch`): a version number names
    weights only together with it."""


# --- transitions, scores and trajectories -------------------------------------------------------------


class Transition(Message):
    """One step as the PRM judges it: what was asked, what was done, and the screens around it."""

    episode_id: str
    step: int
    instruction: str
    previous_actions: list[str]
    """The action lines of the steps before this one, oldest first."""
    response: str
    before: Image
    after: Image
    history: list[Image] = []
    """Earlier screenshots (oldest first; the last is the step just before this one)."""
    task_id: str = ""
    group_id: str = ""
    seed: int = 0
    """Base of the votes' sampling seeds (vote i uses a seed derived from it, the episode and the step)."""


class StepScore(Message):
    """The PRM's verdict on one step: mean of valid votes, or None when no vote was valid."""

    episode_id: str
    step: int
    score: float | None
    votes: int = 0
    invalid: int = 0
    latency_s: float = 0.0
    """Seconds the judge took (its slowest vote)."""
    error: str = ""
    """Why the judge could not be asked (broker unreachable, engine refused): no score, and not the policy's
    doing."""
    queue_s: float = 0.0
    """Seconds the transition waited in the PRM's queue before judging began."""
    queue_depth: int = 0
    """Transitions queued at the PRM when this one was taken."""
    template: str = ""
    """The judge prompt's name and version (`guirl-prm-v1@<hash>`)."""


class StepSample(msgspec.Struct, frozen=True, kw_only=True):
    """One step of an episode as a training sample: exact engine tokens, images, behaviour log-probs."""

    step: int
    prompt_ids: Tensor
    response_ids: Tensor
    logprobs: Tensor
    images: list[Image] = []
    policy_version: int = -1
    response_text: str = ""
    action: str = ""
    prm_score: float | None = None
    image_refs: list[int] = []
    """The step's prompt images as indices into its trajectory's `screens` (each screenshot travels once,
    though it is in up to `history_images + 1` prompts); `images` stays empty then."""
    prm_status: str = ""
    """Where `prm_score` came from (set by the learner): `scored`; or why there is none: `invalid` (no valid
    vote), `error` (the judge could not be asked), `missing` (no score in time), `dropped` (never sent)."""
    policy_epoch: int = 0
    """The learner lineage of `policy_version` (see `WeightsPublished.epoch`)."""


class Trajectory(Message):
    """A finished episode on its way to the learner."""

    episode_id: str
    task_id: str
    group_id: str
    sample_index: int
    status: EpisodeStatus
    reward: float
    steps: list[StepSample]
    env_error: str = ""
    domain: str = ""
    screens: list[Image] = []
    """The prompt images of the episode's steps, once each (see `StepSample.image_refs`)."""
    score: float | None = None
    """The evaluator's score in [0, 1] that `reward` was derived from."""
    outcome: str = ""
    """How the episode ended (`done`, `fail`, `truncated`, `parse_error`)."""
    attempt: int = 0
    prm_dropped: list[int] = []
    """Steps whose transitions the worker could not hand to the PRM (its queue was full): the learner does
    not wait for their scores."""
    reward_parts: dict[str, float] = {}
    """The components of a rule reward (GUI-R1 mode: `format`, `type`, `point`, `text`, `accuracy`), for
    metrics; `reward` is their weighted total."""


class LearnerResumed(Message):
    """The learner (re)started from a checkpoint at `version`: the coordinator hands out again every group
    it admitted that was not trained by then and has nothing running or queued (its trajectories died in
    the old learner's buffer)."""

    version: int
    trained_groups: list[str] = []
    epoch: int = 0
    """Its lineage epoch: `WeightsPublished` of an older one is a dead learner's, and ignored."""


class GroupsRetired(Message):
    """The coordinator's answer to `LearnerResumed`: every group it has handed out again whole under a fresh
    id in the run (after this restart or an earlier one).
    A member of one of them still on its way (a worker retrying its delivery across the restart) is a
    straggler of a group that is no longer the run's: the learner settles them, so it never trains one."""

    groups: list[str] = []


class EpisodeDelivered(Message):
    """A worker's learner acknowledged a completed training episode's trajectory: the coordinator stops
    holding the sample for the case that the worker dies before delivering it."""

    episode_id: str


class EpisodeRejected(Message):
    """An episode the coordinator ended `completed` will not be trained: the learner refused it (its steps
    were played by a policy outside the learner's lineage: weights a previous learner made after its last
    checkpoint), or its worker could not deliver it (`undelivered`, sent by the worker). The coordinator
    hands the same sample of the group out again."""

    episode_id: str
    group_id: str
    sample_index: int
    task_id: str
    reason: str = ""
    undelivered: bool = False


class WeightsPublished(Message):
    """The learner has new weights at `version`: to the broker, with the `source` its engines take them
    from (from disk, or a broadcast over the learner's weight group); to the coordinator, without one."""

    version: int
    learner_step: int = 0
    n_tensors: int = 0
    nbytes: int = 0
    epoch: int = 0
    """The learner's lineage: how many times it has restored from a checkpoint (or from the starting
    weights) in this run. A restarted learner goes back to its checkpoint's version and makes new versions
    from there, so version numbers repeat across lineages; (epoch, version) names one set of weights."""
    source: WeightSource | None = None
    """Where the engines take the weights from (`guirl.messages.weights`); engine i of the broker takes
    the ranks of a weight group from 1 plus the ranks of the engines before it."""
