"""`OpenAIEngine`: an OpenAI-compatible chat completions endpoint behind the broker (evaluation only).

Such an endpoint (OpenAI, vLLM, SGLang's `/v1`) takes chat messages and answers text: it returns no
token ids and no behaviour log-probs, so `supports_tokens` is False and results carry `None` token
fields. Requests given as `prompt_ids` are refused, and so are prompts whose system turn carries tools for
the chat template (`agent.prompt_style = "gui-rl"`): such a server rebuilds `tools=` from its own schema
model (dropping keys, reordering them) before its template writes them, so GUI-RL's bytes cannot be had.

Errors, for the broker to route by: the endpoint unreachable or dropping the connection is `EngineDead`;
a timeout, a 5xx, a 408/429, or a reply that is not a chat completion is a retryable `EngineError`
(another engine may answer); any other 4xx is the request's fault and is not retryable. Every call has
a timeout and every body read is capped, so a hostile or broken server cannot hang or flood the client.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import aiohttp
import msgspec

from guirl.inference.base import (
    EngineDead,
    EngineError,
    FinishReason,
    GenRequest,
    GenResult,
    gather_requests,
    stamp,
)
from guirl.messages.types import ImagePart, TextPart
from guirl.messages.weights import WeightSource

MAX_RESPONSE_BYTES = 16 * 2**20
"""Largest reply body read from the endpoint (a completion of `max_tokens` is far smaller)."""
HEALTH_TIMEOUT_S = 5.0
"""Most seconds a health probe waits (capped by the engine's own timeout)."""
_ERROR_CHARS = 300
_RETRYABLE_4XX = (408, 429)  # request timeout and rate limit: the same request may succeed later

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "content_filter": "abort"}


class OpenAIEngine:
    """An OpenAI-compatible `/chat/completions` endpoint at `base_url` (…/v1), serving `model`."""

    supports_tokens = False
    max_inflight = property(lambda self: self.max_concurrency)  # batches continuously (Engine.max_inflight)

    def __init__(
        self,
        name: str,
        *,
        base_url: str,
        model: str,
        api_key: str = "",
        timeout_s: float = 300.0,
        max_concurrency: int = 16,
        max_batch: int = 16,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.max_batch = max_batch
        self.policy_version = -1  # the endpoint serves its own weights, never the learner's
        self._api_key = api_key
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None

    def __repr__(self) -> str:  # never show the API key
        return f"OpenAIEngine({self.name!r}, base_url={self.base_url!r}, model={self.model!r})"

    async def start(self) -> None:
        """Open the HTTP session (the endpoint is probed by `health`, not here: it may still be loading)."""
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            # room beside `max_concurrency` completions for the health probe: the broker keeps that many in
            # flight, and a probe queued behind them for a connection would time out and take the engine out
            self._session = aiohttp.ClientSession(
                # idle connections reused for less than uvicorn's 5 s keep-alive (vLLM's, SGLang's servers): a
                # request written into one the server is closing fails as if the server were gone
                connector=aiohttp.TCPConnector(limit=self.max_concurrency + 2, keepalive_timeout=4.0),
                headers=headers,
            )
            self._slots = asyncio.Semaphore(self.max_concurrency)

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def update_weights(
        self, version: int, source: WeightSource, *, epoch: int = 0, rank: int = 1
    ) -> None:
        """Refused: the endpoint's weights are not ours to change."""
        raise EngineError("an OpenAI-compatible endpoint serves its own weights", retryable=False)

    async def health(self) -> bool:
        """True when `GET {base_url}/models` answers 200 within a few seconds."""
        if self._session is None:
            return False
        timeout = aiohttp.ClientTimeout(total=min(HEALTH_TIMEOUT_S, self.timeout_s))
        try:
            # the body is not read: releasing the response unread just drops that connection
            async with self._session.get(f"{self.base_url}/models", timeout=timeout) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def generate(self, batch: list[GenRequest]) -> list[GenResult]:
        """Send every request at once (at most `max_concurrency` in flight); results in batch order."""
        for req in batch:
            if req.prompt_ids is not None:
                raise EngineError(
                    "the openai backend takes chat messages, not token ids: eval only", retryable=False
                )
            if any(m.tools for m in req.messages):
                raise EngineError(
                    "the openai backend cannot render tools into the system turn as the checkpoint's own "
                    'template does (agent.prompt_style = "gui-rl"): use the hf or sglang backend',
                    retryable=False,
                )
        bodies = [self._body(req) for req in batch]  # a malformed request fails before anything is sent
        started = time.monotonic()
        return stamp(await gather_requests(self._complete(body) for body in bodies), self, started)

    # -- one request ----------------------------------------------------------------------------------

    def _body(self, req: GenRequest) -> dict[str, Any]:
        messages = []
        for msg in req.messages:
            parts: list[dict[str, Any]] = []
            for part in msg.parts:
                match part:
                    case TextPart(text=text):
                        parts.append({"type": "text", "text": text})
                    case ImagePart(index=index):
                        if not 0 <= index < len(req.images):
                            raise EngineError(
                                f"request {req.request_id!r}: image {index} of {len(req.images)}",
                                retryable=False,
                            )
                        parts.append({"type": "image_url", "image_url": {"url": data_url(req.images[index])}})
            messages.append({"role": msg.role, "content": parts})
        s = req.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_new_tokens,
        }
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        return body

    async def _complete(self, body: dict[str, Any]) -> GenResult:
        if self._session is None or self._slots is None:
            raise EngineDead(f"engine {self.name} is not started (or was closed)")
        url = f"{self.base_url}/chat/completions"
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with self._slots:
            try:
                async with self._session.post(
                    url,
                    data=msgspec.json.encode(body),
                    headers={"Content-Type": "application/json"},
                    timeout=timeout,
                ) as resp:
                    status = resp.status
                    raw = await read_capped(resp, MAX_RESPONSE_BYTES)
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
                raise EngineDead(f"{url}: {type(exc).__name__}: {exc}") from None
            except TimeoutError:
                raise EngineError(f"{url}: no answer within {self.timeout_s:g} s", retryable=True) from None
            except (aiohttp.ClientError, OSError) as exc:
                raise EngineError(f"{url}: {type(exc).__name__}: {exc}", retryable=True) from None
        if status >= 400:
            retryable = status >= 500 or status in _RETRYABLE_4XX
            raise EngineError(f"{url}: {status} {error_message(raw)}", retryable=retryable)
        return _parse_completion(raw, url)


