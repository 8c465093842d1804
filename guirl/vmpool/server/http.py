"""Request parsing and error replies shared by the VM server's routes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgpack
from aiohttp import WSMsgType, web

CHUNK = 1 << 16


def error_reply(status: int, message: str) -> web.Response:
    return web.json_response({"status": "error", "message": message}, status=status)


def action_reply(ok: bool, error: str, png: bytes | None, status: int = 200) -> web.Response:
    """`/action`'s answer: `{ok, error, screenshot}` as msgpack (the screenshot raw, not base64)."""
    body = msgpack.packb({"ok": ok, "error": error, "screenshot": png})
    return web.Response(body=body, status=status, content_type="application/msgpack")


def bad_request(message: str) -> web.HTTPBadRequest:
    """A 400 in OSWorld's error shape, to raise from anywhere in a route."""
    return web.HTTPBadRequest(
        text=json.dumps({"status": "error", "message": message}), content_type="application/json"
    )


async def request_fields(request: web.Request) -> dict[str, Any]:
    """The request's JSON object (OSWorld's clients send JSON; some send form fields)."""
    if request.content_type == "application/json":
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(f"bad JSON: {exc}") from None
    else:
        data = dict(await request.post())
    if not isinstance(data, dict):
        raise bad_request("expected a JSON object")
    return data


async def splice(ws: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Carry bytes between a WebSocket (binary messages; aiohttp's server or client side) and a TCP stream,
    both ways, until either side ends; then close both. The two ends of `/tunnel/{port}` use it."""

    async def to_stream() -> None:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY:
                break
            writer.write(msg.data)
            await writer.drain()

    async def to_ws() -> None:
        while chunk := await reader.read(CHUNK):
            await ws.send_bytes(chunk)

    tasks = [asyncio.create_task(to_stream()), asyncio.create_task(to_ws())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()
        await ws.close()
