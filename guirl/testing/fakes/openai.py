"""`FakeOpenAIServer`: an OpenAI-compatible chat completions endpoint on loopback (see the package
docstring)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import inspect
import itertools
import time
from typing import Any

import msgspec
from aiohttp import web

from guirl.testing.fakes._common import (
    _DATA_URL,
    _IMAGE_MAGIC,
    _ROLES,
    ReceivedRequest,
    Reply,
    Responder,
    _BadRequest,
    _error,
    _serve,
)

# --- OpenAI chat completions ---------------------------------------------------------------------------


class FakeOpenAIServer:
    """An OpenAI-compatible endpoint on 127.0.0.1 (a free port); `base_url` is `http://127.0.0.1:PORT/v1`.

    `responder(request_json)` answers each valid completion request (it may be async): a `str` is the
    content; a dict may set `content` (a string or a list of parts), `finish_reason`, `status` with
    `error` (answer that HTTP status with an OpenAI error body), or `raw` (send this JSON as the whole
    body, e.g. one missing fields). Fault switches, settable at any time: `fail_next(n, status)`,
    `delay_s` (answer late), `hang` (never answer until closed), `garbage` (a 200 whose body is not
    JSON), `endless` (a 200 whose body never ends), `unhealthy` (`/v1/models` answers 503: health checks
    fail). With `api_key`, requests without that bearer token
    get a 401. Every completion request is recorded in `requests`; `max_inflight` is the most served
    at once.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        api_key: str = "",
        model: str = "fake-model",
        max_request_bytes: int = 64 * 2**20,
    ) -> None:
        self.responder: Responder = responder or (lambda _request: "ok")
        self.api_key = api_key
        self.model = model
        self.max_request_bytes = max_request_bytes
        self.delay_s = 0.0
        self.hang = False
        self.garbage = False
        self.endless = False
        self.unhealthy = False
        self.requests: list[ReceivedRequest] = []
        self.max_inflight = 0
        self.port = 0
        self._inflight = 0
        self._fail: list[int] = []  # statuses of the next failures, in order
        self._ids = itertools.count(1)
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        """The endpoint's base URL, as an OpenAI client is given it."""
        return f"http://127.0.0.1:{self.port}/v1"

    def fail_next(self, n: int = 1, status: int = 500) -> None:
        """Answer the next `n` completion requests with `status` and an OpenAI error body."""
        self._fail.extend([status] * n)

    async def start(self) -> FakeOpenAIServer:
        """Listen on a free loopback port."""
        app = web.Application(client_max_size=self.max_request_bytes)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._completions)
        self._closing = asyncio.Event()
        # a short grace on close: hanging requests are released first, so nothing should need it
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self.port = await _serve(self._runner)
        return self

    async def close(self) -> None:
        """Stop listening; hanging and delayed requests are released first (the port stays recorded)."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAIServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- handlers -------------------------------------------------------------------------------------

    def _unauthorized(self, request: web.Request) -> web.Response | None:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "Incorrect API key provided.", code="invalid_api_key")
        return None

    async def _stall(self) -> web.Response | None:
        """Apply `hang` / `delay_s`; a 503 when the server closes meanwhile."""
        if self.hang:
            await self._closing.wait()
        elif self.delay_s > 0:
            try:
                await asyncio.wait_for(self._closing.wait(), self.delay_s)
            except TimeoutError:
                return None
        return _error(503, "The server is shutting down.") if self._closing.is_set() else None

    async def _models(self, request: web.Request) -> web.Response:
        if (refused := self._unauthorized(request)) or (refused := await self._stall()):
            return refused
        if self.unhealthy:
            return web.json_response(
                {"error": {"message": "unavailable", "type": "server_error"}}, status=503
            )
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "guirl-fake"}
        return web.json_response({"object": "list", "data": [model]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self._inflight += 1
        self.max_inflight = max(self.max_inflight, self._inflight)
        try:
            return await self._complete(request)
        finally:
            self._inflight -= 1

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        if refused := self._unauthorized(request):
            return refused
        raw = await request.read()
        try:
            body = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nesting too deep
            body = None
        received = ReceivedRequest(headers=dict(request.headers), body=body)
        self.requests.append(received)
        if refused := await self._stall():
            return refused
        if self._fail:
            return _error(self._fail.pop(0), "The server had an error while processing your request.")
        if self.garbage:
            return web.Response(status=200, body=b"<html>502 Bad Gateway</html>", content_type="text/html")
        if self.endless:
            return await self._endless(request)
        try:
            _validate(body, received)
        except _BadRequest as exc:
            return _error(400, str(exc), param=exc.param)
        reply = self.responder(body)
        if inspect.isawaitable(reply):
            reply = await reply
        return self._answer(body, reply)

    async def _endless(self, request: web.Request) -> web.StreamResponse:
        """A 200 whose JSON body never ends (whitespace forever), until the client hangs up."""
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        try:
            await resp.write(b'{"choices": [')
            # 1 GiB at most: a client without a cap then fails on the unfinished JSON, not by hanging
            for _ in range(1024):
                if self._closing.is_set():
                    break
                await resp.write(b" " * 2**20)
        except ConnectionError:
            pass  # the client hung up: what a capped client does
        return resp

    def _answer(self, body: dict[str, Any], reply: Reply) -> web.Response:
        if isinstance(reply, str):
            reply = {"content": reply}
        if "status" in reply:
            return _error(int(reply["status"]), str(reply.get("error", "injected fault")))
        if "raw" in reply:
            return web.Response(body=msgspec.json.encode(reply["raw"]), content_type="application/json")
        content = reply.get("content", "")
        prompt_tokens = sum(_words(m.get("content")) for m in body["messages"])
        completion_tokens = _words(content)
        completion = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": None,
                    "finish_reason": reply.get("finish_reason", "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return web.Response(body=msgspec.json.encode(completion), content_type="application/json")


def _words(content: Any) -> int:
    """A rough token count (words; an image counts 256), as `usage` needs some number."""
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(
            _words(p.get("text")) if p.get("type") == "text" else 256 for p in content if isinstance(p, dict)
        )
    return 0


def _validate(body: Any, received: ReceivedRequest) -> None:
    """Refuse what a real endpoint refuses; decode the images into `received` on the way."""
    if not isinstance(body, dict):
        raise _BadRequest("We could not parse the JSON body of your request (it must be a JSON object).")
    if not isinstance(body.get("model"), str):
        raise _BadRequest("You must provide a model parameter.", "model")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _BadRequest("'messages' is a required property", "messages")
    if not messages:
        raise _BadRequest(
            "Invalid 'messages': empty array. Expected an array with minimum length 1.", "messages"
        )
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _BadRequest(f"Invalid type for '{where}': expected an object.", where)
        if msg.get("role") not in _ROLES:
            allowed = ", ".join(f"'{r}'" for r in _ROLES)
            raise _BadRequest(
                f"Invalid value: {msg.get('role')!r}. Supported values are: {allowed}.", f"{where}.role"
            )
        content = msg.get("content")
        if (content is None and msg["role"] == "assistant") or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _BadRequest(f"Invalid type for '{where}.content': expected a string or an array.", where)
        for j, part in enumerate(content):
            _validate_part(part, f"{where}.content[{j}]", received)
    _check_number(body, "temperature", 0.0, 2.0)
    _check_number(body, "top_p", 0.0, 1.0)
    tokens = body.get("max_tokens")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1):
        raise _BadRequest(
            f"Invalid 'max_tokens': {tokens!r}. Expected an integer of at least 1.", "max_tokens"
        )
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise _BadRequest("Invalid 'stop': expected a string or an array of strings.", "stop")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise _BadRequest("Invalid 'seed': expected an integer.", "seed")


def _validate_part(part: Any, where: str, received: ReceivedRequest) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise _BadRequest(f"Missing required parameter: '{where}.text'.", f"{where}.text")
        return
    if kind != "image_url":
        raise _BadRequest(f"Invalid value: {kind!r}. Supported values are: 'text' and 'image_url'.", where)
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else None
    if not isinstance(url, str):
        raise _BadRequest(f"Missing required parameter: '{where}.image_url.url'.", f"{where}.image_url.url")
    match = _DATA_URL.fullmatch(url)
    if match is None:  # a real server would fetch a URL; this one reaches no network
        raise _BadRequest(
            f"Invalid image URL in '{where}': only base64 data URLs are accepted here.", f"{where}.image_url"
        )
    try:
        data = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError):
        raise _BadRequest(f"Invalid base64 image in '{where}'.", f"{where}.image_url") from None
    if not (data.startswith(_IMAGE_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")):
        raise _BadRequest(
            "You uploaded an unsupported image. Please make sure your image is valid.", f"{where}.image_url"
        )
    received.images.append(data)
    received.image_mimes.append(match.group(1))


def _check_number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _BadRequest(f"Invalid '{name}': {value!r}. Expected a number in [{low:g}, {high:g}].", name)
