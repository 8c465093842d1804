"""The `hf` engine: a Qwen3-VL model served in-process with transformers' `generate`.

One engine is one model on one device; `generate` calls run one at a time (a lock), each in a worker
thread so the event loop keeps serving. A batch is cut into sub-batches of requests that sample
alike (greedy, or the same temperature / top-p / top-k), because `generate` takes one set of
sampling settings; each sub-batch is left-padded and run as one `generate` call. Per-request
`max_new_tokens` and stop strings are honoured inside a sub-batch by a per-row stopping criterion.

Left padding and Qwen3-VL's 3-D rope: the model computes each row's mrope positions from its
unpadded tokens (`get_rope_index` masks with `attention_mask`) and continues them during decoding from
the attention-mask cumsum plus the row's rope delta, so a request gets the same positions, and the
same greedy tokens, alone or in a batch.

A request that cannot be served by itself (images that do not decode, prompt ids whose image-pad
tokens do not match the images, a prompt longer than the model's context) is answered alone with
`finish_reason="abort"` and empty text, and the reason logged; the rest of its batch is served. Only
a failure of the engine itself raises `EngineError` for the whole batch.

Log-probs are those of the chosen token under the temperature-scaled distribution (raw logits when
greedy), before top-p / top-k truncation, as SGLang returns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from guirl.inference.base import (
    EngineDead,
    EngineError,
    FinishReason,
    GenRequest,
    GenResult,
    stamp,
    took_weights,
)
from guirl.inference.chat import ChatRenderer, RenderedPrompt
from guirl.messages.types import SamplingParams
from guirl.messages.weights import WeightGroupSpec, WeightsFromBroadcast, WeightsFromDisk, WeightSource
from guirl.weights.broadcast import WeightGroupTimeout, WeightReceiver

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Prepared:
    """One servable request of a batch."""

    index: int
    prompt: RenderedPrompt
    sampling: SamplingParams
    max_new: int


def sampling_key(s: SamplingParams) -> tuple:
    """Requests with equal keys can share one `generate` call (greedy ignores the other settings)."""
    if s.temperature <= 0:
        return ("greedy", s.ignore_eos)
    # Not the seed: env workers seed every step differently, and a key with the seed would never batch.
    # A seeded sub-batch draws from one generator seeded by all its rows' seeds (see `_seed_of`), so a
    # request's sample repeats when its batch does, as with any batched sampler.
    return ("sample", s.temperature, s.top_p, s.top_k if s.top_k > 0 else 0, s.ignore_eos)


def _seed_of(seeds: list[int | None]) -> int | None:
    """One generator seed for a sub-batch from its rows' seeds (None when no row has one)."""
    if all(x is None for x in seeds):
        return None
    h = 0
    for x in seeds:
        h = (h * 1_000_003 + (0 if x is None else x + 1)) % (2**63 - 1)
    return h


class _RowStop:
    """Per-row stopping inside one `generate` call: a row is done at its own `max_new_tokens` or when its
    text contains one of its stop strings (rows that are done get padding until all are)."""

    def __init__(self, prompt_len: int, limits: list[int], stops: list[list[str]], tokenizer: Any) -> None:
        self.prompt_len, self.limits, self.stops, self.tokenizer = prompt_len, limits, stops, tokenizer

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        n = input_ids.shape[1] - self.prompt_len
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row, (limit, stops) in enumerate(zip(self.limits, self.stops)):
            if n >= limit:
                done[row] = True
            elif stops:
                text = self.tokenizer.decode(input_ids[row, self.prompt_len :].tolist())
                done[row] = any(s in text for s in stops)
        return done


