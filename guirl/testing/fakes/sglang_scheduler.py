"""The SGLang stand-in's scheduler: what takes the place of SGLang's scheduler and detokenizer processes
behind SGLang's own HTTP server process (see `guirl.testing.fakes.sglang`).

It speaks SGLang's inter-process protocol on SGLang's own sockets: it pulls what the tokenizer manager sends
to the scheduler (`PortArgs.scheduler_input_ipc_name`, SGLang's `async_sock_recv`) and pushes its answers
where the detokenizer would (`tokenizer_ipc_name`, `async_sock_send`), so the tokenizer manager runs
unmodified. What it does with them:

- `TokenizedGenerateReqInput` (SGLang's validated, tokenized, multimodal-processed request): the model runs
  on exactly those ids and SGLang's pixel values (`ModelBackend`: the hf engine, real log-probs; or
  `TimingBackend`: a continuous-batching latency model for benchmarks), answered with a `BatchStrOutput`.
- weight groups, sessions, distributed updates: SGLang's scheduler-side `SchedulerWeightUpdaterManager` over
  its model runner's `WeightUpdater` (`guirl.testing.sglang_upstream.WeightSide`), on one thread, as the
  scheduler runs them; what they receive is loaded into the backend.
- `FlushCacheReqInput`: SGLang's `SchedulerFlushWrapper`, idle meaning no generation in flight, its pending
  flush checked whenever one ends (the scheduler checks it every loop).
- `UpdateWeightFromDiskReqInput`, `GetInternalStateReq`, `AbortReq`: answered as the scheduler answers them.
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from guirl.messages.weights import WeightsFromDisk

log = logging.getLogger(__name__)


class Scheduler:
    """See the module docstring. `backend` generates; `sglang` is `guirl.testing.sglang_upstream.load()`."""

    def __init__(self, sglang: Any, port_args: Any, backend: Any, *, deterministic: bool = False) -> None:
        import zmq
        import zmq.asyncio
        from sglang.srt.utils.network import get_zmq_socket

        self.sglang = sglang
        self.io = sglang.modules.io_struct
        self.backend = backend
        self.deterministic = deterministic
        """Seeds are honoured only so (SGLang's sampler reads `sampling_seed` only with
        `--enable-deterministic-inference`)."""
        # the scheduler's and the detokenizer's ends, made as SGLang makes them (ipc_channels.py)
        self.context = zmq.asyncio.Context()
        self.pull = get_zmq_socket(self.context, zmq.PULL, port_args.scheduler_input_ipc_name, False)
        self.push = get_zmq_socket(self.context, zmq.PUSH, port_args.tokenizer_ipc_name, False)
        self.inflight: dict[str, asyncio.Task] = {}
        self.aborted: set[str] = set()
        self.released = asyncio.Event()
        """Cleared: generation requests are taken and held unanswered (a wedged GPU) until it is set again."""
        self.released.set()
        self.weight_version: str | None = None
        self.flushes = 0
        self.groups_joined = 0
        self._weights_thread = ThreadPoolExecutor(1, thread_name_prefix="standin-weights")
        self._received: list[tuple[str, Any]] = []
        self.weights = sglang.weight_side(self._received.extend, self._record_version)
        self.flush_gate = sglang.flush_gate(self._flush, self._idle, self._answer_deferred_flush)
        self._tasks: set[asyncio.Task] = set()

    def _record_version(self, version: str | None) -> None:
        self.weight_version = version

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        io = self.io
        recv = self.sglang.modules.io_struct.async_sock_recv
        while True:
            obj = await recv(self.pull)
            match obj:
                case io.TokenizedGenerateReqInput() if _health_check(obj) and self.inflight:
                    # as SGLang's scheduler: a busy server answers a health check by its progress instead
                    # of generating for it (one signal once its running requests make a step)
                    self._spawn(self._health_signal(obj))
                case io.TokenizedGenerateReqInput():
                    self._start(obj)
                case io.BatchTokenizedGenerateReqInput():
                    for one in obj.batch:
                        self._start(one)
                case io.AbortReq():
                    self._abort(obj)
                case io.FlushCacheReqInput():
                    out = self.flush_gate.handle(obj)
                    if out is not None:
                        await self._send(out)
                    else:  # deferred: checked every scheduler loop (as SGLang does) until idle or due
                        self._spawn(self._pending_flush())
                case io.UpdateWeightFromDiskReqInput():
                    self._spawn(self._update_from_disk(obj))
                case io.GetInternalStateReq():
                    await self._send(io.GetInternalStateReqOutput(internal_state={}))
                case _ if type(obj).__name__ in _WEIGHT_CALLS:
                    self._spawn(self._weight_call(obj))
                case _:
                    log.warning("scheduler stand-in: %s is not served here", type(obj).__name__)

    async def _send(self, obj: Any) -> None:
        await self.sglang.modules.io_struct.async_sock_send(self.push, obj)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for task in [*self._tasks, *self.inflight.values()]:
            task.cancel()
        self._weights_thread.shutdown(wait=False, cancel_futures=True)
        self.pull.close(linger=0)
        self.push.close(linger=0)
        self.context.term()

    # -- generation --------------------------------------------------------------------------------

    def _start(self, obj: Any) -> None:
        from sglang.srt.managers.mm_utils import unwrap_shm_features

        unwrap_shm_features(obj)  # features passed in shared memory, taken as the scheduler takes them
        task = asyncio.create_task(self._generate(obj))
        self.inflight[obj.rid] = task
        task.add_done_callback(lambda t, rid=obj.rid: self._ended(rid, t, obj))

    def _ended(self, rid: str, task: asyncio.Task, obj: Any) -> None:
        self.inflight.pop(rid, None)
        if task.cancelled() and rid in self.aborted:  # the scheduler ends an aborted request with an abort
            self.aborted.discard(rid)  # finish (even one cancelled before it first ran)
            ids = list(obj.input_ids)
            self._spawn(self._send(self._batch_output(obj, ids, _aborted("aborted"))))
        self.flush_gate.check_pending()

    def _abort(self, obj: Any) -> None:
        rids = list(self.inflight) if obj.abort_all else [obj.rid]
        for rid in rids:
            task = self.inflight.get(rid)
            if task is not None:
                self.aborted.add(rid)
                task.cancel()

    async def _generate(self, obj: Any) -> None:
        ids = list(obj.input_ids)
        try:
            await self.released.wait()
            seed = obj.sampling_params.sampling_seed if self.deterministic else None
            result = await self.backend.generate(
                ids, obj.mm_inputs, obj.sampling_params, obj.return_logprob, seed
            )
        except Exception as exc:  # the model failed: the request ends as the scheduler aborts one
            log.warning("scheduler stand-in: generation of %s failed: %r", obj.rid, exc)
            result = _aborted(str(exc))
        try:
            await self._send(self._batch_output(obj, ids, result))
        except Exception:  # never a request left hanging silently: say why, and end it as aborted
            log.exception("scheduler stand-in: the answer to %s could not be sent", obj.rid)
            await self._send(self._batch_output(obj, ids, _aborted("the stand-in could not answer")))

    async def _health_signal(self, obj: Any) -> None:
        # SGLang sends it after its next forward step; here generation advances by whole requests, so the
        # signal goes once the running ones are not held (a wedged scheduler signals nothing)
        await self.released.wait()
        await self._send(self.io.HealthCheckOutput(http_worker_ipc=getattr(obj, "http_worker_ipc", None)))

    async def _pending_flush(self) -> None:
        while self.flush_gate._pending is not None:
            await asyncio.sleep(0.05)  # the scheduler's loop period, simulated
            self.flush_gate.check_pending()

    def _batch_output(self, obj: Any, ids: list[int], r: Any) -> Any:
        """What the detokenizer sends the tokenizer manager for one finished request."""
        n = len(r.response_ids or [])
        if r.finish_reason == "abort":
            finish: dict[str, Any] = {"type": "abort", "message": r.error}
        elif r.finish_reason == "stop":
            finish = {"type": "stop", "matched": r.matched}
        else:
            finish = {"type": "length", "length": n}
        lp = obj.return_logprob
        fields: dict[str, Any] = {
            "rids": [obj.rid],
            "finished_reasons": [finish],
            "output_strs": [r.text],
            "output_ids": [array("q", r.response_ids or [])],
            "prompt_tokens": [len(ids)],  # the scheduler's len(req.origin_input_ids)
            "completion_tokens": [n],
            "reasoning_tokens": [0],
            "cached_tokens": [0],
            "output_token_logprobs_val": [list(r.logprobs or [])] if lp else None,
            "output_token_logprobs_idx": [list(r.response_ids or [])] if lp else None,
            "retraction_counts": [0],
        }
        for f in msgspec.structs.fields(self.io.BatchStrOutput):
            if f.name == "image_tokens":  # the scheduler's count of image tokens in the prompt
                fields[f.name] = [self.backend.image_tokens(ids)]
            elif f.required and f.name not in fields:
                fields[f.name] = None
        return self.io.BatchStrOutput(**fields)

    # -- cache -------------------------------------------------------------------------------------

    def _idle(self, **_: Any) -> bool:
        return not self.inflight

    def _flush(self, **_: Any) -> bool:
        if self.inflight:
            return False
        self.flushes += 1
        return True

    def _answer_deferred_flush(self, out: Any, _req: Any) -> None:
        self._spawn(self._send(out))

    # -- weights -----------------------------------------------------------------------------------

    async def _weight_call(self, obj: Any) -> None:
        route, out_type = _WEIGHT_CALLS[type(obj).__name__]
        manager = self.weights.manager
        loop = asyncio.get_running_loop()
        self._received.clear()
        out = await loop.run_in_executor(self._weights_thread, getattr(manager, route), obj)
        if route == "init_weights_update_group" and out.success:
            self.groups_joined += 1
        if self._received:
            named, self._received[:] = list(self._received), []
            try:
                await self.backend.load(named)
            except Exception as exc:  # what SGLang's load_weights reports: the weights are half updated
                out = getattr(self.io, out_type)(
                    success=False, message=f"Failed to update parameter online: {exc}."
                )
        await self._send(out)

    async def _update_from_disk(self, obj: Any) -> None:
        try:
            await self.backend.load_path(obj.model_path)
            out = self.io.UpdateWeightFromDiskReqOutput(
                success=True, message="Succeeded to update model weights.", num_paused_requests=0
            )
            self.weight_version = obj.weight_version
        except Exception as exc:
            out = self.io.UpdateWeightFromDiskReqOutput(
                success=False, message=f"Failed to update weights: {exc}.", num_paused_requests=0
            )
        await self._send(out)


_WEIGHT_CALLS = {
    "InitWeightsUpdateGroupReqInput": ("init_weights_update_group", "InitWeightsUpdateGroupReqOutput"),
    "DestroyWeightsUpdateGroupReqInput": (
        "destroy_weights_update_group",
        "DestroyWeightsUpdateGroupReqOutput",
    ),
    "BeginWeightUpdateReqInput": ("begin_weight_update", "BeginWeightUpdateReqOutput"),
    "EndWeightUpdateReqInput": ("end_weight_update", "EndWeightUpdateReqOutput"),
    "UpdateWeightsFromDistributedReqInput": (
        "update_weights_from_distributed",
        "UpdateWeightsFromDistributedReqOutput",
    ),
}
"""Weight requests SGLang's `SchedulerWeightUpdaterManager` serves: its method, the reply type."""


