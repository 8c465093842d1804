"""The InferenceBroker actor: fronts the inference engines of one or more models.

Env workers (and the PRM actor) send `PolicyRequest`s; the broker queues them per model (bounded: a full
queue answers `overloaded`, retryable, which is the backpressure workers feel), hands them to the least-loaded
healthy engine that can take them, and answers every request with the engine's text, exact token ids,
behaviour log-probs and the policy version that produced them. Two ways to hand them over, per engine
(`Engine.max_inflight`, or `inference.dispatch` for all):

- static batches (hf, scripted): whenever the engine has nothing in flight, a batch of up to `max_batch`
  (waiting at most `max_wait_ms` for a partial one to fill) in one `generate` call;
- streaming (sglang, openai: servers that batch continuously by themselves): each request alone, as soon as
  the engine has fewer than `max_inflight` in flight, so nobody waits for a batch's slowest member.

Load is the estimated tokens in flight (prompt + `max_new_tokens`, `guirl.actors.routing`), then the
requests in flight: the in-flight cap already bounds the count, and within it a continuous batcher's step
time and memory grow with the tokens it holds, which differ severalfold between requests (screenshots of
history, response budgets).

Engines are health-checked on a period. A request that fails on an engine that died (or errs in a way
another engine may not) is put back at the head of the queue and tried elsewhere, up to `max_attempts`
engines per request; a request the engine rejects as bad fails alone, with a non-retryable error (a
batch rejected as bad is served again one request at a time, so its other requests are answered). A
call that takes longer than `request_timeout_s` (nobody waits for it any more) counts as the engine
failing. Queued and in-flight requests are bounded in bytes as well as in number (`runtime.inbox_max_bytes`,
the bound a mailbox holds its inbox to), and hold their images once (not also the received frames).

Weight updates (`WeightsPublished`) drain the policy's engines: nothing new is sent to them, their requests
in flight end (each within `request_timeout_s`, so an update waits at most that long however busy the
broker is), they update together, and they take requests again. So no response is tagged with a version older
than an update that has been acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec

from guirl.actors.routing import EngineSlot, ModelQueue, Pending, load_tokens
from guirl.config.schema import InferenceConfig, PRMConfig
from guirl.inference.base import Engine, EngineDead, EngineError, GenRequest, GenResult, weights_intact
from guirl.messages import PolicyChannel
from guirl.messages.types import (
    Ack,
    ErrorReply,
    Message,
    PolicyRequest,
    PolicyResponse,
    Tensor,
    WeightsPublished,
)
from guirl.messages.weights import WeightsFromBroadcast, WeightsFromDisk
from guirl.runtime.base import Actor, Request
from guirl.runtime.errors import FatalError

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 10.0
FAILURES_TO_DEAD = 3
"""Consecutive failed calls (of errors another engine may not have) after which an engine is routed
around until its health check passes."""


def make_engines(
    inference: InferenceConfig,
    *,
    ckpt: str,
    screen: tuple[int, int],
    coordinates: str,
    response_format: str = "computer_use",
    gpus: list[list[str]] | None = None,
    devices: list[str] | None = None,
    log_dir: str = "",
) -> list:
    """The engine instances the config asks for (imports each backend only when it is used). `gpus`: the
    GPU ids each launched SGLang server gets (the placement's); `devices`: the torch device of each hf
    engine (`cuda:<ordinal>`); `log_dir`: where launched servers log."""
    if inference.backend == "sglang":
        return _sglang_engines(inference, ckpt=ckpt, gpus=gpus, log_dir=log_dir)
    engines: list[Any] = []
    for i in range(inference.engines):
        match inference.backend:
            case "hf":
                from guirl.inference.hf import HFEngine

                h = inference.hf
                device = f"{h.device}:{i}" if h.device == "cuda" and inference.engines > 1 else h.device
                if devices and i < len(devices):
                    device = devices[i]
                engines.append(
                    HFEngine(
                        f"hf{i}",
                        ckpt,
                        device=device,
                        dtype=h.dtype,
                        max_batch=inference.max_batch,
                        threads=h.threads,
                    )
                )
            case "openai":
                from guirl.inference.openai import OpenAIEngine

                o = inference.openai
                engines.append(
                    OpenAIEngine(
                        f"openai{i}",
                        base_url=o.base_url,
                        model=o.model or ckpt,
                        api_key=o.api_key,
                        timeout_s=o.timeout_s,
                        max_concurrency=o.max_concurrency,
                        max_batch=inference.max_batch,
                    )
                )
            case "scripted":
                from guirl.inference.scripted import ScriptedEngine

                s = inference.scripted
                engines.append(
                    ScriptedEngine(
                        f"scripted{i}",
                        s.dir,
                        screen=screen,
                        coordinates=coordinates,
                        response_format=response_format,
                        latency_s=s.latency_s,
                        latency_jitter=s.latency_jitter,
                        max_batch=inference.max_batch,
                        tokens=s.tokens,
                    )
                )
            case other:
                raise FatalError(f"inference backend {other!r} is not available in this build")
    return engines


def _sglang_engines(
    inference: InferenceConfig, *, ckpt: str, gpus: list[list[str]] | None, log_dir: str, prefix: str = ""
) -> list:
    from guirl.inference.sglang import LaunchSpec, SGLangEngine

    sg = inference.sglang
    common = {
        "max_batch": inference.max_batch,
        "max_concurrency": sg.max_concurrency,
        "request_timeout_s": inference.request_timeout_s,
        "weight_load_format": sg.weight_load_format,
    }
    if sg.urls:
        return [
            SGLangEngine(
                f"{prefix}sglang{i}",
                ckpt,
                url=url,
                tp_size=sg.tp_size,
                start_timeout_s=sg.start_timeout_s,
                deterministic=sg.deterministic,
                **common,
            )
            for i, url in enumerate(sg.urls)
        ]
    engines = []
    for i in range(inference.engines):
        name = f"{prefix}sglang{i}"
        launch = LaunchSpec(
            model_path=ckpt,
            gpus=list(gpus[i]) if gpus and i < len(gpus) else [],
            tp_size=sg.tp_size,
            host=sg.host,
            port=sg.port + 50 * i if sg.port else 0,
            mem_fraction_static=sg.mem_fraction_static,
            context_length=sg.context_length,
            deterministic=sg.deterministic,
            command=list(sg.server_command),
            extra_args=list(sg.extra_args),
            log_path=f"{log_dir}/{name}.log" if log_dir else "",
            start_timeout_s=sg.start_timeout_s,
        )
        engines.append(SGLangEngine(name, ckpt, launch=launch, **common))
    return engines


def make_judge_engines(
    prm: Any,
    *,
    ckpt: str,
    gpus: list[list[str]] | None = None,
    devices: list[str] | None = None,
    log_dir: str = "",
) -> list:
    """The PRM judge's engines (`prm` is a PRMConfig): the policy's backends, or the scripted judge."""
    if prm.backend == "scripted":
        from guirl.inference.scripted import ScriptedJudgeEngine

        s = prm.scripted
        return [
            ScriptedJudgeEngine(f"judge{i}", latency_s=s.latency_s, invalid_every=s.invalid_every)
            for i in range(prm.engines)
        ]
    inference = InferenceConfig(
        backend=prm.backend,
        engines=prm.engines,
        max_batch=prm.max_batch,
        request_timeout_s=prm.request_timeout_s,
        hf=prm.hf,
        openai=prm.openai,
        sglang=prm.sglang,
    )
    if prm.backend == "sglang":  # named before launch: a server's log is named after its engine
        return _sglang_engines(inference, ckpt=ckpt, gpus=gpus, log_dir=log_dir, prefix="judge-")
    engines = make_engines(inference, ckpt=ckpt, screen=(0, 0), coordinates="relative", devices=devices)
    for e in engines:
        e.name = f"judge-{e.name}"
    return engines


def weight_ranks(engine: Any) -> int:
    """Ranks `engine` takes in the learner's weight group (1, or an SGLang server's tensor-parallel size)."""
    return int(getattr(engine, "weight_ranks", 1))


def _response(result: GenResult, waited: float) -> PolicyResponse:
    def tensor(values: list | None, dtype: str) -> Tensor | None:
        return None if values is None else Tensor.from_list(values, dtype)  # type: ignore[arg-type]

    return PolicyResponse(
        text=result.text,
        prompt_ids=tensor(result.prompt_ids, "int32"),
        response_ids=tensor(result.response_ids, "int32"),
        logprobs=tensor(result.logprobs, "float32"),
        finish_reason=result.finish_reason,
        policy_version=result.policy_version,
        policy_epoch=result.policy_epoch,
        engine=result.engine,
        latency_s=result.latency_s + waited,
        queue_s=waited,
        error=result.error,
    )


class JudgeModel(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The PRM's judge, served beside the policy under `prm.model_name` (its own engines, never updated)."""

    prm: PRMConfig
    ckpt: str = ""
    """Its checkpoint ("" for the scripted judge or an OpenAI-compatible one named in `prm.openai`)."""


