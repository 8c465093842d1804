"""A latency model of an SGLang server's GPU side, for benchmarks: the SGLang stand-in's `timing` backend
(`python -m guirl.testing.fakes sglang ... --standin-backend timing --standin-timing JSON`).

`TimingBackend` takes the place of the model behind the stand-in's scheduler (the interface of
`sglang_scheduler.ModelBackend`) and simulates continuous batching as SGLang's scheduler runs it, on one
loop that ticks a simulated GPU clock:

- **prefill first**: whenever requests wait (and fewer than `max_running` run), one prefill forward takes
  them (up to `max_prefill_tokens` prompt tokens, at least one request: SGLang's chunked-prefill budget),
  lasting `prefill_s_per_batch + prefill_s_per_token x tokens`; the running sequences wait meanwhile, as
  SGLang runs a new prefill batch before the next decode step. The forward yields each one's first token.
- **then decode**: every step advances every running sequence by one token and lasts
  `decode_s_base + decode_s_per_seq x running` (decoding reads the weights once per step, plus each
  sequence's KV cache). A sequence leaves the batch when it has its length; a request that arrived meanwhile
  is prefilled before the next step and joins the batch there.
- **lengths**: each response's length is drawn from a lognormal distribution (median `length_median`,
  shape `length_sigma`, at least 1, at most `max_length`), deterministic per request: seeded by the
  request's sampling seed when the server passes one (`--enable-deterministic-inference`), else by its
  prompt ids. A draw within the request's `max_new_tokens` ends with the tokenizer's EOS (finish `stop`);
  a longer one is cut at `max_new_tokens` (finish `length`); `ignore_eos` runs to `max_new_tokens`. Stop
  strings are not matched (the tokens are random). Token ids are ordinary ids of the tokenizer's vocabulary,
  log-probs finite values in (-2, 0]: nothing learns from them.

The clock is absolute: each step ends at the previous step's end plus its duration, anchored to the wall
clock whenever the batch empties. A loop woken late (the CPU busy elsewhere) does not stretch the simulated
GPU's time; it catches up, and `stats()["lag_s_max"]` says how late it ran.

The defaults stand for an 8B vision-language policy (Qwen3-VL-8B) in bf16 on one H100 (80 GB, 3.35 TB/s),
serving GUI steps:

- prefill 0.05 ms per prompt token (about 20k tokens/s: the 8B model's ~16 GFLOP per token at ~35 % of the
  H100's dense bf16 peak, plus the vision tower's share on screenshot tokens) and 10 ms per forward (kernel
  launches, the vision encoder's fixed part, scheduling); 8192 tokens per forward, SGLang's
  `chunked_prefill_size` on an 80 GB GPU;
- decode 10 ms per step plus 0.25 ms per running sequence: reading ~16 GB of weights takes ~5 ms at the
  H100's bandwidth, ~8-10 ms as SGLang measures small-batch inter-token latency; each sequence adds its KV
  cache to read (~0.14 MB per token for this model: a few thousand tokens of screenshots and history are
  ~0.5 GB, ~0.15 ms, plus its share of attention and sampling), so 18 ms at 32 running and 26 ms at 64;
- at most 128 running (`max_running`): ~45 GB of KV cache over ~2.5k-token sequences; the broker's
  `max_concurrency` (64) binds first;
- response lengths: median 60 tokens, sigma 1.0 (mean ~100, 95th percentile ~310, ~1.6 % beyond 512): a GUI
  step's answer is a short thought and one tool call; a few think long. The request's budget cuts the tail.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import zlib
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from guirl.testing.fakes.sglang_scheduler import Generated

COUNTERS = ("requests", "prefills", "steps", "tokens", "busy_s", "prefill_s", "lag_s_max", "lag_s_total")
"""`TimingBackend.stats()`: requests taken, prefill forwards, decode steps, tokens made, simulated busy
seconds (and of those, prefilling), and how late the loop ran behind the simulated clock (at most, in all)."""


class TimingModel(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The latency model's settings (JSON: `--standin-timing`); see the module docstring for the defaults'
    rationale."""

    prefill_s_per_token: float = 5e-5
    """Seconds a prefill forward spends per prompt token."""
    prefill_s_per_batch: float = 0.010
    """Seconds every prefill forward costs on top (launches, the vision encoder's fixed part)."""
    max_prefill_tokens: int = 8192
    """Most prompt tokens one prefill forward takes (SGLang's chunked-prefill size); one request at least."""
    decode_s_base: float = 0.010
    """Seconds of a decode step with nothing running (the weights' read)."""
    decode_s_per_seq: float = 0.00025
    """Seconds each running sequence adds to a decode step (its KV cache's read, its sampling)."""
    max_running: int = 128
    """Most sequences in the running batch (SGLang's `max_running_requests`)."""
    length_median: float = 60.0
    """Median response length in tokens (lognormal)."""
    length_sigma: float = 1.0
    """Lognormal shape: the tail's weight (1.0: the 95th percentile ~5x the median)."""
    max_length: int = 4096
    """Most tokens a drawn response has (the request's `max_new_tokens` cuts it further)."""
    seed: int = 0
    """Mixed into every draw: another seed, other lengths for the same requests."""

    def __post_init__(self) -> None:
        if min(self.prefill_s_per_token, self.prefill_s_per_batch, self.decode_s_base) < 0:
            raise ValueError("the timing model's times are >= 0")
        if self.decode_s_per_seq < 0 or self.length_sigma < 0 or self.length_median < 1:
            raise ValueError("decode_s_per_seq and length_sigma are >= 0, length_median >= 1")
        if min(self.max_prefill_tokens, self.max_running, self.max_length) < 1:
            raise ValueError("max_prefill_tokens, max_running and max_length are >= 1")

    def prefill_time(self, tokens: int) -> float:
        """Seconds of one prefill forward over `tokens` prompt tokens."""
        return self.prefill_s_per_batch + self.prefill_s_per_token * tokens

    def step_time(self, running: int) -> float:
        """Seconds of one decode step with `running` sequences."""
        return self.decode_s_base + self.decode_s_per_seq * running

    def length(self, rng: random.Random) -> int:
        """A response length drawn from `rng` (lognormal, at least 1, at most `max_length`)."""
        draw = math.exp(math.log(self.length_median) + self.length_sigma * rng.gauss(0.0, 1.0))
        return max(1, min(self.max_length, round(draw)))