class Generated:
    """One finished generation, as a backend reports it."""

    def __init__(
        self,
        text: str,
        response_ids: list[int],
        logprobs: list[float] | None,
        finish_reason: str,
        matched: Any = None,
        error: str = "",
    ) -> None:
        self.text, self.response_ids, self.logprobs = text, response_ids, logprobs
        self.finish_reason, self.matched, self.error = finish_reason, matched, error


def _health_check(obj: Any) -> bool:
    """SGLang's own test of a health-check generation (its rid prefix)."""
    from sglang.srt.managers.utils import is_health_check_generate_req

    return is_health_check_generate_req(obj)


def _aborted(message: str) -> Generated:
    return Generated("", [], None, "abort", error=message[:300])


class ModelBackend:
    """The tiny Qwen3-VL on the hf engine, fed SGLang's ids and SGLang's pixel values."""

    def __init__(self, model_path: str, max_batch: int = 8) -> None:
        from guirl.inference.hf import HFEngine

        self.engine = HFEngine("standin", model_path, max_batch=max_batch)
        self._queue: asyncio.Queue | None = None
        self._batcher: asyncio.Task | None = None
        self.max_batch = max_batch

    async def start(self) -> None:
        await self.engine.start()
        self._queue = asyncio.Queue()
        self._batcher = asyncio.get_running_loop().create_task(self._batches(), name="standin-batches")

    def image_tokens(self, ids: list[int]) -> int:
        pad = self.engine.renderer.image_token_id
        return sum(1 for t in ids if t == pad)

    async def generate(
        self, ids: list[int], mm_inputs: Any, sampling: Any, logprobs: bool, seed: int | None
    ) -> Generated:
        """Queued and served in batches of what waits together (a continuous batcher's admission)."""
        from guirl.inference.base import GenRequest

        req = GenRequest(
            prompt_ids=ids, rendered=self._rendered(ids, mm_inputs), sampling=_sampling(sampling, seed)
        )
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        assert self._queue is not None
        await self._queue.put((req, done))
        r = await done
        if r.finish_reason == "abort":
            return _aborted(r.error or "aborted")
        eos = r.response_ids[-1] if r.finish_reason == "stop" and r.response_ids else None
        matched = eos if eos in self.engine._eos else next((s for s in req.sampling.stop if s), None)
        return Generated(
            r.text, list(r.response_ids), list(r.logprobs) if logprobs else None, r.finish_reason, matched
        )

    async def _batches(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                results = await self.engine.generate([req for req, _ in batch])
            except Exception as exc:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (_, done), result in zip(batch, results):
                if not done.done():
                    done.set_result(result)

    def _rendered(self, ids: list[int], mm_inputs: Any) -> Any:
        """The model inputs SGLang prepared: its expanded ids, its pixel values and image grid."""
        import torch

        from guirl.inference.chat import RenderedPrompt

        pad = self.engine.renderer.image_token_id
        items = [it for it in (mm_inputs.mm_items if mm_inputs is not None else []) if it.feature is not None]
        pixels = [torch.as_tensor(it.feature) for it in items]
        grids = [torch.as_tensor(it.model_specific_data["image_grid_thw"]).reshape(-1, 3) for it in items]
        return RenderedPrompt(
            input_ids=ids,
            pixel_values=torch.cat(pixels) if pixels else None,
            image_grid_thw=torch.cat(grids) if grids else None,
            mm_token_type_ids=[1 if t == pad else 0 for t in ids],
        )

    async def load(self, named: list[tuple[str, Any]]) -> None:
        await self.engine.load_tensors(named)

    async def load_path(self, path: str) -> None:
        await self.engine.update_weights(self.engine.policy_version, WeightsFromDisk(path=path))

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
        await self.engine.close()


def _sampling(s: Any, seed: int | None) -> Any:
    """SGLang's normalized `SamplingParams` as guirl's (what the hf engine samples with); SGLang normalizes
    greedy sampling to top_k 1."""
    from guirl.messages.types import SamplingParams

    greedy = s.top_k == 1 or s.temperature <= 1e-6
    stop = s.stop_strs if isinstance(s.stop_strs, list) else [s.stop_strs] if s.stop_strs else []
    return SamplingParams(
        temperature=0.0 if greedy else float(s.temperature),
        top_p=float(s.top_p),
        top_k=max(0, int(s.top_k)) if s.top_k and s.top_k < (1 << 30) else 0,
        max_new_tokens=int(s.max_new_tokens),
        stop=list(stop),
        ignore_eos=bool(s.ignore_eos),
        seed=seed,
    )
