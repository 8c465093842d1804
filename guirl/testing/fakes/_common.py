"""What the fakes share: serving an aiohttp app on loopback, OpenAI-style errors, request records."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

Reply = str | dict[str, Any]
"""A responder's answer: the content, or a dict (see `FakeOpenAIServer`)."""
Responder = Callable[[dict[str, Any]], Reply | Awaitable[Reply]]

_ROLES = ("system", "developer", "user", "assistant", "tool")
_DATA_URL = re.compile(r"data:(image/[A-Za-z0-9.+-]+);base64,(.*)", re.DOTALL)
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")  # and RIFF....WEBP below


async def _serve(runner: web.AppRunner, host: str = "127.0.0.1", port: int = 0) -> int:
    """Start `runner` on `host` at `port` (0: a free one); the port."""
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return int(runner.addresses[0][1])


def _error(status: int, message: str, *, code: str | None = None, param: str | None = None) -> web.Response:
    """An OpenAI-style error reply."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.Response(status=status, body=msgspec.json.encode(body), content_type="application/json")


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ReceivedRequest:
    """One chat completion request as the fake received it."""

    headers: dict[str, str]
    body: Any
    """The decoded JSON body (None when it was not JSON)."""
    images: list[bytes] = field(default_factory=list)
    """The images of the request, decoded from their data URLs, in order of appearance."""
    image_mimes: list[str] = field(default_factory=list)
    """The media type each image's data URL declared."""

    @property
    def image_sizes(self) -> list[int]:
        """Byte count of each image."""
        return [len(i) for i in self.images]


class LoopbackServer:
    """An aiohttp app on `host:port` (0: a free port) with start/close and `async with`; a fake says which
    routes it serves in `_routes`."""

    host: str = "127.0.0.1"
    port: int = 0
    _runner: web.AppRunner | None = None

    def _routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> Any:
        app = web.Application()
        self._routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        self.port = await _serve(self._runner, self.host, self.port)
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Any:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
