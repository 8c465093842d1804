"""The SGLang stand-in: SGLang's own HTTP server process, with guirl's stand-in for the GPU processes behind
it.

What answers a request is SGLang's code wherever it can run on a CPU: its FastAPI app (routes, the `/generate`
JSON contract, request parsing, error replies), its `TokenizerManager` (request normalization, sampling-param
checks, tokenization, Qwen3-VL's multimodal processing from `image_data` and one `<|image_pad|>` per image,
reply building, the weight-update locks), and, behind it, SGLang's scheduler-side weight-update manager and
flush handling. Only the scheduler's model execution and the detokenizer are guirl's
(`guirl.testing.fakes.sglang_scheduler`): the tiny Qwen3-VL on the hf engine, fed SGLang's ids and pixel
values, or a latency model for benchmarks. It therefore refuses what SGLang refuses: expanded pad runs (an
error inside SGLang's processor: 500), a distributed update outside a weight-update session, a weight group
name it still holds, a flush while requests run without `?timeout=`, unknown sampling parameters, image
strings SGLang reads as file paths.

It needs SGLang's wheel and a few light packages (`make setup-test` installs them: see
`guirl.testing.sglang_upstream`); without them it refuses to start and says why. One TP rank only: SGLang's
multi-rank weight groups are tested against SGLang's code directly (tests/contract).

Run it as SGLang is run, with guirl's launch flags parsed by SGLang's own parser (a flag SGLang does not know
fails the start): `python -m guirl.testing.fakes sglang --model-path DIR [--host H] [--port N] [SGLang flags]
[--standin-... options]`; ready when it prints `sglang stand-in serving MODEL at URL`. `FakeSGLangServer`
runs one for a test and switches its faults.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

STANDIN_USAGE = """\
usage: python -m guirl.testing.fakes sglang --model-path DIR [--host H] [--port N] [SGLang launch flags]
           [--standin-backend model|timing] [--standin-max-batch N] [--standin-group-timeout S]
           [--standin-timing JSON] [--standin-keep-requests N]