class HFEngine:
    """A transformers model behind the `Engine` protocol; token-exact (prompt/response ids, log-probs)."""

    supports_tokens = True
    max_inflight = 0  # static batches, one `generate` at a time (the model is not reentrant)

    def __init__(
        self,
        name: str,
        ckpt_dir: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch: int = 8,
        threads: int = 0,
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.name = name
        self.ckpt_dir = Path(ckpt_dir)
        self.device = torch.device(device)
        self.dtype = _DTYPES[dtype]
        self.max_batch = max(1, max_batch)
        self.threads = threads
        self.policy_version = -1
        self.policy_epoch = 0
        self.generate_calls = 0  # `generate` calls made (sub-batches): how well requests batch
        self._model: Any = None
        self._renderer: ChatRenderer | None = None
        self._lock = asyncio.Lock()  # one generate / weight update at a time: the model is not reentrant
        # All torch work runs on this one thread rather than asyncio.to_thread's pool: OpenMP's thread
        # count (torch.set_num_threads) is per calling thread, and every new calling thread brings its own
        # OpenMP team, which on a small CPU competes with the others (measured: batches 2x slower).
        self._executor: ThreadPoolExecutor | None = None
        self._receiver: WeightReceiver | None = None  # the weight group, once joined (used on the worker)
        self._eos: set[int] = set()
        self._pad_id = 0
        self._max_positions = 0
        self._vocab = 0  # rows of the input embedding: a token id outside [0, vocab) is refused
        self._suppress: list[int] = []

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the model and the renderer (in a worker thread)."""
        try:
            await self._in_worker(self._load)
        except (OSError, ValueError) as exc:
            raise EngineError(
                f"engine {self.name}: cannot load {self.ckpt_dir}: {exc}", retryable=False
            ) from exc

    def _load(self) -> None:
        from guirl.inference.chat import LOAD_LOCK

        with LOAD_LOCK:  # transformers' lazy imports are not thread-safe (engines start side by side)
            from transformers import Qwen3VLForConditionalGeneration
            from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # progress bars on a service's stderr are noise

        if self.threads > 0:
            torch.set_num_threads(self.threads)  # process-wide: one engine per process is the intended use
        renderer = ChatRenderer.load(self.ckpt_dir)
        model = Qwen3VLForConditionalGeneration.from_pretrained(
            str(self.ckpt_dir), dtype=self.dtype, local_files_only=True
        )
        model.to(self.device).eval()
        gen = model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else renderer.tokenizer.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos])
        pad = gen.pad_token_id if gen.pad_token_id is not None else renderer.tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else min(self._eos))
        self._max_positions = int(model.config.get_text_config().max_position_embeddings)
        self._vocab = int(model.get_input_embeddings().num_embeddings)
        # A response must never contain the vision tokens: in a later prompt (history) or in training the
        # model would take them for image slots. A random model samples them; a real one rarely does.
        self._suppress = sorted(renderer.vision_token_ids)
        self._renderer, self._model = renderer, model

    async def health(self) -> bool:
        """True once the model is loaded (and until `close`)."""
        return self._model is not None

    async def close(self) -> None:
        """Leave the weight group and drop the model (waits for a running batch or weight update)."""
        async with self._lock:
            if self._receiver is not None:
                await self._in_worker(self._close_receiver)
            self._model = None
            self._renderer = None
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None

    def _worker(self) -> ThreadPoolExecutor:
        """The engine's torch thread."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine-{self.name}")
        return self._executor

    async def _in_worker(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` on the engine's torch thread."""
        return await asyncio.get_running_loop().run_in_executor(self._worker(), functools.partial(fn, *args))

    @property
    def renderer(self) -> ChatRenderer:
        """The engine's prompt renderer (after `start`)."""
        if self._renderer is None:
            raise EngineDead(f"engine {self.name} is not started")
        return self._renderer

    # -- weights ------------------------------------------------------------------------------------

    async def update_weights(
        self, version: int, source: WeightSource, *, epoch: int = 0, rank: int = 1
    ) -> None:
        """Load new weights between batches, from one of:

        - `WeightsFromDisk(path)`: a safetensors file, or every `*.safetensors` file of a directory;
        - `WeightsFromBroadcast(group)` (guirl's layout): the learner's next broadcast over the weight group,
          joined as `rank` on first use and kept open for later updates (rejoined when the group or rank
          changes, or after a failure broke the group).

        Either way the state dict must have the model's own parameter names, all of them (a tied lm_head
        may be absent), and the new weights serve from the next batch on at `policy_version = version`
        (of lineage `epoch`).

        Cancelled while it receives (the broker abandons an update whose sender died), it returns at once
        and the engine serves its current weights: the broadcast is read on a thread of its own, not the
        torch thread that generates, and that thread leaves the group when the group's own timeout ends
        it. Cancelled while the weights go into the model, it lets them land (moments, on the torch thread)
        and records their version, so the model never holds weights its version does not name."""
        receive: tuple[WeightGroupSpec, int] | None = None
        match source:
            case WeightsFromDisk(path=path):
                work: Any = functools.partial(self._load_weights, Path(path))
            case WeightsFromBroadcast(group=group) if group.layout == "guirl":
                receive = (group, rank)
            case WeightsFromBroadcast(group=group):
                raise EngineError(
                    f"engine {self.name}: a broadcast in the {group.layout!r} layout; the hf engine takes "
                    "guirl's",
                    retryable=False,
                )
            case _:
                raise NotImplementedError(
                    f"engine {self.name}: unsupported weight source {source!r}: use WeightsFromDisk or "
                    "WeightsFromBroadcast"
                )
        async with self._lock:
            if self._model is None:
                raise EngineDead(f"engine {self.name} is not started")
            try:
                if receive is not None:
                    state = await self._receive(version, *receive)
                    work = functools.partial(
                        self._load_state, state, f"weights broadcast as version {version}"
                    )
                landing = asyncio.get_running_loop().run_in_executor(self._worker(), work)
                cancelled = False
                while not landing.done():  # to its end, however often the update is cancelled meanwhile
                    try:
                        await asyncio.shield(landing)
                    except asyncio.CancelledError:
                        cancelled = True
                    except Exception:
                        break  # its own failure: raised below
                if cancelled:
                    if not landing.cancelled() and landing.exception() is None:
                        took_weights(self, version, epoch)
                    raise asyncio.CancelledError
                landing.result()
            except (OSError, RuntimeError, ValueError) as exc:
                # A learner that did not show up in time may yet come: that one is worth retrying.
                raise EngineError(
                    f"engine {self.name}: weight update failed: {exc}",
                    retryable=isinstance(exc, WeightGroupTimeout),
                ) from exc
            took_weights(self, version, epoch)

    async def _receive(self, version: int, group: WeightGroupSpec, rank: int) -> dict[str, torch.Tensor]:
        """One broadcast of the learner's, read on a thread of its own (see `update_weights`)."""
        receiver, stale = self._receiver, None
        if receiver is not None and (receiver.spec != group or receiver.rank != rank):
            stale, receiver = receiver, None  # the learner moved the group (a restart): join the new one
        self._receiver = None  # in use: back once this broadcast has been read whole
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if done.cancelled():  # abandoned just as it finished: nobody will use the group
                if result is not None:
                    threading.Thread(target=result[0].close, daemon=True).start()
            elif error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)

        def run() -> None:
            member = receiver
            try:
                if stale is not None:
                    stale.close()
                if member is None:
                    member = WeightReceiver()
                    member.open(group, rank)
                result: Any = (member, member.receive())
                error = None
            except (
                BaseException
            ) as exc:  # a half-read broadcast leaves the group out of step: rejoin next time
                if member is not None:
                    member.close()
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=run, name=f"weights-{self.name}", daemon=True).start()
        try:
            member, (sent_version, state) = await done
        except asyncio.CancelledError:
            if done.done() and not done.cancelled() and done.exception() is None:
                # it was read whole just as the update was abandoned: nobody will use the group
                threading.Thread(target=done.result()[0].close, daemon=True).start()
            raise
        self._receiver = member
        if sent_version != version:
            # This engine missed or reordered an update; loading these weights under another version
            # would mislabel every sample they produce.
            raise ValueError(f"{group.where} sent version {sent_version}, the engine was told {version}")
        return state

    async def load_tensors(self, named: list[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Copy some of the model's tensors in place (an SGLang-style bucket of an update: any subset of
        the parameter names, each of its own shape; ValueError before anything is copied otherwise)."""
        async with self._lock:
            if self._model is None:
                raise EngineDead(f"engine {self.name} is not started")
            await self._in_worker(self._copy_tensors, named)
            if version is not None:
                self.policy_version = (
                    version  # a bucket of a stand-in server's update: its lineage is the caller's
                )

    def _copy_tensors(self, named: list[tuple[str, torch.Tensor]]) -> None:
        own = self._model.state_dict()
        for name, t in named:
            if name not in own:
                raise ValueError(f"no tensor {name!r} in the model")
            if tuple(t.shape) != tuple(own[name].shape):
                raise ValueError(f"{name}: shape {tuple(t.shape)}, the model's is {tuple(own[name].shape)}")
        with torch.no_grad():
            for name, t in named:
                own[name].copy_(t)

    def _load_weights(self, path: Path) -> None:
        from safetensors.torch import load_file

        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files:
            raise ValueError(f"no .safetensors files in {path}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        self._load_state(state, f"weights at {path}")

    def _close_receiver(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None

    def _load_state(self, state: dict[str, torch.Tensor], what: str) -> None:
        model = self._model
        # Checked before anything is copied: `load_state_dict` would load the tensors that fit and only
        # then complain, leaving a mix of old and new weights. A partial or misnamed state dict must not
        # do that; only a tied lm_head (Qwen3-VL 2B/4B tie it to the embeddings) may be absent.
        tied = set(getattr(model, "_tied_weights_keys", None) or {})
        if not getattr(model.config, "tie_word_embeddings", False):
            tied = set()
        own = model.state_dict()
        missing = [k for k in own if k not in state and k not in tied]
        unexpected = [k for k in state if k not in own]
        if missing or unexpected:
            raise ValueError(
                f"{what} do not match the model: missing {missing[:5]} ({len(missing)}), "
                f"unexpected {unexpected[:5]} ({len(unexpected)})"
            )
        wrong = [k for k, v in state.items() if v.shape != own[k].shape]
        if wrong:
            k = wrong[0]
            raise ValueError(
                f"{what} do not match the model: {len(wrong)} tensors of another shape, e.g. {k} "
                f"{tuple(state[k].shape)} vs {tuple(own[k].shape)}"
            )
        with torch.no_grad():
            model.load_state_dict(state, strict=False)

    # -- generation ---------------------------------------------------------------------------------

    async def generate(self, batch: list[GenRequest]) -> list[GenResult]:
        """Complete every request of `batch`, in order (see the module docstring for batching rules)."""
        async with self._lock:
            if self._model is None:
                raise EngineDead(f"engine {self.name} is not started")
            started = time.monotonic()
            try:
                results = await self._in_worker(self._generate_sync, batch)
            except torch.OutOfMemoryError as exc:
                raise EngineError(f"engine {self.name}: out of memory: {exc}", retryable=True) from exc
            return stamp(results, self, started)

    def _generate_sync(self, batch: list[GenRequest]) -> list[GenResult]:
        results: list[GenResult | None] = [None] * len(batch)
        groups: dict[tuple, list[_Prepared]] = {}
        for i, req in enumerate(batch):
            prepared = self._prepare(i, req)
            if isinstance(prepared, GenResult):
                results[i] = prepared
            else:
                groups.setdefault(sampling_key(req.sampling), []).append(prepared)
        for items in groups.values():
            for lo in range(0, len(items), self.max_batch):
                chunk = items[lo : lo + self.max_batch]
                for item, result in zip(chunk, self._run(chunk)):
                    results[item.index] = result
        unanswered = [i for i, r in enumerate(results) if r is None]
        if unanswered:  # cannot happen unless the grouping above is broken; never misalign answers
            raise EngineError(f"engine {self.name}: no result for requests {unanswered}")
        return [r for r in results if r is not None]

    def _prepare(self, index: int, req: GenRequest) -> _Prepared | GenResult:
        try:
            if req.prompt_ids is not None:
                # Checked here, or one request's unknown id fails the embedding lookup of its whole batch
                # (and the broker takes the engine for dead).
                bad = next(
                    (t for t in req.prompt_ids if type(t) is not int or not 0 <= t < self._vocab), None
                )
                if bad is not None:
                    raise ValueError(
                        f"prompt_ids hold {bad!r}, not a token id of this model (0..{self._vocab - 1})"
                    )
                if req.rendered is not None:
                    prompt = req.rendered
                    if list(prompt.input_ids) != list(req.prompt_ids):
                        raise ValueError("the prepared inputs are not those prompt_ids")
                else:
                    prompt = self.renderer.render_ids(list(req.prompt_ids), req.images)
            else:
                prompt = self.renderer.render(req.messages, req.images)
            room = self._max_positions - len(prompt.input_ids)
            if room <= 0:
                raise ValueError(
                    f"prompt of {len(prompt.input_ids)} tokens does not fit the model's "
                    f"{self._max_positions} positions"
                )
        except ValueError as exc:
            log.warning("engine %s: request %r aborted: %s", self.name, req.request_id, exc)
            return GenResult(text="", finish_reason="abort", error=str(exc)[:300])
        return _Prepared(index, prompt, req.sampling, max(0, min(req.sampling.max_new_tokens, room)))

    def _run(self, items: list[_Prepared]) -> list[GenResult]:
        """One `generate` call for requests that sample alike."""
        from transformers import GenerationConfig, StoppingCriteriaList

        tokenizer = self.renderer.tokenizer
        width = max(len(it.prompt.input_ids) for it in items)
        ids = torch.full((len(items), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        types = torch.zeros((len(items), width), dtype=torch.int32)
        for row, it in enumerate(items):
            n = len(it.prompt.input_ids)
            ids[row, width - n :] = torch.tensor(it.prompt.input_ids)
            mask[row, width - n :] = 1
            types[row, width - n :] = torch.tensor(it.prompt.mm_token_type_ids, dtype=torch.int32)
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": types}
        with_images = [it.prompt for it in items if it.prompt.pixel_values is not None]
        if with_images:
            inputs["pixel_values"] = torch.cat([p.pixel_values for p in with_images]).to(self.dtype)
            inputs["image_grid_thw"] = torch.cat([p.image_grid_thw for p in with_images])
        inputs = {k: v.to(self.device) for k, v in inputs.items()}

        s = items[0].sampling
        greedy = s.temperature <= 0
        longest = max(1, max(it.max_new for it in items))
        config = GenerationConfig(
            max_new_tokens=longest,
            min_new_tokens=longest if s.ignore_eos else None,  # eos suppressed: every row runs to its limit
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None if greedy or s.top_k <= 0 else s.top_k,
            eos_token_id=sorted(self._eos),
            suppress_tokens=self._suppress or None,
            pad_token_id=self._pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        stop = _RowStop(
            width, [it.max_new for it in items], [list(it.sampling.stop) for it in items], tokenizer
        )
        with torch.random.fork_rng(devices=_rng_devices(self.device)), torch.inference_mode():
            seed = _seed_of([it.sampling.seed for it in items])
            if not greedy and seed is not None:
                torch.manual_seed(seed)  # inside fork_rng: the process RNG is restored afterwards
            self.generate_calls += 1
            out = self._model.generate(
                **inputs, generation_config=config, stopping_criteria=StoppingCriteriaList([stop])
            )
        generated = out.sequences[:, width:].cpu()
        # Chosen-token log-probs, one step at a time (stacking every step's logits would double the memory).
        temperature = 1.0 if greedy else s.temperature
        logprobs = torch.empty(generated.shape, dtype=torch.float32)
        for t, step_logits in enumerate(out.logits):
            lp = torch.log_softmax(step_logits.float() / temperature, dim=-1)
            logprobs[:, t] = lp.gather(1, generated[:, t : t + 1].to(lp.device)).squeeze(1).cpu()
        return [
            self._finish(it, generated[row].tolist(), logprobs[row].tolist()) for row, it in enumerate(items)
        ]

    def _finish(self, item: _Prepared, tokens: list[int], logprobs: list[float]) -> GenResult:
        """Cut one row's generated tokens at its end (eos, stop string or limit) and decode its text."""
        tokenizer = self.renderer.tokenizer
        limit = item.max_new
        finish: FinishReason = "length"
        end = min(limit, len(tokens))
        for k in range(end):
            if tokens[k] in self._eos:
                end, finish = k + 1, "stop"
                break
        body = tokens[: end - 1] if finish == "stop" else tokens[:end]
        text = tokenizer.decode(body, skip_special_tokens=False)
        if item.sampling.stop and _stop_cut(text, item.sampling.stop) is not None:
            # Keep the tokens up to the one that completed the stop string (they are what the model drew,
            # and what training must score); the text ends where the stop string starts, as in SGLang.
            for k in range(1, len(body) + 1):
                prefix = tokenizer.decode(body[:k], skip_special_tokens=False)
                cut = _stop_cut(prefix, item.sampling.stop)
                if cut is not None:
                    end, finish, text = k, "stop", prefix[:cut]
                    break
        return GenResult(
            text=text,
            prompt_ids=list(item.prompt.input_ids),
            response_ids=tokens[:end],
            logprobs=logprobs[:end],
            finish_reason=finish,
        )


def _stop_cut(text: str, stops: list[str]) -> int | None:
    """Index where the earliest stop string starts in `text`, or None."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def _rng_devices(device: torch.device) -> list[int]:
    """CUDA devices whose RNG a seeded sub-batch forks (none on CPU)."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]