@dataclass
class _Seq:
    """A request in the simulated engine."""

    prompt_tokens: int
    length: int
    done: asyncio.Future
    produced: int = 0
    queued_at: float = 0.0
    first_token_at: float = 0.0


class TimedGenerated(Generated):
    """A `Generated` with the simulated times of its request (the backend's clock): when it was queued,
    when its first token came (its prefill's end) and when it finished."""

    queued_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0


@dataclass
class TimingBackend:
    """The continuous-batching simulator (see the module docstring): `ModelBackend`'s interface. `vocab`:
    the token ids responses are made of; `eos_id`: what a response that stops ends with; `pad_id`: the image
    pad token (for the scheduler's image-token count); `decode`: ids -> text. `clock`/`sleep`: the wall clock
    and its sleep (a test passes a fake pair)."""

    model: TimingModel
    vocab: list[int]
    eos_id: int
    pad_id: int | None = None
    decode: Callable[[list[int]], str] = lambda ids: ""
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    waiting: list[_Seq] = field(default_factory=list, init=False)
    """Requests waiting for their prefill, in arrival order."""
    running: list[_Seq] = field(default_factory=list, init=False)
    """The running batch."""
    counters: dict[str, float] = field(init=False, default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    _now: float = field(default=0.0, init=False)  # the simulated GPU's clock
    _wake: asyncio.Event | None = field(default=None, init=False)
    _task: asyncio.Task | None = field(default=None, init=False)

    @classmethod
    def from_json(cls, text: str, tokenizer: Any) -> TimingBackend:
        """The backend the stand-in's `--standin-timing JSON` describes, making responses of `tokenizer`'s
        ordinary (non-special) tokens."""
        model = msgspec.json.decode((text or "{}").encode(), type=TimingModel)
        special = set(tokenizer.all_special_ids)
        vocab = [i for i in range(len(tokenizer)) if i not in special]
        pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        return cls(
            model,
            vocab,
            eos_id=int(tokenizer.eos_token_id),
            pad_id=pad if isinstance(pad, int) and pad != tokenizer.unk_token_id else None,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        )

    # -- ModelBackend's interface -------------------------------------------------------------------

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="timing-backend")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def image_tokens(self, ids: list[int]) -> int:
        return ids.count(self.pad_id) if self.pad_id is not None else 0

    async def load(self, named: list[tuple[str, Any]]) -> None:
        """Weights received are taken as they are: the model has none."""

    async def load_path(self, path: str) -> None:
        """As `load`."""

    async def generate(
        self, ids: list[int], mm_inputs: Any, sampling: Any, logprobs: bool, seed: int | None
    ) -> TimedGenerated:
        """Queue the request, wait until the simulated engine has produced its tokens, answer them."""
        assert self._wake is not None, "start() the backend first"
        key = seed if seed is not None else zlib.crc32(array("q", ids).tobytes())
        rng = random.Random(f"{self.model.seed}:{key}")
        drawn = self.model.length(rng)
        budget = max(1, int(sampling.max_new_tokens))
        stops = not sampling.ignore_eos and drawn <= budget
        n = drawn if stops else budget
        seq = _Seq(len(ids), n, asyncio.get_running_loop().create_future(), queued_at=self.clock())
        self.waiting.append(seq)
        self.counters["requests"] += 1
        self._wake.set()
        try:
            finished_at = await seq.done
        except asyncio.CancelledError:  # aborted: it leaves the engine at its next step
            seq.done.cancel()
            raise
        response = rng.choices(self.vocab, k=n - 1 if stops else n) + ([self.eos_id] if stops else [])
        values = [-2.0 * rng.random() for _ in response] if logprobs else None
        out = TimedGenerated(
            self.decode(response),
            response,
            values,
            "stop" if stops else "length",
            matched=self.eos_id if stops else None,
        )
        out.queued_at, out.first_token_at, out.finished_at = seq.queued_at, seq.first_token_at, finished_at
        return out

    def stats(self) -> dict[str, Any]:
        """What the simulated engine did (for the stand-in's `/_standin/state`)."""
        return {
            **{k: round(v, 4) for k, v in self.counters.items()},
            "waiting": len(self.waiting),
            "running": len(self.running),
        }

    # -- the simulated GPU --------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        m = self.model
        while True:
            self.waiting = [s for s in self.waiting if not s.done.done()]  # aborted while waiting
            self.running = [s for s in self.running if not s.done.done()]
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                self._now = self.clock()  # the GPU was idle: its clock starts from now
                continue
            room = m.max_running - len(self.running)
            if self.waiting and room > 0:
                batch, tokens = [], 0
                while self.waiting and len(batch) < room:
                    nxt = self.waiting[0].prompt_tokens
                    if batch and tokens + nxt > m.max_prefill_tokens:
                        break
                    batch.append(self.waiting.pop(0))
                    tokens += nxt
                await self._advance(m.prefill_time(tokens))
                self.counters["prefills"] += 1
                self.counters["prefill_s"] += m.prefill_time(tokens)
                for s in batch:
                    s.first_token_at = self._now
                self._produce(batch)
                self.running += [s for s in batch if not s.done.done()]
                continue
            await self._advance(m.step_time(len(self.running)))
            self.counters["steps"] += 1
            self._produce(self.running)

    def _produce(self, seqs: list[_Seq]) -> None:
        """Each of `seqs` gains a token; those complete are answered (at the simulated time)."""
        self.counters["tokens"] += len(seqs)
        for s in seqs:
            s.produced += 1
            if s.produced >= s.length and not s.done.done():
                s.done.set_result(self._now)

    async def _advance(self, seconds: float) -> None:
        """Let the simulated GPU work `seconds`: sleep until its clock's next end (none when late)."""
        self._now += seconds
        self.counters["busy_s"] += seconds
        late = self.clock() - self._now
        if late > 0:
            self.counters["lag_s_max"] = max(self.counters["lag_s_max"], late)
            self.counters["lag_s_total"] += late
            await self.sleep(0)
        else:
            await self.sleep(-late)