SGLang's own HTTP server (FastAPI app, TokenizerManager, weight-update manager) in front of a CPU stand-in
for its scheduler. SGLang's launch flags are parsed by SGLang's parser (`python -m sglang.launch_server`'s).
Stand-in options:
  --standin-backend model|timing  model: the checkpoint on the hf engine (default); timing: no model, a
                                  continuous-batching latency model (--standin-timing) for benchmarks
  --standin-max-batch N           most requests the model backend runs in one batch (default 8)
  --standin-group-timeout S       how long joining a weight group waits for the learner (SGLang passes no
                                  timeout: torch's 30 minutes)
  --standin-timing JSON           the latency model's settings (see sglang_timing.TimingModel)
  --standin-keep-requests N       keep the last N /generate bodies for /_standin/state (default: all;
                                  a benchmark keeps none)
  --standin-lifeline 1            stop when stdin ends (FakeSGLangServer holds it: a test that dies takes
                                  its stand-in with it)
"""


def _split_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The stand-in's own `--standin-*` options, and SGLang's flags."""
    own: dict[str, str] = {}
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg.startswith("--standin-"):
            key, eq, value = arg.partition("=")
            own[key] = value if eq else next(it, "")
        else:
            rest.append(arg)
    return own, rest


async def serve(argv: list[str]) -> None:
    """Run the stand-in until SIGTERM/SIGINT (see the module docstring)."""
    import uvicorn

    from guirl.testing.fakes.sglang_scheduler import ModelBackend, Scheduler
    from guirl.testing.sglang_upstream import load_server

    own, flags_argv = _split_args(argv)
    sglang = load_server()
    m = sglang.modules
    flags = sglang.parse_launch_flags(flags_argv)
    if flags.tp_size != 1:
        raise SystemExit("the stand-in serves one TP rank (SGLang's TP ranks are tested in tests/contract)")
    deterministic = bool(flags.enable_deterministic_inference)
    # the CPU's own server args: no deterministic attention backend exists on a CPU; the stand-in honours
    # seeds itself when asked (and reports the flag as the GPU server would)
    cpu_argv = [a for a in flags_argv if a != "--enable-deterministic-inference"] + ["--device", "cpu"]
    server_args = sglang.server_args(cpu_argv)
    sglang.publish(server_args, role="tokenizer")
    if own.get("--standin-group-timeout"):
        import datetime

        import torch.distributed.distributed_c10d as c10d

        c10d.default_pg_timeout = datetime.timedelta(seconds=float(own["--standin-group-timeout"]))
    port_args = m.server_args.PortArgs.init_new(server_args)
    tm = m.tokenizer_manager.TokenizerManager(server_args, port_args)
    tm.max_req_input_len = tm.context_len - 1  # what the server sets from the scheduler's info
    if own.get("--standin-backend", "model") == "timing":
        from guirl.testing.fakes.sglang_timing import TimingBackend

        backend: Any = TimingBackend.from_json(own.get("--standin-timing", "{}"), tm.tokenizer)
    else:
        backend = ModelBackend(server_args.model_path, max_batch=int(own.get("--standin-max-batch", "8")))
    await backend.start()
    scheduler = Scheduler(sglang, port_args, backend, deterministic=deterministic)
    http = m.http_server
    http.set_global_state(
        http._GlobalState(
            tokenizer_manager=tm, template_manager=m.template_manager.TemplateManager(), scheduler_info={}
        )
    )
    tm.server_status = m.tokenizer_manager.ServerStatus.Up
    keep = own.get("--standin-keep-requests")
    faults = _Faults(scheduler, sglang.version, keep_requests=int(keep) if keep else None)
    # /server_info as SGLang builds it, reporting the deterministic flag the stand-in honours (the CPU's own
    # server args cannot carry it: no CPU attention backend is deterministic in SGLang's sense)
    faults.server_info = {
        **sglang.server_info(server_args),
        "enable_deterministic_inference": deterministic,
        "version": sglang.version,
    }
    app = faults.install(http.app)

    sock = socket.socket(socket.AF_INET6 if ":" in flags.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((flags.host, flags.port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    # SGLang's own SIGTERM handling (the tokenizer manager's: drain, then stop) ends by stopping this server
    tm.set_server_stop_hook(lambda: setattr(server, "should_exit", True))
    tasks = [asyncio.create_task(scheduler.run()), asyncio.create_task(server.serve(sockets=[sock]))]

    def scheduler_ended(task: asyncio.Task) -> None:  # a dead scheduler would leave every request hanging
        if not task.cancelled():
            log.error("the scheduler stand-in stopped: %r: stopping the server", task.exception())
            server.should_exit = True

    tasks[0].add_done_callback(scheduler_ended)
    if "--standin-lifeline" in own:  # stdin is the test's lifeline: its end (the test gone) stops the server
        threading.Thread(target=_wait_for_eof, args=(loop, server), name="lifeline", daemon=True).start()
    while not server.started and not tasks[1].done():
        await asyncio.sleep(0.01)  # uvicorn has no started event; polled until it listens
    try:
        if not server.started:
            raise RuntimeError("uvicorn stopped before it listened")
        host = f"[{flags.host}]" if ":" in flags.host else flags.host
        print(
            f"sglang stand-in serving {server_args.model_path} at http://{host}:{port} "
            f"(SGLang {sglang.version})",
            flush=True,
        )
        await tasks[1]
        if tasks[0].done() and not tasks[0].cancelled():
            raise RuntimeError("the scheduler stand-in stopped") from tasks[0].exception()
    finally:
        tasks[0].cancel()
        scheduler.close()
        await backend.close()
        for name in vars(port_args).values():  # PortArgs made its IPC endpoints as files
            if isinstance(name, str) and name.startswith("ipc://"):
                with contextlib.suppress(OSError):
                    os.unlink(name.removeprefix("ipc://"))


class _Faults:
    """The stand-in's switches and records, on routes of its own (`/_standin/...`) and a middleware in front
    of SGLang's routes: `healthy` (False: `/health*` answer 503), `generate_status` (answer `/generate` with
    this status and SGLang's error body), `generate_raw` (answer with these bytes), `hang` (the scheduler
    takes generation requests and holds them unanswered until `hang` is switched off again). Records: the
    `/generate` bodies (the last `keep_requests`; None: all), and per `/generate` answered its `served` entry:
    rid, sampling seed and the seconds from its arrival to its reply's end (the server's own latency)."""

    def __init__(self, scheduler: Any, version: str, keep_requests: int | None = None) -> None:
        self.scheduler = scheduler
        self.version = version
        self.keep_requests = keep_requests
        self.healthy = True
        self.generate_status: int | None = None
        self.generate_raw: bytes | None = None
        self.requests: list[Any] = []
        self.served: collections.deque[dict[str, Any]] = collections.deque(maxlen=100_000)
        self.server_info: dict[str, Any] = {}

    def install(self, app: Any) -> Any:
        """Add the stand-in's routes to SGLang's `app`; the ASGI app to serve (`app` behind the switches)."""
        from starlette.responses import JSONResponse

        async def state(request: Any) -> Any:
            s = self.scheduler
            return JSONResponse(
                {
                    "sglang": self.version,
                    "requests": self.requests,
                    "flushes": s.flushes,
                    "weight_version": s.weight_version,
                    "groups_joined": s.groups_joined,
                    "inflight": len(s.inflight),
                    "flush_pending": s.flush_gate._pending is not None,
                    # the vision-embedding cache size SGLang's scheduler would take from this environment
                    "vlm_cache_mb": _vlm_cache_mb(),
                    "served": list(self.served),
                    "backend": s.backend.stats() if hasattr(s.backend, "stats") else {},
                }
            )

        async def set_faults(request: Any) -> Any:
            body = await request.json()
            if "healthy" in body:
                self.healthy = bool(body["healthy"])
            if "generate_status" in body:
                self.generate_status = body["generate_status"]
            if "generate_raw" in body:
                raw = body["generate_raw"]
                self.generate_raw = None if raw is None else base64.b64decode(raw)
            if "hang" in body:
                release = self.scheduler.released
                release.clear() if body["hang"] else release.set()
            return JSONResponse({"ok": True})

        # plain Starlette routes (no FastAPI signature parsing)
        app.add_route("/_standin/state", state, methods=["GET"])
        app.add_route("/_standin/faults", set_faults, methods=["POST"])
        return _Switched(app, self)


class _Switched:
    """SGLang's ASGI app behind the stand-in's switches (a plain ASGI wrapper: the body it reads is replayed
    to SGLang's app unchanged)."""

    def __init__(self, app: Any, faults: _Faults) -> None:
        self.app, self.faults = app, faults

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        f = self.faults
        if path in ("/health", "/health_generate") and not f.healthy:
            return await _reply(send, 503, b"")
        if path in ("/server_info", "/get_server_info"):
            return await _reply(send, 200, json.dumps(f.server_info, default=str).encode())
        if path != "/generate":
            return await self.app(scope, receive, send)
        arrived = time.monotonic()
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if f.keep_requests is None or f.keep_requests > 0:
            f.requests.append(doc)
            if f.keep_requests is not None:
                del f.requests[: -f.keep_requests]
        if f.generate_status is not None:
            error = json.dumps({"error": {"message": "injected failure"}}).encode()
            return await _reply(send, f.generate_status, error)
        if f.generate_raw is not None:
            return await _reply(send, 200, f.generate_raw)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        one = doc if isinstance(doc, dict) else {}
        sampling = one.get("sampling_params")

        async def recorded(message: dict) -> None:
            # recorded before the reply's last bytes leave: a client holding its answer finds it recorded
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                f.served.append(
                    {
                        "rid": one.get("rid"),
                        "seed": sampling.get("sampling_seed") if isinstance(sampling, dict) else None,
                        "latency_s": round(time.monotonic() - arrived, 6),
                    }
                )
            await send(message)

        await self.app(scope, replay, recorded)


def _wait_for_eof(loop: asyncio.AbstractEventLoop, server: Any) -> None:
    while sys.stdin.buffer.read(4096):
        pass
    loop.call_soon_threadsafe(setattr, server, "should_exit", True)


def _vlm_cache_mb() -> int:
    from sglang.srt.environ import envs

    return int(envs.SGLANG_VLM_CACHE_SIZE_MB.get())


async def _reply(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class FakeSGLangServer:
    """A stand-in process for a test, usable from any event loop (or none): `with FakeSGLangServer(path) as
    server:` or `async with ...`; `server.url`. Faults: `server.set_faults(healthy=False | generate_status=503
    | generate_raw=b"..." | hang=True)`; records: `server.get_state()` (`requests`: the `/generate` bodies,
    `flushes`, `weight_version`, `served`: per answered request its rid, seed and server-side seconds,
    `backend`: the timing backend's stats, ...); `await server.faults(...)` / `await server.state()` off
    the loop."""

    def __init__(
        self,
        model_path: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        args: list[str] | tuple[str, ...] = (),
        start_timeout_s: float = 300.0,
    ) -> None:
        self.model_path, self.host, self.port = model_path, host, port
        self.args = list(args)
        self.start_timeout_s = start_timeout_s
        self.url = ""
        self.output: list[str] = []
        self._proc: subprocess.Popen | None = None
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start_sync(self) -> FakeSGLangServer:
        """Start the process and wait until it serves (or fail with what it printed)."""
        argv = [sys.executable, "-m", "guirl.testing.fakes", "sglang", "--model-path", self.model_path]
        argv += ["--host", self.host, "--port", str(self.port), "--standin-lifeline", "1", *self.args]
        # stdin a pipe this process holds: if it dies (a test killed at its timeout), the stand-in sees the
        # pipe end and stops, rather than outlive it (a parent-death signal would follow the starting thread)
        self._proc = subprocess.Popen(  # noqa: S603 - our own module
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.PIPE
        )
        self._reader = threading.Thread(target=self._read, name="standin-output", daemon=True)
        self._reader.start()
        if not self._ready.wait(self.start_timeout_s) or not self.url:
            self.stop()
            tail = "\n".join(self.output[-30:])
            raise RuntimeError(
                f"the SGLang stand-in did not start (exit code {self._proc.returncode}):\n{tail}"
            )
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            self.output = [*self.output[-199:], line]
            if not self._ready.is_set() and line.startswith("sglang stand-in serving ") and " at " in line:
                self.url = line.split(" at ", 1)[1].split()[0]
                self._ready.set()
        self._ready.set()  # exited: whoever waits learns it now

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}{path}", data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - the stand-in on loopback
            return json.loads(resp.read())

    def set_faults(self, **switches: Any) -> None:
        if switches.get("generate_raw") is not None:
            switches["generate_raw"] = base64.b64encode(switches["generate_raw"]).decode()
        self._call("/_standin/faults", switches)

    def get_state(self) -> dict[str, Any]:
        return self._call("/_standin/state")

    async def faults(self, **switches: Any) -> None:
        await asyncio.to_thread(self.set_faults, **switches)

    async def state(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.get_state)

    def stop(self) -> None:
        """SIGINT, which stops it at once (SIGTERM is SGLang's graceful exit, polling every 5 s); SIGKILL
        after 30 s; idempotent."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        if self._reader is not None:
            self._reader.join(5)

    async def start(self) -> FakeSGLangServer:
        return await asyncio.to_thread(self.start_sync)

    async def close(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> FakeSGLangServer:
        return self.start_sync()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeSGLangServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _sglang_main(argv: list[str]) -> int:
    """`python -m guirl.testing.fakes sglang ...` (see the module docstring)."""
    if not argv or "-h" in argv or "--help" in argv:
        print(STANDIN_USAGE, end="")
        return 0 if argv else 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _, flags = _split_args(argv)
    path = flags[flags.index("--model-path") + 1] if "--model-path" in flags[:-1] else ""
    if not os.path.isdir(path):  # said before SGLang's import (seconds); the stand-in serves local models
        print(f"the SGLang stand-in cannot start: --model-path {path!r} is not a directory", file=sys.stderr)
        return 2
    from guirl.testing.sglang_upstream import Unavailable

    try:
        import uvloop

        uvloop.run(serve(argv))
    except Unavailable as exc:
        print(f"the SGLang stand-in cannot start: {exc}", file=sys.stderr)
        return 3
    return 0