class BrokerGpus(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Where the engines go (`guirl.placement`): GPU ids per launched server, torch devices of hf engines;
    None: wherever the backend's defaults put them."""

    rollout_gpus: list[list[str]] | None = None
    rollout_devices: list[str] | None = None
    judge_gpus: list[list[str]] | None = None
    judge_devices: list[str] | None = None


class BrokerOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    inference: InferenceConfig = msgspec.field(default_factory=InferenceConfig)
    """The policy's engines and the batching over them (`[inference]`)."""
    ckpt: str = ""
    """The policy checkpoint the engines load."""
    screen: list[int] = msgspec.field(default_factory=lambda: [1920, 1080])
    """The desktops' width and height (the engines' coordinates are relative to it)."""
    coordinates: str = "relative"
    """`agent.coordinates`: the coordinate convention of the policy's actions."""
    response_format: str = "computer_use"
    """`agent.response_format`: how a scripted engine writes its answers."""
    model: str = "policy"
    """The model name the policy is served under."""
    judge: JudgeModel | None = None
    """Also serve the PRM's judge."""
    placement: BrokerGpus = msgspec.field(default_factory=BrokerGpus)
    log_dir: str = ""
    """Where launched servers write their logs."""


class InferenceBroker(Actor):
    """Batches and routes policy requests over engine instances; see the module docstring."""

    role = "broker"
    channel = PolicyChannel
    Options = BrokerOptions

    def __init__(
        self,
        name: str,
        options: BrokerOptions | None = None,
        *,
        engines: list[Engine] | None = None,
        **runtime: Any,
    ) -> None:
        """`engines`: engines made in this process (tests, offline scoring) instead of from `options`."""
        super().__init__(name, **runtime)
        options = options or BrokerOptions()
        self.cfg = options.inference
        self._engines = engines
        placed = options.placement
        self._engine_args = {
            "ckpt": options.ckpt,
            "screen": tuple(options.screen),
            "coordinates": options.coordinates,
            "response_format": options.response_format,
            "gpus": placed.rollout_gpus,
            "devices": placed.rollout_devices,
            "log_dir": options.log_dir,
        }
        self._judge_args = {
            "gpus": placed.judge_gpus,
            "devices": placed.judge_devices,
            "log_dir": options.log_dir,
        }
        self.model = options.model
        self._judge = options.judge  # also serve the PRM's judge
        self.models: dict[str, ModelQueue] = {}
        self.pending_bytes = 0  # frames' worth of the requests queued or being served
        self._tasks: set[asyncio.Task] = set()
        self._updating = asyncio.Lock()  # weight updates take turns (each drains the engines)
        # (sender, update, its lineage epoch) while they run
        self._pending_updates: list[tuple[str, asyncio.Task, int]] = []
        self.policy_epoch = 0  # the learner lineage of the policy engines' weights (`WeightsPublished.epoch`)

    # -- lifecycle -----------------------------------------------------------------------------------

    async def setup(self) -> None:
        engines = self._engines if self._engines is not None else make_engines(self.cfg, **self._engine_args)
        await self._start_model(self.model, engines)
        if self._judge is not None:  # the PRM's judge: another model name, its own engines, never updated
            prm = self._judge.prm
            judge = make_judge_engines(prm, ckpt=self._judge.ckpt, **self._judge_args)
            # the PRM has up to max_concurrency x votes judge requests out at once: never refuse those
            queue = max(self.cfg.max_queue, prm.max_concurrency * prm.votes)
            await self._start_model(prm.model_name, judge, max_batch=prm.max_batch, max_queue=queue)
        self.policy_version = max(slot.engine.policy_version for slot in self.models[self.model].slots)

    async def _start_model(
        self, model: str, engines: list[Engine], max_batch: int | None = None, max_queue: int | None = None
    ) -> None:
        if not engines:
            raise FatalError(f"the broker has no engines for {model!r}")
        if model in self.models:
            raise FatalError(f"two sets of engines for model name {model!r}")
        queue = ModelQueue(
            model,
            engines,
            max_batch or self.cfg.max_batch,
            max_queue or self.cfg.max_queue,
            dispatch=self.cfg.dispatch,
        )
        with self.busy("load"):
            results = await asyncio.gather(*(e.start() for e in engines), return_exceptions=True)
        for slot, res in zip(queue.slots, results, strict=True):
            if isinstance(res, BaseException):
                log.error("engine %s failed to start: %r", slot.engine.name, res)
                self.counters["engines.start_failed"] += 1
            else:
                slot.healthy = True
        if not queue.any_healthy:
            raise FatalError(f"no engine of {model!r} could start: {results[0]!r}")
        self.models[model] = queue
        log.info(
            "%d engine(s) up for %r: %s",
            len(engines),
            model,
            [f"{s.engine.name} ({f'streams {s.stream}' if s.stream else 'batches'})" for s in queue.slots],
        )

    async def main(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for queue in self.models.values():
                self._tasks.add(tg.create_task(self._dispatch(queue, tg), name=f"dispatch:{queue.model}"))
                self._tasks.add(tg.create_task(self._health_loop(queue), name=f"health:{queue.model}"))
            await self._stop.wait()
            for task in self._tasks:  # dispatchers, health checks and calls in flight
                task.cancel()

    async def teardown(self) -> None:
        for queue in self.models.values():
            for slot in queue.slots:
                try:
                    await slot.engine.close()
                except Exception as exc:  # closing must not hide other engines' close
                    log.warning("engine %s did not close cleanly: %r", slot.engine.name, exc)

    # -- requests ------------------------------------------------------------------------------------

    def stats(self) -> Any:
        """The counters, and gauges: `weights.live_ranks`, the weight-group ranks the policy's healthy
        engines take now (the learner sizes its next group by it, so a dead engine does not hold a broadcast
        up); `requests.queued` and `requests.inflight`, over every model, now; `weights.pending`, the
        weight updates under way; and per policy engine its `version`, lineage `epoch`, `healthy` and
        `weights_intact`."""
        reply = super().stats()
        reply.counters["weights.live_ranks"] = self.live_weight_ranks()
        reply.counters["requests.queued"] = sum(len(q.queue) for q in self.models.values())
        reply.counters["requests.inflight"] = sum(q.inflight for q in self.models.values())
        reply.counters["weights.pending"] = sum(1 for _, u, _ in self._pending_updates if not u.done())
        queue = self.models.get(self.model)
        for slot in queue.slots if queue is not None else []:  # what each policy engine serves now
            name = slot.engine.name
            reply.counters[f"engine.{name}.version"] = slot.engine.policy_version
            reply.counters[f"engine.{name}.epoch"] = getattr(slot.engine, "policy_epoch", 0)
            reply.counters[f"engine.{name}.healthy"] = int(slot.healthy)
            reply.counters[f"engine.{name}.weights_intact"] = int(weights_intact(slot.engine))
        return reply

    def live_weight_ranks(self) -> int:
        queue = self.models.get(self.model)
        return sum(weight_ranks(s.engine) for s in queue.slots if s.healthy) if queue is not None else 0

    async def handle(self, req: Request) -> Message | None:
        match req.msg:
            case PolicyRequest() as msg:
                return self._enqueue(req, msg)
            case WeightsPublished() as msg:
                return await self._weights(req.peer_name, msg)
        return await super().handle(req)

    async def _weights(self, sender: str, msg: WeightsPublished) -> Message:
        """Run one weight update, abandoned (the engines keep serving their weights) as soon as its sender
        is declared dead or leaves, or sends a newer update: a broadcast from a dead learner never comes,
        and waiting for the weight group's timeout would hold every engine that long."""
        if msg.source is None:
            return ErrorReply(
                code="schema", message="a weight update needs a source (from disk, or a broadcast)"
            )
        actor = sender.split("/", 1)[0]  # a routing id is the actor's name and its process's own suffix
        newest = max([self.policy_epoch, *(epoch for _, _, epoch in self._pending_updates)])
        if msg.epoch < newest:
            # a dead learner's update, handled after its successor's: it would put the engines back on
            # weights outside the new learner's lineage (and must not cancel the successor's)
            self.counters["weights.stale_epoch"] += 1
            return ErrorReply(
                code="version",
                message=f"update of epoch {msg.epoch}: the engines serve (or take) epoch {newest} already",
            )
        for other, pending, _ in self._pending_updates:
            # superseded: given up on by its sender, or sent by a learner that has restarted since
            if other.split("/", 1)[0] == actor and not pending.done() and not pending.cancelling():
                self.counters["weights.superseded"] += 1
                pending.cancel()
        update = asyncio.create_task(self._update_weights(msg))
        entry = (sender, update, msg.epoch)
        self._pending_updates.append(entry)
        try:
            await asyncio.wait({update})
        finally:
            self._pending_updates.remove(entry)
            if not update.done():  # the handler itself is cancelled (shutdown)
                update.cancel()
        if update.cancelled():
            self.counters["weights.abandoned"] += 1
            log.warning("weight update to version %d abandoned (%s gone, or superseded)", msg.version, sender)
            return ErrorReply(code="peer_dead", message=f"update to version {msg.version} abandoned")
        update.result()  # its failure is the reply
        return Ack(note=f"engines at version {msg.version}")

    def on_peer_dead(self, name: str, error: Exception) -> None:
        for sender, update, _ in self._pending_updates:
            if sender == name and not update.done() and not update.cancelling():
                log.warning("%s, the sender of a pending weight update, is dead (%s): abandoned", name, error)
                update.cancel()

    def on_peer_left(self, name: str) -> None:
        self.on_peer_dead(name, ConnectionError("left"))

    def _enqueue(self, req: Request, msg: PolicyRequest) -> Message | None:
        queue = self.models.get(msg.model)
        if queue is None:
            self.counters["requests.unknown_model"] += 1
            return ErrorReply(code="unsupported", message=f"no engine serves model {msg.model!r}")
        if not queue.any_serving:
            self.counters["requests.no_engine"] += 1
            return ErrorReply(code="overloaded", message="no healthy engine right now", retryable=True)
        if len(queue.queue) >= queue.max_queue:
            self.counters["requests.overloaded"] += 1
            return ErrorReply(
                code="overloaded", message=f"{len(queue.queue)} requests queued", retryable=True
            )
        if self.pending_bytes + req.nbytes > self.runtime.inbox_max_bytes:
            self.counters["requests.overloaded"] += 1
            return ErrorReply(
                code="overloaded", message=f"{self.pending_bytes} bytes of requests pending", retryable=True
            )
        gen = GenRequest(
            messages=list(msg.messages),
            images=[bytes(img.data.data) for img in msg.images],
            prompt_ids=msg.prompt_ids.tolist() if msg.prompt_ids is not None else None,
            sampling=msg.sampling,
            return_logprobs=msg.return_logprobs,
            request_id=req.header.msg_id,
            task_id=msg.task_id,
            step=msg.step,
            episode_id=msg.episode_id,
        )
        queue.queue.append(
            Pending(req.peer, req.header.msg_id, gen, time.monotonic(), req.nbytes, load_tokens(msg))
        )
        self.pending_bytes += req.nbytes
        self.counters["requests"] += 1
        queue.changed.set()
        return None  # answered by the batch that serves it

    # -- batching and routing ------------------------------------------------------------------------

    async def _dispatch(self, queue: ModelQueue, tg: asyncio.TaskGroup) -> None:
        """Whenever an engine can take work and requests wait, hand it the head request (a streaming engine)
        or a batch from the head (a static one)."""
        wait_s = self.cfg.max_wait_ms / 1000.0
        while True:
            slot = queue.pick(queue.queue[0].tried) if queue.queue else None
            if slot is None:
                queue.changed.clear()
                await queue.changed.wait()
                continue
            if slot.stream:  # no batch to fill: the request joins the engine's running batch now
                self._send(queue, slot, [queue.queue.popleft()], tg)
                continue
            limit = max(1, min(queue.max_batch, slot.engine.max_batch))
            # a partial batch waits (briefly) for company; a full one, or no wait configured, goes now
            deadline = time.monotonic() + wait_s
            while len(queue.queue) < limit and (left := deadline - time.monotonic()) > 0:
                queue.changed.clear()
                try:
                    await asyncio.wait_for(queue.changed.wait(), left)
                except TimeoutError:
                    break
            if not slot.free:  # it died, or is draining for a weight update, while we waited: pick again
                continue
            batch = [queue.queue.popleft() for _ in range(min(limit, len(queue.queue)))]
            if batch:
                self._send(queue, slot, batch, tg)

    def _send(self, queue: ModelQueue, slot: EngineSlot, batch: list[Pending], tg: asyncio.TaskGroup) -> None:
        slot.take(batch)  # before any await: the next pick sees it
        kind = "request" if slot.stream else "batch"
        task = tg.create_task(self._serve(queue, slot, batch), name=f"{kind}:{slot.engine.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, queue: ModelQueue, slot: EngineSlot, batch: list[Pending]) -> None:
        try:
            await self._generate(queue, slot, batch)
        finally:
            slot.release(batch)
            queue.changed.set()

    async def _generate(self, queue: ModelQueue, slot: EngineSlot, batch: list[Pending]) -> None:
        """One `generate` call on `slot` for `batch`, and the answers (or the failure) it leads to."""
        engine = slot.engine
        started = time.monotonic()
        try:
            # Past the request timeout nobody waits for this call: an engine that hangs (its health probe
            # may still say yes) must fail it, or its requests are never answered (nor its drain ends).
            try:
                async with asyncio.timeout(self.cfg.request_timeout_s):
                    results = await engine.generate([p.gen for p in batch])
            except TimeoutError:
                raise EngineError(
                    f"no results within {self.cfg.request_timeout_s:g} s", retryable=True
                ) from None
            if len(results) != len(batch):
                raise EngineError(f"engine returned {len(results)} results for {len(batch)} requests")
        except Exception as exc:
            if len(batch) > 1 and not getattr(exc, "retryable", True):
                # The engine rejected the batch for a bad request: serve each alone, so only the bad one
                # fails (its batch-mates would otherwise end their episodes as environment errors).
                self.counters["batches.split"] += 1
                for i, p in enumerate(batch):
                    if not slot.healthy:  # it died meanwhile: the rest go back to the queue's head
                        queue.queue.extendleft(reversed(batch[i:]))
                        break
                    await self._generate(queue, slot, [p])
                return
            self._batch_failed(queue, slot, batch, exc)
            return
        slot.failures = 0
        if slot.stream:
            self.counters["requests.streamed"] += len(batch)
        else:
            self.counters["batches"] += 1
            self.counters["batched_requests"] += len(batch)
        for p, result in zip(batch, results, strict=True):
            try:
                reply: Message = _response(result, started - p.enqueued)
            except (OverflowError, TypeError, ValueError) as exc:  # an engine's result no reply can carry
                self.counters["requests.failed"] += 1
                log.warning("engine %s: a result for %s cannot be sent: %r", slot.engine.name, p.msg_id, exc)
                reply = ErrorReply(
                    code="handler", message=f"engine {slot.engine.name}: bad result: {exc}"[:300]
                )
            else:
                self.counters[f"finish.{result.finish_reason}"] += 1
            self._answer(p, reply)

    def _answer(self, p: Pending, msg: Message) -> None:
        """Send a request its one answer and stop counting its bytes."""
        self.pending_bytes -= p.nbytes
        self.mailbox.send(p.peer, msg, reply_to=p.msg_id)

    def _batch_failed(
        self, queue: ModelQueue, slot: EngineSlot, batch: list[Pending], exc: Exception
    ) -> None:
        name = slot.engine.name
        retryable = getattr(exc, "retryable", True)  # a bug in an engine counts as that engine failing
        if retryable:  # a request rejected as bad says nothing against the engine
            slot.failures += 1
        # Dead (or a bug), or failing again and again: route around it until a health check passes. One
        # passing fault (a rate limit, a timeout) only sends its requests elsewhere.
        if (
            isinstance(exc, EngineDead)
            or not isinstance(exc, EngineError)
            or slot.failures >= FAILURES_TO_DEAD
        ):
            if slot.healthy:  # once, however many of its requests in flight fail with it
                log.warning("engine %s failed (%r): routing around it until it is healthy", name, exc)
                self.counters["engines.marked_dead"] += 1
            slot.healthy = False
        self.counters["streamed.failed" if slot.stream else "batches.failed"] += 1
        requeue = []
        for p in batch:
            p.attempts += 1
            p.tried.add(name)
            if retryable and p.attempts < self.cfg.max_attempts and queue.any_serving:
                requeue.append(p)
            else:
                self.counters["requests.failed"] += 1
                err = ErrorReply(
                    code="handler",
                    message=f"engine {name}: {str(exc)[:300]}",
                    retryable=retryable,
                )
                self._answer(p, err)
        self.counters["requests.retried"] += len(requeue)
        queue.queue.extendleft(reversed(requeue))  # keep their order, ahead of newer requests

    # -- health and weights --------------------------------------------------------------------------

    async def _health_loop(self, queue: ModelQueue) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_interval_s)
            for slot in queue.slots:
                if slot.draining:  # mid-update: SGLang answers no probe while its weights change (it holds
                    continue  # the writer lock); the update itself says whether the engine came through
                try:
                    ok = await asyncio.wait_for(slot.engine.health(), HEALTH_TIMEOUT_S)
                except Exception:
                    ok = False
                if slot.draining:  # an update began while it was probed: its verdict is the update's
                    continue
                if ok and not slot.healthy:
                    slot.failures = 0  # a fresh start: it is judged by what it does from now on
                if ok != slot.healthy:
                    log.warning("engine %s is %s", slot.engine.name, "back" if ok else "unhealthy")
                    self.counters["engines.revived" if ok else "engines.marked_dead"] += 1
                slot.healthy = ok
            if not queue.any_serving and queue.queue:
                # nothing can serve them: answer now (retryable) rather than let every caller time out
                while queue.queue:
                    p = queue.queue.popleft()
                    err = ErrorReply(code="overloaded", message="no healthy engine", retryable=True)
                    self._answer(p, err)
                    self.counters["requests.failed"] += 1
            queue.changed.set()

    async def _update_weights(self, msg: WeightsPublished) -> None:
        """Updates take turns; see `_update_drained`."""
        arrived = time.monotonic()
        async with self._updating:
            with self.busy("load_weights"):
                await self._update_drained(msg, arrived)

    async def _update_drained(self, msg: WeightsPublished, arrived: float) -> None:
        """Every healthy policy engine takes the new weights with nothing in flight (`_drained`): from a path,
        or by joining the learner's weight group (rank 1.. in engine order), all at once, since a broadcast
        completes only when every member has joined. The learner sized the group by `weights.live_ranks`; if
        the healthy engines no longer fill it exactly, the update fails (the learner falls back to the disk
        path). An engine that is down keeps its version (its samples are tagged with it) until a later update.
        The judge's engines keep theirs (the PRM is not trained)."""
        queue = self.models[self.model]
        slots = [s for s in queue.slots if s.healthy]
        if not slots:
            raise EngineError("no healthy policy engine to update")
        source = msg.source
        timeout = 0.0
        match source:
            case WeightsFromBroadcast(group=group):
                live = sum(weight_ranks(s.engine) for s in slots)
                if group.world_size != 1 + live:
                    raise EngineError(
                        f"the weight group has {group.world_size} ranks, but the learner and the healthy "
                        f"engines take {1 + live}"
                    )
                timeout = group.timeout_s
            case WeightsFromDisk():
                pass

        async def one(rank: int, slot: EngineSlot) -> None:
            await slot.engine.update_weights(msg.version, source, epoch=msg.epoch, rank=rank)

        # an engine takes one rank of the group per GPU it spans (an SGLang server with tensor parallelism)
        offsets = [1]
        for slot in slots[:-1]:
            offsets.append(offsets[-1] + weight_ranks(slot.engine))
        async with self._drained(queue, slots):
            waited = time.monotonic() - arrived
            # joining takes time too: leave it a quarter of the timeout, 15 s at least (half, on a short one)
            if timeout and waited >= timeout - min(0.5 * timeout, max(15.0, 0.25 * timeout)):
                # the learner stopped waiting for the engines to join: joining now would leave each engine
                # waiting for a learner that is gone (SGLang gives a group 30 minutes)
                raise EngineError(
                    f"draining the engines took {waited:.0f} s, past the weight group's {timeout:g} s: the "
                    "learner has given up on this group (it loads this version from disk instead)"
                )
            # every engine's update runs to its end before any takes requests again (one failing must not
            # let requests reach another mid-update)
            results = await asyncio.gather(
                *(one(rank, slot) for rank, slot in zip(offsets, slots, strict=True)), return_exceptions=True
            )
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed
        self.policy_version, self.policy_epoch = msg.version, msg.epoch
        self.counters["weights.updates"] += 1

    @contextlib.asynccontextmanager
    async def _drained(self, queue: ModelQueue, slots: list[EngineSlot]) -> Any:
        """Stop sending `slots` requests and wait until none is in flight, run the body, then resume. The
        wait is bounded: each call in flight ends within `request_timeout_s`, and nothing new starts. A
        request arriving meanwhile goes to an engine not drained, or waits in the queue."""
        for slot in slots:
            slot.draining = True
        try:
            started = time.monotonic()
            await asyncio.gather(*(slot.idle.wait() for slot in slots))
            self.counters["weights.drain_ms"] += round((time.monotonic() - started) * 1000)
            yield
        finally:
            for slot in slots:
                slot.draining = False
            queue.changed.set()
