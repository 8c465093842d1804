"""How the inference broker routes requests (`guirl.actors.broker` owns the sockets and the tasks).

Per model name, a `ModelQueue`: the requests waiting, and an `EngineSlot` per engine that counts what the
engine has in flight. An engine either streams (it batches continuously by itself: each request is sent
alone, up to `EngineSlot.stream` at once) or takes static batches (one `generate` call in flight), as
`stream_limit` decides from what the engine declares and `inference.dispatch`. `ModelQueue.pick` chooses the
least-loaded engine free to take work, by `load_tokens` in flight. A weight update sets `EngineSlot.draining`
and waits for `EngineSlot.idle`.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field

from guirl.inference.base import Engine, GenRequest, weights_intact
from guirl.messages.types import PolicyRequest, TextPart

PIXELS_PER_IMAGE_TOKEN = 32 * 32
"""Image pixels per vision token in the load estimate (Qwen3-VL: 16-pixel patches, merged 2x2)."""


@dataclass
class Pending:
    """A request waiting for (or being served by) an engine. It keeps the sender's address, not the
    received `Request`, whose frames would keep a second copy of the images alive."""

    peer: list[bytes]
    msg_id: str
    gen: GenRequest
    enqueued: float
    nbytes: int = 0
    tokens: int = 0
    """Its load on an engine (`load_tokens`)."""
    attempts: int = 0
    tried: set[str] = field(default_factory=set)


def load_tokens(msg: PolicyRequest) -> int:
    """Tokens a request is estimated to hold in an engine: its prompt (the exact ids when given, else about
    four characters per text token and one token per `PIXELS_PER_IMAGE_TOKEN` of each image) plus its
    response budget. An estimate for balancing load only: no tokenizer runs in the broker."""
    if msg.prompt_ids is not None:
        prompt = msg.prompt_ids.shape[0] if msg.prompt_ids.shape else 0
    else:
        chars = sum(len(p.text) for m in msg.messages for p in m.parts if isinstance(p, TextPart))
        chars += sum(len(t) for m in msg.messages for t in m.tools)
        pixels = sum(max(0, img.width) * max(0, img.height) for img in msg.images)
        prompt = chars // 4 + pixels // PIXELS_PER_IMAGE_TOKEN
    return prompt + msg.sampling.max_new_tokens


def stream_limit(engine: Engine, dispatch: str) -> int:
    """Requests the broker keeps in flight on `engine`, each in its own `generate` call, under the
    `inference.dispatch` mode; 0: static batches, one call in flight. An engine that does not say
    (`max_inflight` absent) batches statically."""
    declared = max(0, int(getattr(engine, "max_inflight", 0) or 0))
    if dispatch == "batch":
        return 0
    if dispatch == "stream":
        return declared or max(1, engine.max_batch)
    return declared


@dataclass
class EngineSlot:
    """An engine and what the broker knows of it."""

    engine: Engine
    stream: int = 0
    """> 0: the engine batches continuously; the broker sends it each request alone, up to this many at
    once. 0: one static batch in flight at a time."""
    healthy: bool = False
    draining: bool = False
    """A weight update waits for this engine's requests in flight to end: nothing new is sent to it."""
    inflight: int = 0
    """Requests sent to the engine and not yet back."""
    inflight_tokens: int = 0
    """Their load (`load_tokens`), which routing balances."""
    served: int = 0
    failures: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while nothing is in flight (what a drain waits for)."""

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def free(self) -> bool:
        """It can take a request (streaming) or a batch (static) now."""
        if not self.healthy or self.draining or not weights_intact(self.engine):
            return False  # a half-updated engine still takes the next update (it is healthy), not requests
        return self.inflight < self.stream if self.stream else self.inflight == 0

    def take(self, batch: list[Pending]) -> None:
        self.inflight += len(batch)
        self.inflight_tokens += sum(p.tokens for p in batch)
        self.idle.clear()

    def release(self, batch: list[Pending]) -> None:
        self.inflight -= len(batch)
        self.inflight_tokens -= sum(p.tokens for p in batch)
        self.served += len(batch)
        if self.inflight == 0:
            self.idle.set()


class ModelQueue:
    """The queue and engines of one model name."""

    def __init__(
        self, model: str, engines: list[Engine], max_batch: int, max_queue: int, dispatch: str = "auto"
    ) -> None:
        self.model = model
        self.slots = [EngineSlot(e, stream=stream_limit(e, dispatch)) for e in engines]
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.queue: collections.deque[Pending] = collections.deque()
        self.changed = asyncio.Event()  # a request arrived, or an engine became free, healthy or undrained

    def pick(self, avoid: set[str] | frozenset[str] = frozenset()) -> EngineSlot | None:
        """The least-loaded engine free to take work now (fewest tokens in flight, then fewest requests in
        flight, then fewest served), preferring one the head request has not failed on (`avoid`); a busy
        untried engine is not waited for."""
        free = [s for s in self.slots if s.free]
        fresh = [s for s in free if s.engine.name not in avoid]
        return min(fresh or free, key=lambda s: (s.inflight_tokens, s.inflight, s.served), default=None)

    @property
    def inflight(self) -> int:
        return sum(s.inflight for s in self.slots)

    @property
    def any_healthy(self) -> bool:
        return any(s.healthy for s in self.slots)

    @property
    def any_serving(self) -> bool:
        """Some engine will serve queued requests: a healthy one that holds one version's weights whole, or
        one taking an update now (it serves again when the update lands; one that fails half-way ends the
        drain, and then counts as not serving: see `weights_intact`)."""
        return any(s.healthy and (s.draining or weights_intact(s.engine)) for s in self.slots)
