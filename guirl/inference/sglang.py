"""The `sglang` engine: one SGLang server (launched here, or attached to by URL) behind the `Engine`
protocol, speaking SGLang's native HTTP API (the releases in setup.cfg's `gpu` extra; tests/contract runs
SGLang's own code on what this module sends).

Generation: `POST /generate` (`guirl.inference.sglang_api`) with the prompt's token ids, rendered here with
the checkpoint's own tokenizer and image processor as the `hf` engine renders them, each image's pad run
collapsed to one `<|image_pad|>` (SGLang expands it from the image grid), the step's images as `data:`
URLs, the sampling settings and `return_logprob`. The result carries guirl's expanded prompt ids (checked
against the ids the server echoes), the response ids and their log-probs, and the finish reason, exactly
as the `hf` engine returns them.

Weights (`update_weights`): from the learner's weight group, `POST /init_weights_update_group` once per group
(rank offset: this engine's first rank in the group; a server with tensor parallelism takes `tp_size`
ranks; the group it was in before is destroyed first: SGLang refuses a group name it already holds), then,
inside a weight-update session (`POST /begin_weight_update` ... `POST /end_weight_update`, always ended;
SGLang 0.5.21+ refuses a distributed update outside one, and an older server, without the routes, is
refused here), one `POST /update_weights_from_distributed` per bucket of the learner's plan (names, dtypes,
shapes; `load_format="flattened_bucket"` or one collective per tensor) while the learner broadcasts that
bucket, then `POST /flush_cache?timeout=...` (the radix cache holds KV of the old weights; SGLang refuses a
flush while any request runs, and waits for idle up to the timeout; until a flush succeeds the engine
serves nothing). From disk: `POST /update_weights_from_disk`. The broker drains the engine first, so
generation is never paused mid-request.

Seeds: `sampling_seed` is honoured only by a server started with `--enable-deterministic-inference`
(`inference.sglang.deterministic` launches with it; an attached server says in `/server_info`); to any other
server no seed is sent, and requests that carry one are sampled unseeded (logged once).

Errors: the server unreachable or gone is `EngineDead`; a timeout, a 5xx or a reply that is not what
SGLang sends is a retryable `EngineError` (another engine may serve); a 4xx to a generate request is that
request's fault and answers it alone with `finish_reason="abort"`. Every call has a timeout and every body
read is capped: a broken or hostile server cannot hang or flood the broker.

Launch: `guirl.inference.sglang_launch` (the command line, the environment, the log, stopping it); ready when
`/health_generate` answers 200; a server that exits or does not get ready in time fails the start with its
log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import subprocess
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from guirl.inference.base import (
    EngineDead,
    EngineError,
    GenRequest,
    GenResult,
    gather_requests,
    stamp,
    took_weights,
)
from guirl.inference.openai import error_message, read_capped
from guirl.inference.sglang_api import (
    bucket_body,
    generate_body,
    init_group_body,
    load_renderer,
    model_vocab,
    parse_generate,
    render_request,
    wire_ids,
)
from guirl.inference.sglang_launch import LaunchSpec, log_tail, spawn_server, stop_server
from guirl.messages.weights import (
    SGLangBucket,
    WeightGroupSpec,
    WeightsFromBroadcast,
    WeightsFromDisk,
    WeightSource,
)

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 2**20
"""Largest reply read from a server (a response's ids and log-probs are far smaller)."""
HEALTH_TIMEOUT_S = 20.0
"""Most seconds a health probe waits (SGLang's `/health_generate` runs a one-token generation)."""
CONTROL_TIMEOUT_S = 60.0
"""Most seconds a control call (flush, pause, server info) waits."""
CLEANUP_TIMEOUT_S = 10.0
"""Most seconds the clean-up after a failed update waits (ending its session, leaving its group)."""
FLUSH_WAIT_S = 30.0
"""Most seconds SGLang may wait for its running requests (a health probe's) to end before flushing."""
KEEPALIVE_S = 4.0
"""Most seconds an idle connection is reused: under the server's keep-alive (SGLang's uvicorn closes idle ones
after `SGLANG_TIMEOUT_KEEP_ALIVE`, 5 s), so a request is never written into a connection the server is
closing (aiohttp's 15 s default did: "Can not write request body", taken for a dead server)."""


class SGLangEngine:
    """One SGLang server; see the module docstring."""

    supports_tokens = True
    max_inflight = property(lambda self: self.max_concurrency)  # batches continuously (Engine.max_inflight)

    def __init__(
        self,
        name: str,
        ckpt_dir: str | Path,
        *,
        url: str = "",
        launch: LaunchSpec | None = None,
        tp_size: int = 1,
        max_batch: int = 32,
        max_concurrency: int = 64,
        request_timeout_s: float = 600.0,
        weight_load_format: str = "flattened_bucket",
        start_timeout_s: float = 1200.0,
        deterministic: bool = False,
    ) -> None:
        if bool(url) == (launch is not None):
            raise ValueError(
                f"engine {name}: give a server URL or a launch spec, not {'both' if url else 'neither'}"
            )
        self.name = name
        self.ckpt_dir = Path(ckpt_dir)
        self.url = url.rstrip("/")
        self.launch = launch
        self.tp_size = launch.tp_size if launch is not None else tp_size
        self.max_batch = max(1, max_batch)
        self.max_concurrency = max_concurrency
        self.request_timeout_s = request_timeout_s
        self.flattened = weight_load_format == "flattened_bucket"
        self.start_timeout_s = launch.start_timeout_s if launch is not None else start_timeout_s
        self.deterministic = launch.deterministic if launch is not None else deterministic
        """The server honours `sampling_seed` (asked for; an attached server's `/server_info` has the last
        word)."""
        self.policy_version = -1
        self.weights_intact = True
        """False after an update failed half-way through its buckets (see `base.weights_intact`)."""
        self.last_update: dict[str, float] = {}
        """Seconds the last weight update spent: `join` (forming the group), `receive`, `flush`."""
        self._proc: subprocess.Popen | None = None
        self._log_file: Any = None
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None
        self._renderer: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._group: tuple[WeightGroupSpec, int] | None = None  # the weight group joined, and our first rank
        self._stale_cache = False  # weights changed, cache not flushed yet: serves nothing until it is
        self._vocab = 2**31
        self._seeds_ignored_logged = False
        self._rid = 0

    @property
    def weight_ranks(self) -> int:
        """Ranks this engine takes in the learner's weight group (one per tensor-parallel GPU)."""
        return self.tp_size

    @property
    def pid(self) -> int | None:
        """The launched server's process id (None when attached)."""
        return self._proc.pid if self._proc is not None else None

    def __repr__(self) -> str:
        return f"SGLangEngine({self.name!r}, url={self.url!r}, tp={self.tp_size})"

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the renderer, launch the server (or find the attached one) and wait until it serves."""
        try:
            self._renderer = await self._in_worker(load_renderer, self.ckpt_dir)
            self._vocab = model_vocab(self.ckpt_dir)
        except (OSError, ValueError) as exc:
            raise EngineError(
                f"engine {self.name}: cannot load the tokenizer of {self.ckpt_dir}: {exc}", retryable=False
            ) from exc
        connector = aiohttp.TCPConnector(limit=self.max_concurrency + 4, keepalive_timeout=KEEPALIVE_S)
        self._session = aiohttp.ClientSession(connector=connector)
        self._slots = asyncio.Semaphore(self.max_concurrency)
        if self.launch is not None:
            self._spawn()
        await self._wait_ready(self.start_timeout_s)
        info = await self._server_info()
        info = info if isinstance(info, dict) else {}
        tp = info.get("tp_size")
        if isinstance(tp, int) and tp != self.tp_size:
            raise EngineError(
                f"engine {self.name}: {self.url} serves with tp_size {tp}, the config says {self.tp_size} "
                "(inference.sglang.tp_size): the weight group would count the wrong ranks",
                retryable=False,
            )
        served = info.get("enable_deterministic_inference")
        if isinstance(served, bool):
            if self.deterministic and not served:
                log.warning(
                    "engine %s: %s was not started with --enable-deterministic-inference: its samples "
                    "ignore the requests' seeds (inference.sglang.deterministic asks for them)",
                    self.name,
                    self.url,
                )
            self.deterministic = served

    def _spawn(self) -> None:
        assert self.launch is not None
        self._proc, self.url, self._log_file = spawn_server(self.launch, self.name)

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise EngineError(
                    f"engine {self.name}: the SGLang server exited with code {self._proc.returncode} while "
                    f"starting{self._log_tail()}",
                    retryable=False,
                )
            if await self.health():
                return
            if time.monotonic() > deadline:
                raise EngineError(
                    f"engine {self.name}: {self.url} not serving after {timeout_s:g} s{self._log_tail()}",
                    retryable=False,
                )
            await asyncio.sleep(delay)  # a readiness poll's backoff, not synchronisation
            delay = min(delay * 2, 1.0)

    def _log_tail(self) -> str:
        return log_tail(self.launch.log_path if self.launch is not None else "")

    async def health(self) -> bool:
        """True when `/health_generate` answers 200 (and a launched server's process is alive), and no flush
        is owed since a weight update (one is tried here)."""
        if self._session is None or (self._proc is not None and self._proc.poll() is not None):
            return False
        if self._stale_cache:
            try:
                await self.flush_cache(wait_s=5.0)  # within the broker's patience for a probe
            except EngineError as exc:
                log.warning("engine %s: still not flushed since its weight update: %s", self.name, exc)
                return False
        try:
            timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
            async with self._session.get(f"{self.url}/health_generate", timeout=timeout) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def close(self) -> None:
        """Leave the weight group (an attached server keeps serving, and would hold the group's name); close
        the session; stop a launched server (its whole process group: TP workers too)."""
        if self._group is not None and self._session is not None and self._proc is None:
            with contextlib.suppress(EngineError):
                await self._leave()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._proc is not None:
            await asyncio.get_running_loop().run_in_executor(None, stop_server, self._proc)
            self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def _in_worker(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine-{self.name}")
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    # -- generation ---------------------------------------------------------------------------------

    async def generate(self, batch: list[GenRequest]) -> list[GenResult]:
        """Send every request at once (SGLang batches them); results in batch order."""
        if self._session is None or self._renderer is None:
            raise EngineDead(f"engine {self.name} is not started")
        started = time.monotonic()
        return stamp(await gather_requests(self._one(req) for req in batch), self, started)

    async def _one(self, req: GenRequest) -> GenResult:
        if (
            self._stale_cache
        ):  # a prefix hit would reuse KV the old weights computed: elsewhere, until flushed
            raise EngineError(
                f"engine {self.name}: its cache is not flushed since a weight update", retryable=True
            )
        try:
            prompt_ids, images = await self._in_worker(render_request, self._renderer, req)
        except ValueError as exc:  # the request itself is bad: answered alone, as the hf engine does
            log.warning("engine %s: request %r aborted: %s", self.name, req.request_id, exc)
            return GenResult(text="", finish_reason="abort", error=str(exc)[:300])
        if req.sampling.seed is not None and not self.deterministic and not self._seeds_ignored_logged:
            self._seeds_ignored_logged = True
            log.info(
                "engine %s: requests carry sampling seeds, which %s ignores (not deterministic: set "
                "inference.sglang.deterministic to launch with --enable-deterministic-inference)",
                self.name,
                self.url,
            )
        self._rid += 1
        body = generate_body(
            req,
            wire_ids(prompt_ids, self._renderer.image_token_id),
            images,
            rid=f"{self.name}-{self._rid}-{req.request_id}"[:200],
            seeded=self.deterministic,
        )
        assert self._slots is not None
        async with self._slots:
            status, raw = await self._post("/generate", body, self.request_timeout_s)
        if 400 <= status < 500 and status not in (408, 429):
            message = error_message(raw)
            log.warning("engine %s: request %r refused (%d): %s", self.name, req.request_id, status, message)
            return GenResult(text="", finish_reason="abort", error=f"{status} {message}"[:300])
        if status >= 400:
            raise EngineError(f"{self.url}/generate: {status} {error_message(raw)}", retryable=True)
        return parse_generate(
            raw, prompt_ids, f"{self.url}/generate", logprobs=req.return_logprobs, vocab=self._vocab
        )

    async def _post(self, path: str, body: Any, timeout_s: float) -> tuple[int, bytes]:
        if self._session is None:
            raise EngineDead(f"engine {self.name} is not started (or was closed)")
        url = f"{self.url}{path}"
        try:
            async with self._session.post(
                url,
                data=msgspec.json.encode(body),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                return resp.status, await read_capped(resp, MAX_RESPONSE_BYTES)
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            # refused, dropped or reset: the server is gone (or restarting), not slow
            raise EngineDead(f"{url}: {type(exc).__name__}: {exc}") from None
        except TimeoutError:
            if self._proc is not None and self._proc.poll() is not None:
                raise EngineDead(f"{url}: the server exited with code {self._proc.returncode}") from None
            raise EngineError(f"{url}: no answer within {timeout_s:g} s", retryable=True) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineError(f"{url}: {type(exc).__name__}: {exc}", retryable=True) from None

    async def _server_info(self) -> Any:
        assert self._session is not None
        for path in ("/server_info", "/get_server_info"):
            try:
                timeout = aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S)
                async with self._session.get(f"{self.url}{path}", timeout=timeout) as resp:
                    if resp.status == 200:
                        return msgspec.json.decode(await read_capped(resp, MAX_RESPONSE_BYTES))
            except (aiohttp.ClientError, TimeoutError, OSError, msgspec.DecodeError, EngineError):
                continue
        return None

    # -- weights ------------------------------------------------------------------------------------

    async def update_weights(
        self, version: int, source: WeightSource, *, epoch: int = 0, rank: int = 1
    ) -> None:
        """Load new weights (the broker has drained this engine), from one of:

        - `WeightsFromDisk(path)`: `/update_weights_from_disk` (safetensors files in `path`);
        - `WeightsFromBroadcast(group, buckets)` (SGLang's layout): join the group with ranks from `rank` on
          (once per group), then receive each bucket of the plan while the learner sends it.

        Afterwards the radix cache is flushed and the engine serves `version` (of lineage `epoch`)."""
        started = time.monotonic()
        timings: dict[str, float] = {}
        match source:
            case WeightsFromDisk(path=path):
                body = {"model_path": path, "weight_version": str(version), "flush_cache": False}
                # a load that fails part-way makes SGLang reload the weights it was launched with (or last
                # loaded from disk), not those it served: no version's, as far as guirl can tell
                self.weights_intact = False
                await self._control("/update_weights_from_disk", body, self.request_timeout_s)
                timings["receive"] = time.monotonic() - started
            case WeightsFromBroadcast(group=group, buckets=buckets):
                self._check_plan(group, buckets)
                await self._join(group, rank)
                timings["join"] = time.monotonic() - started
                await self._receive(group, buckets, version)
                timings["receive"] = time.monotonic() - started - timings["join"]
            case _:
                raise NotImplementedError(
                    f"engine {self.name}: unsupported weight source {source!r}: use WeightsFromDisk or "
                    "WeightsFromBroadcast"
                )
        took_weights(self, version, epoch)  # the server holds these weights now, flushed or not
        flushed = time.monotonic()
        self._stale_cache = True  # until a flush succeeds: the radix cache holds KV of the old weights
        await self.flush_cache()
        timings["flush"] = time.monotonic() - flushed
        self.last_update = {k: round(v, 4) for k, v in timings.items()}

    def _check_plan(self, group: WeightGroupSpec, buckets: list[SGLangBucket]) -> None:
        from guirl.weights.broadcast import check_dtypes

        if group.layout != "sglang":
            raise EngineError(
                f"engine {self.name}: weight group layout {group.layout!r}, not 'sglang'", retryable=False
            )
        if not buckets:
            raise EngineError(
                f"engine {self.name}: a broadcast update without a bucket plan", retryable=False
            )
        try:
            check_dtypes(buckets)
        except ValueError as exc:
            raise EngineError(f"engine {self.name}: {exc}", retryable=False) from exc

    async def _join(self, group: WeightGroupSpec, rank: int) -> None:
        """Join `group` with ranks from `rank` on, unless this server is in it already."""
        if self._group == (group, rank):
            return
        await self._leave()
        body = init_group_body(group, rank)
        # a failed join may still have left the name in the server: destroyed before the next group
        self._group = (group, rank)
        try:
            await self._control("/init_weights_update_group", body, group.timeout_s + 30)
        except BaseException:  # failed, or abandoned (its sender died): the name is freed
            await self._leave(CLEANUP_TIMEOUT_S)
            raise

    async def _receive(self, group: WeightGroupSpec, buckets: list[SGLangBucket], version: int) -> None:
        """Each bucket of the plan, one `/update_weights_from_distributed` request each, in a session."""
        try:
            async with self._update_session():
                for bucket in buckets:
                    body = bucket_body(bucket, group.group_name, version, flattened=self.flattened)
                    # each bucket overwrites live weights: until the last lands, they are no version's
                    self.weights_intact = False
                    await self._control("/update_weights_from_distributed", body, group.timeout_s + 30)
        except BaseException:  # failed or abandoned half-way: the group is out of step, a new one later
            if not self.weights_intact:
                log.warning(
                    "engine %s: update to version %d did not land whole: it serves nothing until an "
                    "update does",
                    self.name,
                    version,
                )
            await self._leave(CLEANUP_TIMEOUT_S)
            raise

    @contextlib.asynccontextmanager
    async def _update_session(self) -> AsyncIterator[None]:
        """SGLang's weight-update session around a distributed update, always ended (a session left open
        makes the server refuse the next one). A session still open from an earlier broker (killed mid-update)
        is ended first. A server without the routes is older than the releases guirl supports (0.5.21 added
        them; setup.cfg's `gpu` extra): a clear error, not an update attempted outside a session."""
        status, doc = await self._control("/begin_weight_update", {}, CONTROL_TIMEOUT_S, check=False)
        if status == 404:
            raise EngineError(
                f"engine {self.name}: {self.url} has no /begin_weight_update: an SGLang older than 0.5.21, "
                "which guirl does not support (pip install .[gpu] takes the release it was checked against)",
                retryable=False,
            )
        if status == 400 and "already open" in str(doc.get("message", "")):
            log.warning("engine %s: a weight-update session was left open: ending it", self.name)
            await self._control("/end_weight_update", {}, CONTROL_TIMEOUT_S)
            await self._control("/begin_weight_update", {}, CONTROL_TIMEOUT_S)
        else:
            self._control_result("/begin_weight_update", status, doc)
        try:
            yield
        except BaseException:
            # the update failed or was cancelled: end the session, but briefly (a server still blocked in the
            # broadcast answers nothing) and never in place of why the update ended
            try:
                await self._control("/end_weight_update", {}, CLEANUP_TIMEOUT_S)
            except EngineError as exc:
                log.warning("engine %s: ending the weight-update session: %s", self.name, exc)
            raise
        await self._control("/end_weight_update", {}, CONTROL_TIMEOUT_S)

    async def flush_cache(self, wait_s: float = FLUSH_WAIT_S) -> None:
        """Flush the server's radix cache (KV computed with the weights it served before), waiting server side
        up to `wait_s` for the requests still running (a health probe's) to end: SGLang refuses a flush while
        any runs."""
        status, raw = await self._post(f"/flush_cache?timeout={wait_s:g}", {}, wait_s + 30)
        if status != 200:
            raise EngineError(
                f"engine {self.name}: /flush_cache: {status} {error_message(raw)}", retryable=status >= 500
            )
        self._stale_cache = False

    async def _leave(self, timeout_s: float = CONTROL_TIMEOUT_S) -> None:
        """Destroy the weight group this engine is in (if any): SGLang keeps a group, and refuses its name,
        until it is destroyed."""
        if self._group is None:
            return
        name = self._group[0].group_name
        self._group = None
        try:
            await self._control("/destroy_weights_update_group", {"group_name": name}, timeout_s)
        except EngineError as exc:  # gone with its learner, or never formed
            log.info("engine %s: leaving weight group %r: %s", self.name, name, exc)

    async def _control(self, path: str, body: dict[str, Any], timeout_s: float, *, check: bool = True) -> Any:
        """A control call of a JSON route. `check`: 200 with `success` true, else a non-retryable
        `EngineError` with the server's message (a weight update that failed once fails the same way on
        retry), and the reply is returned; otherwise `(status, reply as a dict)`."""
        status, raw = await self._post(path, body, timeout_s)
        try:
            doc = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            doc = None
        if not check:
            return status, doc if isinstance(doc, dict) else {"message": error_message(raw)}
        return self._control_result(path, status, doc, raw)

    def _control_result(self, path: str, status: int, doc: Any, raw: bytes = b"") -> Any:
        if status != 200:
            message = doc.get("message") if isinstance(doc, dict) else error_message(raw)
            raise EngineError(f"engine {self.name}: {path}: {status} {message}", retryable=status >= 500)
        if doc is None:
            raise EngineError(
                f"engine {self.name}: {path}: reply is not JSON ({raw[:80]!r})", retryable=False
            )
        if not isinstance(doc, dict) or doc.get("success") is not True:
            message = doc.get("message") if isinstance(doc, dict) else doc
            raise EngineError(f"engine {self.name}: {path} failed: {str(message)[:300]}", retryable=False)
        return doc