def data_url(image: bytes) -> str:
    """`image` as a base64 `data:` URL, typed by its magic bytes (JPEG, else PNG)."""
    mime = "image/jpeg" if image[:3] == b"\xff\xd8\xff" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(image).decode('ascii')}"


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or an `EngineError` as soon as it passes `limit` bytes (declared or actually sent)."""
    if resp.content_length is not None and resp.content_length > limit:
        raise EngineError(
            f"reply of {resp.content_length} bytes is over the {limit}-byte limit", retryable=True
        )
    body = bytearray()
    async for chunk in resp.content.iter_chunked(2**16):
        body += chunk
        if len(body) > limit:
            raise EngineError(f"reply is over the {limit}-byte limit", retryable=True)
    return bytes(body)


def error_message(raw: bytes) -> str:
    """The server's own words from an error body (OpenAI's, vLLM's, FastAPI's shapes, else the text)."""
    message: Any = None
    try:
        doc = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nesting too deep
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            message = err.get("message")
        elif isinstance(err, str):
            message = err
        message = message or doc.get("message") or doc.get("detail")
    text = message if isinstance(message, str) else raw.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 1] + "…"


def _parse_completion(raw: bytes, url: str) -> GenResult:
    """A `chat.completion` body -> `GenResult`; anything else is a retryable `EngineError` saying what."""

    def bad(what: str) -> EngineError:
        return EngineError(f"{url}: reply is not a chat completion: {what}", retryable=True)

    try:
        doc = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nesting too deep
        raise bad(f"not JSON ({raw[:80]!r})") from None
    if not isinstance(doc, dict):
        raise bad(f"a JSON {type(doc).__name__}, not an object")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        raise bad("no choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise bad("choices[0] has no message")
    message = choice["message"]
    if "content" not in message:
        raise bad("choices[0].message has no content")
    content = message["content"]
    if content is None:  # a refusal or a tool call: no text
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise bad("a content part is not an object")
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise bad("a text part has no text")
                texts.append(part["text"])
        text = "".join(texts)
    else:
        raise bad(f"content is a {type(content).__name__}")
    reason = choice.get("finish_reason")
    finish = _FINISH.get(reason, "stop") if isinstance(reason, str) else "stop"
    return GenResult(text=text, finish_reason=finish)
