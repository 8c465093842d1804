"""`FakeSGLangServer`: SGLang's native HTTP API on loopback, backed by the hf engine (see the package
docstring)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

import msgspec
from aiohttp import web

from guirl.testing.fakes._common import _DATA_URL, _BadRequest, _serve

# --- SGLang's native API ---------------------------------------------------------------------------------

_SGLANG_SAMPLING = {
    "max_new_tokens": int,
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": int,
    "min_p": (int, float),
    "stop": (str, list),
    "ignore_eos": bool,
    "skip_special_tokens": bool,
    "no_stop_trim": bool,
    "sampling_seed": int,
    "min_new_tokens": int,
    "n": int,
}
_SGLANG_GENERATE = {
    "rid",
    "text",
    "input_ids",
    "image_data",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "stream",
}


def _sg_error(message: str, status: int = 400) -> web.Response:
    """SGLang's error body for /generate (`_create_error_response`)."""
    return web.json_response({"error": {"message": message}}, status=status)


def _sg_result(success: bool, message: str) -> web.Response:
    """SGLang's `{success, message}` reply of its weight routes (400 when not successful)."""
    return web.json_response({"success": success, "message": message}, status=200 if success else 400)


class FakeSGLangServer:
    """SGLang's HTTP server on `host:port` (0: a free port), backed by an `HFEngine` of `model_path`.

    Requests are validated as SGLang validates them (unknown fields and sampling parameters refused with
    400 and SGLang's error body); concurrent `/generate` requests are batched into one engine call, as a
    continuous batcher would. `input_ids` may hold each vision block's `<|image_pad|>` once or already
    expanded: the server expands it by the image's grid, as SGLang does. Weight routes answer SGLang's
    `{success, message}`; a bucket is loaded as it arrives (SGLang loads each request's tensors at once).

    Fault switches, settable at any time: `healthy` (False: `/health_generate` answers 503),
    `generate_status` (answer /generate with this status and an error body), `generate_raw` (answer with
    these bytes and status 200), `hang` (never answer /generate until closed). `requests` records every
    /generate body; `weight_version` is the version string of the weights served.
    """

    def __init__(
        self, model_path: str, *, host: str = "127.0.0.1", port: int = 0, tp_size: int = 1, max_batch: int = 8
    ) -> None:
        self.model_path = model_path
        self.host, self.port, self.tp_size, self.max_batch = host, port, tp_size, max_batch
        self.healthy = True
        self.generate_status: int | None = None
        self.generate_raw: bytes | None = None
        self.hang = False
        self.paused = False
        self.requests: list[dict[str, Any]] = []
        self.weight_version = "default"
        self.flushes = 0
        self.group_timeout_s = 120.0  # SGLang's request carries none (it waits torch's default 30 min)
        self.engine: Any = None
        self._receiver: Any = None
        self._group_name = ""
        self._queue: asyncio.Queue | None = None
        self._batcher: asyncio.Task | None = None
        self._resumed = asyncio.Event()
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> FakeSGLangServer:
        """Load the model, then listen."""
        from guirl.inference.hf import HFEngine

        self.engine = HFEngine("sglang-standin", self.model_path, max_batch=self.max_batch)
        await self.engine.start()
        self._queue = asyncio.Queue()
        self._resumed.set()
        self._batcher = asyncio.create_task(self._batch_loop())
        app = web.Application(client_max_size=256 * 2**20)
        for path in ("/health", "/health_generate"):
            app.router.add_get(path, self._health)
        for path in ("/server_info", "/get_server_info"):
            app.router.add_get(path, self._server_info)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/init_weights_update_group", self._init_group)
        app.router.add_post("/destroy_weights_update_group", self._destroy_group)
        app.router.add_post("/update_weights_from_distributed", self._update_distributed)
        app.router.add_post("/update_weights_from_disk", self._update_disk)
        app.router.add_route("*", "/flush_cache", self._flush)
        app.router.add_post("/pause_generation", self._pause)
        app.router.add_post("/continue_generation", self._continue)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self.port = await _serve(self._runner, self.host, self.port)
        return self

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._batcher is not None:
            self._batcher.cancel()
        if self._receiver is not None:
            await asyncio.to_thread(self._receiver.close)
            self._receiver = None
        if self.engine is not None:
            await self.engine.close()

    async def __aenter__(self) -> FakeSGLangServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- routes ---------------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy and self.engine is not None else 503)

    async def _server_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"model_path": self.model_path, "tp_size": self.tp_size, "weight_version": self.weight_version}
        )

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_path, "is_generation": True})

    async def _body(self, request: web.Request) -> Any:
        try:
            return msgspec.json.decode(await request.read())
        except (msgspec.DecodeError, RecursionError) as exc:
            raise _BadRequest(f"the body is not JSON: {exc}") from None

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        from guirl.inference.base import GenRequest
        from guirl.messages.types import SamplingParams

        try:
            body = await self._body(request)
            images, sampling, ids = self._parse_generate(body)
        except _BadRequest as exc:
            return _sg_error(str(exc))
        self.requests.append(body)
        if self.hang:
            await self._closing.wait()
            return web.Response(status=503)
        if self.generate_status is not None:
            return _sg_error("injected failure", self.generate_status)
        if self.generate_raw is not None:
            return web.Response(body=self.generate_raw, content_type="application/json")
        await self._resumed.wait()
        try:
            ids = self._expand(ids, images)
        except ValueError as exc:
            return _sg_error(str(exc))
        s = sampling
        greedy = float(s.get("temperature", 1.0)) <= 0
        req = GenRequest(
            prompt_ids=ids,
            images=images,
            sampling=SamplingParams(
                temperature=0.0 if greedy else float(s.get("temperature", 1.0)),
                top_p=float(s.get("top_p", 1.0)),
                top_k=max(0, int(s.get("top_k", -1))),
                max_new_tokens=int(s.get("max_new_tokens", 128)),
                stop=[s["stop"]] if isinstance(s.get("stop"), str) else list(s.get("stop") or []),
                ignore_eos=bool(s.get("ignore_eos", False)),
                seed=s.get("sampling_seed"),
            ),
        )
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        assert self._queue is not None
        await self._queue.put((req, done))
        result = await done
        if result.finish_reason == "abort":
            return _sg_error(result.error or "aborted")
        return web.json_response(self._reply(body, req, result))

    def _parse_generate(self, body: Any) -> tuple[list[bytes], dict[str, Any], list[int]]:
        if not isinstance(body, dict):
            raise _BadRequest("the body must be a JSON object")
        unknown = sorted(set(body) - _SGLANG_GENERATE)
        if unknown:
            raise _BadRequest(f"unexpected fields {unknown}")
        ids = body.get("input_ids")
        if body.get("text") is not None:
            raise _BadRequest("this stand-in serves input_ids only (guirl sends token ids)")
        if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
            raise _BadRequest("input_ids must be a non-empty list of token ids")
        if body.get("stream"):
            raise _BadRequest("streaming is not served by this stand-in")
        sampling = body.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            raise _BadRequest("sampling_params must be an object")
        for key, value in sampling.items():
            kind = _SGLANG_SAMPLING.get(key)
            if kind is None:
                raise _BadRequest(f"SamplingParams.__init__() got an unexpected keyword argument {key!r}")
            if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
                raise _BadRequest(f"sampling_params.{key}: {value!r} has the wrong type")
        if sampling.get("n", 1) != 1:
            raise _BadRequest("n > 1 is not served by this stand-in")
        raw_images = body.get("image_data") or []
        if isinstance(raw_images, str):
            raw_images = [raw_images]
        if not isinstance(raw_images, list) or not all(isinstance(x, str) for x in raw_images):
            raise _BadRequest("image_data must be a base64 string or a list of them")
        images = []
        for i, item in enumerate(raw_images):
            m = _DATA_URL.fullmatch(item)
            data = m.group(2) if m else item
            try:
                images.append(base64.b64decode(data, validate=True))
            except (binascii.Error, ValueError):
                raise _BadRequest(f"image_data[{i}] is not base64") from None
        return images, sampling, ids

    def _expand(self, ids: list[int], images: list[bytes]) -> list[int]:
        """Each run of `<|image_pad|>` (one token or many) as many as its image's grid needs."""
        renderer = self.engine.renderer
        pad = renderer.image_token_id
        out: list[int] = []
        k = 0
        i = 0
        while i < len(ids):
            if ids[i] != pad:
                out.append(ids[i])
                i += 1
                continue
            while i < len(ids) and ids[i] == pad:
                i += 1
            if k >= len(images):
                raise ValueError(f"input_ids hold more image slots than the {len(images)} images given")
            out.extend([pad] * renderer.image_tokens(images[k]))
            k += 1
        if k != len(images):
            raise ValueError(f"input_ids hold {k} image slots for {len(images)} images")
        return out

    def _reply(self, body: dict[str, Any], req: Any, result: Any) -> dict[str, Any]:
        ids = list(result.response_ids or [])
        if result.finish_reason == "stop":
            eos = ids[-1] if ids and ids[-1] in self.engine._eos else None
            finish: dict[str, Any] = {
                "type": "stop",
                "matched": eos if eos is not None else next((s for s in req.sampling.stop if s), ""),
            }
        else:
            finish = {"type": "length", "length": len(ids)}
        meta: dict[str, Any] = {
            "id": body.get("rid") or f"standin-{len(self.requests)}",
            "finish_reason": finish,
            "prompt_tokens": len(req.prompt_ids or []),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(result.logprobs or [], ids)]
        return {"text": result.text, "output_ids": ids, "meta_info": meta}

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                results = await self.engine.generate([req for req, _ in batch])
            except Exception as exc:  # the engine failed: every waiting request learns it
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (_, done), result in zip(batch, results):
                if not done.done():
                    done.set_result(result)

    async def _init_group(self, request: web.Request) -> web.Response:
        from guirl.learner.weights import WeightGroupSpec, WeightReceiver, WeightSyncError

        try:
            body = await self._body(request)
            spec = WeightGroupSpec(
                host=body["master_address"],
                port=int(body["master_port"]),
                world_size=int(body["world_size"]),
                group_name=body.get("group_name", "weight_update_group"),
                backend="gloo" if body.get("backend", "nccl") == "gloo" else "nccl",
                layout="sglang",
                timeout_s=self.group_timeout_s,
            )
            rank = int(body["rank_offset"])
        except (_BadRequest, KeyError, TypeError, ValueError) as exc:
            return _sg_result(False, f"Failed to initialize custom process group: {exc}.")
        receiver = WeightReceiver()
        try:
            await asyncio.to_thread(receiver.open, spec, rank)
        except (WeightSyncError, ValueError, RuntimeError) as exc:
            return _sg_result(False, f"Failed to initialize custom process group: {exc}.")
        if self._receiver is not None:
            await asyncio.to_thread(self._receiver.close)
        self._receiver, self._group_name = receiver, spec.group_name
        return _sg_result(True, "Succeeded to initialize custom process group.")

    async def _destroy_group(self, request: web.Request) -> web.Response:
        if self._receiver is not None:
            await asyncio.to_thread(self._receiver.close)
            self._receiver = None
        return _sg_result(True, "Succeeded to destroy custom process group.")

    async def _update_distributed(self, request: web.Request) -> web.Response:
        from guirl.learner.weights import SGLangBucket, WeightSyncError

        try:
            body = await self._body(request)
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            bucket = SGLangBucket.from_dict({k: body.get(k) for k in ("names", "dtypes", "shapes")})
            if body.get("group_name", "weight_update_group") != self._group_name or self._receiver is None:
                raise ValueError(f"Group {body.get('group_name')!r} not in the groups joined")
        except (_BadRequest, ValueError) as exc:
            return _sg_result(False, str(exc))
        flattened = body.get("load_format") == "flattened_bucket"
        try:
            named = await asyncio.to_thread(self._receiver.receive_sglang_bucket, bucket, flattened=flattened)
            await self.engine.load_tensors(named)
        except (WeightSyncError, ValueError, RuntimeError) as exc:
            return _sg_result(False, f"Failed to update parameter online: {exc}.")
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return _sg_result(True, "Succeeded to update parameter online.")

    async def _update_disk(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            path = body["model_path"]
            await self.engine.update_weights(self.engine.policy_version, {"path": path})
        except (_BadRequest, KeyError, TypeError, ValueError, RuntimeError, OSError) as exc:
            return web.json_response(
                {"success": False, "message": str(exc), "num_paused_requests": 0}, status=400
            )
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return web.json_response(
            {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        )

    async def _flush(self, request: web.Request) -> web.Response:
        self.flushes += 1
        return web.Response(text="Cache flushed.\n")

    async def _pause(self, request: web.Request) -> web.Response:
        self.paused = True
        self._resumed.clear()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, request: web.Request) -> web.Response:
        self.paused = False
        self._resumed.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


def _sglang_main(argv: list[str]) -> int:
    """`python -m guirl.testing.fakes sglang` with SGLang's `launch_server` flags (those guirl passes)."""
    import argparse
    import signal

    p = argparse.ArgumentParser(prog="guirl.testing.fakes sglang")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tp", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=0.8)
    p.add_argument("--context-length", type=int, default=0)
    p.add_argument("--random-seed", type=int, default=0)
    args = p.parse_args(argv)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server = FakeSGLangServer(args.model_path, host=args.host, port=args.port, tp_size=args.tp_size)
        await server.start()
        print(f"sglang stand-in serving {args.model_path} at {server.url}", flush=True)
        await stop.wait()
        await server.close()

    asyncio.run(serve())
    return 0
